"""A student added as docs/extending.md says, for the tests that keep that page true: a fastText-style bag of word
vectors, siamese on pairs, and variants that each break one part of the student contract."""

import torch
from edgedistill.distill.students import Student, match, pair_sides
from torch import Tensor, nn


class BagOfWords(Student):
    """Embedding -> mean over real tokens -> logits; on pairs, the matching features of the two means."""

    def __init__(self, config, labels=None):
        super().__init__(config, labels)
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_token_id)
        self.classifier = nn.Linear(config.embed_dim * (4 if config.pairs else 1), config.num_labels)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if self.config.pairs:
            input_ids, attention_mask = pair_sides(input_ids, attention_mask, token_type_ids)
        mask = attention_mask.unsqueeze(-1)
        mean = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.classifier(match(mean) if self.config.pairs else mean)


class TwoArguments(BagOfWords):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return super().forward(input_ids, attention_mask)


class OneLogit(BagOfWords):
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, attention_mask, token_type_ids)[:, 0]


class ReadsPadding(BagOfWords):
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, torch.ones_like(attention_mask), token_type_ids)


class NoPairs(BagOfWords):
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        mask = attention_mask.unsqueeze(-1)
        mean = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        return self.classifier(mean.repeat(1, 4) if self.config.pairs else mean)


class NoEmbed(BagOfWords):
    """Its word vectors inside a Sequential, where `init_from_teacher` finds no rule."""

    def __init__(self, config, labels=None):
        super().__init__(config, labels)
        self.embed = nn.Sequential(self.embed)


class TypesRequired(BagOfWords):
    """Takes token_type_ids with no default, which a single-text student is called without."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None) -> Tensor:
        return super().forward(input_ids, attention_mask, token_type_ids)


class Misbuilt(BagOfWords):
    """A classifier one unit too wide for its features: its forward raises."""

    def __init__(self, config, labels=None):
        super().__init__(config, labels)
        self.classifier = nn.Linear(config.embed_dim + 1, config.num_labels)


class Packed(BagOfWords):
    """Reads its texts as packed sequences, which PyTorch's ONNX exporter cannot trace."""

    def __init__(self, config, labels=None):
        super().__init__(config, labels)
        self.lstm = nn.LSTM(config.embed_dim, config.embed_dim, batch_first=True)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        lengths = attention_mask.sum(1).cpu()
        embedded = self.embed(input_ids)
        packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        _, (state, _) = self.lstm(packed)
        return self.classifier(state[-1])
