"""ONNX Runtime's transformer optimizer: fused attention, LayerNorm and GELU kernels for BERT graphs."""

from pathlib import Path

from edgedistill.common import guide
from edgedistill.export.onnx_export import ExportError
from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.optimizer import optimize_model


def fuse(
    src: Path,
    dst: Path,
    num_heads: int,
    hidden_size: int,
    num_layers: int,
    attention_op: str = "Attention",
    skip_layer_norm: bool = True,
) -> dict[str, int]:
    """Write the fused graph to `dst`; returns the fused-operator counts, checked against the layer count.

    Every layer must get one fused attention node (`attention_op`: `Attention`, which holds the Q/K/V
    projections, or `MultiHeadAttention`, which takes Q, K and V from MatMuls) and two
    `SkipLayerNormalization`s (or, without `skip_layer_norm`, two `LayerNormalization`s after their
    residual Adds), the embeddings one `EmbedLayerNormalization`, and the FFN a fused GELU; a head may hold GELUs of
    its own (ELECTRA's classifier does), so more GELUs than layers pass.
    """
    options = FusionOptions("bert")
    options.use_multi_head_attention = attention_op == "MultiHeadAttention"
    options.enable_skip_layer_norm = skip_layer_norm
    norm = "SkipLayerNormalization" if skip_layer_norm else "LayerNormalization"
    model = optimize_model(
        str(src),
        model_type="bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=0,
        optimization_options=options,
    )
    counts = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    gelu = counts.get("BiasGelu", 0) + counts.get("FastGelu", 0) + counts.get("Gelu", 0)
    expected = {
        attention_op: num_layers,
        norm: 2 * num_layers,
        "EmbedLayerNormalization": 1,
        "gelu": num_layers,
    }
    found = {
        attention_op: counts.get(attention_op, 0),
        norm: counts.get(norm, 0),
        "EmbedLayerNormalization": counts.get("EmbedLayerNormalization", 0),
        "gelu": min(gelu, num_layers),  # a GELU beyond the layers' is the head's
    }
    if found != expected:
        raise ExportError(
            f"fusion incomplete for a {num_layers}-layer encoder: expected {expected}, found {found}; ONNX Runtime "
            "fuses BERT-like graphs only (a RoBERTa's embeddings and a DeBERTa's attention are not, "
            f"{guide.page('export.md', 'fusion-by-model-type')}): set fused: false for this bundle"
        )
    model.save_model_to_file(str(dst))
    return counts
