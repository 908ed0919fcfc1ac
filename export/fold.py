"""A word CNN with its convolutions folded into the embedding table: lookups and sums, no matrix products.

A convolution over embeddings is linear in each window position's embedding, so every (token, tap)
pair's contribution can be computed once, ahead of time: `table[v, d] = W[:, :, k - 1 - d] @ E[v]`
for each kernel width k. At run time a window ending at position j is then the sum, over d, of
`table[token at j - d, d]`: one gather and one sum replace the convolutions (same result up to
float rounding). The cost is memory: the table has (vocabulary + 1) x max width x filters rows,
about ten times the embedding table for Kim's widths 3, 4, 5. In float16 (`precision: fp16`) only
the table changes: converting the whole graph instead would leave ONNX Runtime's CPU provider,
which lacks float16 kernels for some of its operators, to fold a float32 copy of the table at load.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distill.students import CNNClassifier
from export.onnx_export import ExportError


class FoldedCNN(nn.Module):
    """`CNNClassifier` in inference form, taking the same `(input_ids, attention_mask) -> logits`."""

    def __init__(self, cnn: CNNClassifier, table_dtype: torch.dtype = torch.float32):
        """`table_dtype` float16 halves the table; looked-up rows are summed in float32."""
        super().__init__()
        embeddings = cnn.embed.weight.detach()
        vocab = embeddings.shape[0]
        self.width = max(conv.kernel_size[0] for conv in cnn.convs)
        channels = sum(conv.out_channels for conv in cnn.convs)
        # Row `vocab` stays zero: it stands for padding, and for positions outside the text.
        table = torch.zeros(vocab + 1, self.width, channels)
        extra, start = [], 0
        for conv in cnn.convs:
            k, filters = conv.kernel_size[0], conv.out_channels
            weight = conv.weight.detach()  # (filters, embed, k); tap t sees the window's position t
            for tap in range(k):
                table[:vocab, k - 1 - tap, start : start + filters] = embeddings @ weight[:, :, tap].T
            extra.append(torch.full((filters,), k - 1))
            start += filters
        self.pad_row = vocab
        self.register_buffer("table", table.reshape((vocab + 1) * self.width, channels).to(table_dtype))
        self.register_buffer("bias", torch.cat([conv.bias.detach() for conv in cnn.convs]))
        self.register_buffer("extra", torch.cat(extra))  # per channel: k - 1, the windows past the text's end
        self.classifier = cnn.classifier

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        width = self.width
        ids = torch.where(attention_mask > 0, input_ids, self.pad_row)
        ids = F.pad(ids, (width - 1, width - 1), value=self.pad_row)  # (B, T + 2w - 2)
        windows = input_ids.shape[1] + width - 1
        back = torch.arange(width)
        positions = torch.arange(windows).unsqueeze(1) + (width - 1 - back).unsqueeze(0)  # (windows, w)
        rows = ids[:, positions] * width + back  # (B, windows, w): token j - d, at offset d
        out = F.relu(self.table[rows].float().sum(2) + self.bias)  # (B, windows, channels)
        lengths = attention_mask.sum(1, keepdim=True).unsqueeze(1)  # (B, 1, 1)
        # A width-k window j touches a real token iff j < length + k - 1; after ReLU, zeros leave the max alone.
        valid = torch.arange(windows).view(1, windows, 1) < lengths + self.extra
        return self.classifier((out * valid).amax(1))


def fold(module: nn.Module, half: bool = False) -> FoldedCNN:
    """The folded form of a CNN student, with a float16 table if `half`; other architectures have no
    convolutions to fold."""
    if not isinstance(module, CNNClassifier):
        raise ExportError(f"fold: true needs a CNN student, got {type(module).__name__}")
    return FoldedCNN(module, torch.float16 if half else torch.float32).eval()
