"""PyTorch -> ONNX for the teacher and every student, with dynamic batch and sequence axes.

The TorchScript-based exporter (`dynamo=False`) is used on purpose: with eager attention its BERT
graph is the one ONNX Runtime's transformer optimizer fuses into `Attention` /
`EmbedLayerNormalization` / `SkipLayerNormalization` / `BiasGelu`; the dynamo graph and SDPA
attention are left unfused. It also exports the BiLSTM as a single ONNX `LSTM` op.
"""

import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from edgedistill.common.atomic import space_checked
from edgedistill.distill import heads
from edgedistill.distill.student_stage import is_student, load_student
from edgedistill.distill.students import count_parameters
from edgedistill.distill.tokenization import load_tokenizer
from onnx.external_data_helper import ExternalDataInfo, uses_external_data
from torch import nn

# The TorchScript exporter's warnings that each bundle's own checks answer (`export.validate.check_shapes` runs it at
# batches 1 to 32 and lengths up to its max, an fp32 graph within 1e-3 of PyTorch's logits, and its dev pass is gated),
# by the module they are raised in: a value traced as a constant where it is known to be one (transformers' padding-
# mask check, PyTorch's LSTM's checks of its input's sizes, a Transformer student's `return_internals`, which the
# exporter passes at its default), advanced indexing (wrong only for negative indices), and an LSTM traced at a batch
# of 2. Any other warning still prints: a tensor read as a boolean in a student of one's own may be a branch the trace
# fixes.
ANSWERED_BY_CHECKS = (
    (torch.jit.TracerWarning, "Converting a tensor to a Python boolean", r"transformers\.masking_utils\Z"),
    (torch.jit.TracerWarning, "Converting a tensor to a Python boolean", r"torch\.nn\.modules\.rnn\Z"),
    (torch.jit.TracerWarning, "Converting a tensor to a Python boolean", r"edgedistill\.distill\.students\Z"),
    (UserWarning, "Exporting aten::index operator of advanced indexing", r"torch\.onnx\."),
    (UserWarning, "Exporting a model to ONNX with a batch_size other than 1", r"torch\.onnx\."),
)

# What makes an export over what one ONNX file holds smaller, where its module says nothing of its own (a module's
# `smaller_export`, as the folded CNN's, whose table is converted before the export, not after).
SMALLER_EXPORT = (
    "export a smaller model, a smaller teacher (model.init, e.g. a base-size checkpoint for a large one) or student "
    "(precision: fp16 or int8 does not help: those bundles are converted from this export)"
)


class ExportError(RuntimeError):
    """An export that produced no usable graph."""


class _HFLogits(nn.Module):
    """A Hugging Face classifier as `(input_ids, attention_mask, token_type_ids) -> logits`."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


class _HFLogitsWithoutSegments(_HFLogits):
    """A Hugging Face classifier without token type ids as `(input_ids, attention_mask) -> logits`."""

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class _LastEosLogits(nn.Module):
    """An encoder-decoder classifier (BART, mBART, MVP) as `(input_ids, attention_mask) -> logits`: its head reads the
    decoder's state at each row's last `</s>`. transformers finds those by a boolean index and a reshape, after
    checking that every row holds as many `</s>`, which the tracer cannot follow; here each row's last `</s>` is the
    highest position holding one, so a row never reads another's state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        states = self.model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]  # (B, T, H)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (input_ids.eq(self.model.config.eos_token_id).long() * positions).amax(-1)  # (B,)
        picked = states.gather(1, last.view(-1, 1, 1).expand(-1, 1, states.shape[-1])).squeeze(1)  # (B, H)
        return self.model.classification_head(picked)


@dataclass
class Source:
    """A model ready to export: the module, its input names, and what the optimizer needs to know."""

    module: nn.Module
    inputs: tuple[str, ...]
    arch: str
    folder: Path
    num_heads: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    params: int = 0

    @property
    def is_transformer(self) -> bool:
        return self.num_heads is not None


def load_source(folder: Path) -> Source:
    """The teacher or a student (or baseline), in eval mode, from its verified artifact folder."""
    if not is_student(folder):
        model = heads.load_teacher(folder, attn_implementation="eager").eval()
        cfg = model.config
        params = count_parameters(model)
        inputs = heads.teacher_inputs(cfg, load_tokenizer(str(folder)))
        if cfg.is_encoder_decoder:
            wrapper = _LastEosLogits
        else:
            wrapper = _HFLogits if "token_type_ids" in inputs else _HFLogitsWithoutSegments
        module = wrapper(model).eval()  # export restores the wrapper's mode on every submodule
        if not heads.fusion_applies(cfg):  # a GPT-2's or an encoder-decoder's graph ships unfused
            return Source(module, inputs, cfg.model_type, folder, params=params)
        return Source(
            module,
            inputs,
            cfg.model_type,
            folder,
            cfg.num_attention_heads,
            cfg.hidden_size,
            cfg.num_hidden_layers,
            params,
        )
    student, cfg = load_student(folder)
    params = count_parameters(student)
    inputs = heads.TOKEN_INPUTS if cfg.pairs else heads.TOKEN_INPUTS[:2]  # a pair student takes token type ids
    if cfg.arch == "transformer":
        return Source(student, inputs, cfg.arch, folder, cfg.num_heads, cfg.hidden_size, cfg.num_layers, params)
    return Source(student, inputs, cfg.arch, folder, params=params)


def example_inputs(names: tuple[str, ...], batch: int = 2, length: int = 11) -> dict[str, torch.Tensor]:
    """Token ids with uneven padding, so the traced graph keeps the masking paths; as pairs, the second half of
    each row's tokens is sentence B. The same ids for the same shape, so a shape check repeats exactly."""
    draw = torch.Generator().manual_seed(batch * 1000 + length)
    ids = torch.randint(5, 100, (batch, length), generator=draw)  # within any vocabulary (vocab_size >= 100)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, max(1, length // 2) :] = 0
    second = torch.arange(length).unsqueeze(0) >= (mask.sum(1, keepdim=True) + 1) // 2
    values = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": (second & mask.bool()).long()}
    return {name: values[name] for name in names}


def export_onnx(source: Source, path: Path, opset: int) -> onnx.ModelProto:
    """Export with dynamic `batch` and `sequence` axes, then run `onnx.checker` and check the graph takes every input
    of `source`. A write that fills the disk or reaches the file size limit raises `common.atomic`'s errors."""
    inputs = example_inputs(source.inputs)
    axes = {name: {0: "batch", 1: "sequence"} for name in source.inputs} | {"logits": {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings():
        for category, message, module in ANSWERED_BY_CHECKS:
            warnings.filterwarnings("ignore", message, category, module)
        try:
            with space_checked(path, path.name):
                torch.onnx.export(
                    source.module,
                    tuple(inputs.values()),
                    str(path),
                    input_names=list(source.inputs),
                    output_names=["logits"],
                    dynamic_axes=axes,
                    opset_version=opset,
                    dynamo=False,
                )
        except OSError:  # a write that failed: no fault of the model's
            raise
        except Exception as err:  # a model of one's own whose forward the tracer cannot follow
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ExportError(
                f"{source.arch}: PyTorch's ONNX exporter failed on it ({type(err).__name__}: {first}); its forward "
                "must trace: no packed sequences, no Python control flow on tensor values (docs/extending.md)"
            ) from err
    size = exported_bytes(path)
    if size > onnx.checker.MAXIMUM_PROTOBUF:  # the exporter spilled the weights into external data files
        raise ExportError(
            f"{source.arch}: the exported graph is {size / 2**30:.2f} GiB, over the 2 GiB one ONNX file holds, and a "
            f"bundle ships its model as one file: {getattr(source.module, 'smaller_export', SMALLER_EXPORT)}"
        )
    model = onnx.load(str(path))
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"{source.arch}: exported graph fails onnx.checker: {err}") from err
    # The exporter drops an input the model never reads; the bundle's spec, which the server checks the graph
    # against, would still name it.
    if unread := [name for name in source.inputs if name not in {i.name for i in model.graph.input}]:
        raise ExportError(f"{source.arch}: the model never reads its input(s) {unread}, so the exported graph has none")
    return model


def exported_bytes(path: Path) -> int:
    """The bytes of the ONNX graph at `path` and of the external data files its initializers are stored in."""
    model = onnx.load(str(path), load_external_data=False)
    files = {ExternalDataInfo(t).location for t in model.graph.initializer if uses_external_data(t)}
    return path.stat().st_size + sum((path.parent / name).stat().st_size for name in files)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
