"""A word CNN with its convolutions folded into the embedding table: lookups and sums, no matrix products.

A convolution over embeddings is linear in each window position's embedding, so every (token, tap)
pair's contribution can be computed once, ahead of time: `table[v, d] = W[:, :, k - 1 - d] @ E[v]`
for each kernel width k. At run time a window ending at position j is then the sum, over d, of
`table[token at j - d, d]`: one gather and one sum replace the convolutions (same result up to
float rounding). Two extra rows stand for positions outside the text: zeros before it, and after it
a row that pushes every window whose oldest token lies past the text's end below zero, so that ReLU
drops the windows that touch no real token without a mask over all windows. The cost is memory: the
table has (vocabulary + 2) x max width x filters rows, about ten times the embedding table for Kim's
widths 3, 4, 5. In float16 (`precision: fp16`) only the table changes: converting the whole graph
instead would leave ONNX Runtime's CPU provider, which lacks float16 kernels for some of its
operators, to fold a float32 copy of the table at load. A pair CNN folds each sentence of the pair
with the same table.
"""

import torch
import torch.nn.functional as F
from edgedistill.distill.students import CNNClassifier, match, pair_sides
from edgedistill.export.onnx_export import ExportError
from torch import Tensor, nn


class FoldedCNN(nn.Module):
    """`CNNClassifier` in inference form, taking the same `(input_ids, attention_mask[, token_type_ids]) -> logits`."""

    def __init__(self, cnn: CNNClassifier, table_dtype: torch.dtype = torch.float32):
        """`table_dtype` float16 halves the table; looked-up rows are summed in float32."""
        super().__init__()
        embeddings = cnn.embed.weight.detach()
        vocab = embeddings.shape[0]
        self.width = max(conv.kernel_size[0] for conv in cnn.convs)
        channels = sum(conv.out_channels for conv in cnn.convs)
        before, after = vocab, vocab + 1  # rows for positions before the text (zeros) and after it
        table = torch.zeros(vocab + 2, self.width, channels)
        start = 0
        for conv in cnn.convs:
            k, filters = conv.kernel_size[0], conv.out_channels
            weight = conv.weight.detach()  # (filters, embed, k); tap t sees the window's position t
            for tap in range(k):
                table[:vocab, k - 1 - tap, start : start + filters] = embeddings @ weight[:, :, tap].T
            # A width-k window touches a real token iff its oldest token (offset k - 1) is not past the end:
            # there, this row's entry takes the window below zero whatever its bias, and ReLU leaves it out.
            table[after, k - 1, start : start + filters] = -(conv.bias.detach().clamp(min=0) + 1)
            start += filters
        self.after = after
        self.register_buffer("table", table.reshape((vocab + 2) * self.width, channels).to(table_dtype))
        self.register_buffer("bias", torch.cat([conv.bias.detach() for conv in cnn.convs]))
        # Appended to each row of ids: w - 1 positions past the end, then w - 1 before the start, which
        # positions -1 .. -(w - 1) reach by negative indexing.
        self.register_buffer(
            "tail", torch.tensor([[after] * (self.width - 1) + [before] * (self.width - 1)], dtype=torch.long)
        )
        self.classifier, self.pairs = cnn.classifier, cnn.pairs

    @property
    def smaller_export(self) -> str:
        """What makes this module's export smaller (`onnx_export.export_onnx` names it where one file cannot hold it):
        the table is most of it, and it is converted before the export, not after."""
        half = "precision: fp16 (halves it; an int8 bundle is quantized from this fp32 export), "
        return (
            "the folded table, (vocabulary + 2) x widest kernel x filters, is most of it: "
            f"{half if self.table.dtype == torch.float32 else ''}fold: false, or a student of fewer filters "
            "(num_filters) or kernel sizes (kernel_sizes)"
        )

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if self.pairs:
            ids, mask = pair_sides(input_ids, attention_mask, token_type_ids)
            return self.classifier(match(self.features(ids, mask)))
        return self.classifier(self.features(input_ids, attention_mask))

    def features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T) -> (B, filters x widths), as `CNNClassifier.features`."""
        width = self.width
        ids = torch.where(attention_mask > 0, input_ids, self.after)
        ids = torch.cat([ids, self.tail.expand(ids.shape[0], -1)], 1)  # (B, T + 2w - 2)
        windows = input_ids.shape[1] + width - 1
        back = torch.arange(width)
        positions = torch.arange(windows).unsqueeze(1) - back.unsqueeze(0)  # (windows, w): token j - d
        rows = ids[:, positions] * width + back  # (B, windows, w): token j - d, at offset d
        return F.relu(self.table[rows].float().sum(2) + self.bias).amax(1)


def fold(module: nn.Module, half: bool = False) -> FoldedCNN:
    """The folded form of a CNN student, with a float16 table if `half`; other architectures have no
    convolutions to fold."""
    if not isinstance(module, CNNClassifier):
        raise ExportError(f"fold: true needs a CNN student, got {type(module).__name__}")
    return FoldedCNN(module, torch.float16 if half else torch.float32).eval()
