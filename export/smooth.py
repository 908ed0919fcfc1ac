"""Activation smoothing before dynamic INT8 (SmoothQuant, Xiao et al. 2023).

ONNX Runtime's dynamic INT8 quantizes each MatMul input with one scale per tensor, so a channel that runs ten
times larger than the others costs them their precision. Dividing input channel c by s_c and multiplying weight
row c by s_c leaves the product unchanged and moves part of the range into the weights, which keep a scale per
output channel. A LayerNorm's scale and shift take the division for free (its other readers, the residual path,
get a `Mul` that undoes it); a GELU's output gets a `Mul` of its own.
"""

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from edgedistill.common.runtime import CPU, open_session
from edgedistill.export.onnx_export import ExportError
from onnx import helper, numpy_helper

# Producers whose scale and shift (input positions) absorb the division.
NORMS = {"LayerNormalization": (1, 2), "SkipLayerNormalization": (2, 3), "EmbedLayerNormalization": (5, 6)}
ACTIVATIONS = {"BiasGelu", "FastGelu", "Gelu"}


def _targets(graph: onnx.GraphProto, weights: dict, readers: dict) -> dict[str, tuple[onnx.NodeProto, list]]:
    """Every norm or GELU output read by MatMuls with constant 2-D weights: {tensor: (producer, those MatMuls)}. A
    norm's output that is also the graph's is left alone (its scale and shift cannot take the division)."""
    graph_outputs = {output.name for output in graph.output}
    targets = {}
    for node in graph.node:
        if node.op_type not in NORMS and node.op_type not in ACTIVATIONS:
            continue
        out = node.output[0]
        if node.op_type in NORMS and out in graph_outputs:
            continue
        matmuls = [
            r
            for r in readers[out]
            if r.op_type == "MatMul"
            and r.input[0] == out
            and len(weights.get(r.input[1], onnx.TensorProto()).dims) == 2
        ]
        if matmuls:
            targets[out] = (node, matmuls)
    return targets


def channel_maxima(
    model: onnx.ModelProto, tensors: list[str], calibration: list[dict], src: Path, threads: int | None = None
) -> dict[str, np.ndarray]:
    """Largest |value| per channel (last axis) of each of `tensors` over the `calibration` feeds, in fp32, on the CPU
    with `threads` intra-op threads (None: ONNX Runtime's default); `src` names the model in messages."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in tensors)
    session = open_session(src, [CPU], model=probe.SerializeToString(), threads=threads)
    maxima = dict.fromkeys(tensors, np.float32(0))
    for feed in calibration:
        for name, value in zip(tensors, session.run(tensors, feed), strict=True):
            maxima[name] = np.maximum(maxima[name], np.abs(value.reshape(-1, value.shape[-1])).max(0))
    return maxima


def smooth(src: Path, dst: Path, calibration: list[dict], alpha: float, threads: int | None = None) -> int:
    """Write `src` with the inputs of its weight MatMuls smoothed to `dst`; returns how many tensors were.

    s_c = max|x_c|^alpha / max|w_c|^(1 - alpha) over the `calibration` feeds and the weight rows that read channel
    c; `alpha` is the migration strength (0: the activations as they are, 1: all of their range in the weights).
    The calibration feeds run with `threads` intra-op threads (None: ONNX Runtime's default).
    """
    model = onnx.load(str(src))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    readers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    targets = _targets(graph, weights, readers)
    if not targets:
        raise ExportError(f"{src}: no LayerNorm or GELU output feeds a MatMul with constant weights: nothing to smooth")
    maxima = channel_maxima(model, list(targets), calibration, src, threads)

    def rewrite(name: str, value: np.ndarray) -> None:
        if len(readers[name]) != 1:
            raise ExportError(f"{src}: initializer {name} is shared by {len(readers[name])} nodes: cannot smooth it")
        weights[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    inserted = {}
    for out, (producer, matmuls) in targets.items():
        rows = [numpy_helper.to_array(weights[m.input[1]]) for m in matmuls]
        w_max = np.max([np.abs(w).max(1) for w in rows], axis=0)
        x_max = maxima[out]
        live = (x_max > 0) & (w_max > 0)
        scale = np.ones_like(x_max, dtype=np.float32)
        scale[live] = x_max[live] ** alpha / w_max[live] ** (1 - alpha)
        for matmul, w in zip(matmuls, rows, strict=True):
            rewrite(matmul.input[1], w * scale[:, None])
        if producer.op_type in NORMS:
            for i in NORMS[producer.op_type]:
                if i < len(producer.input) and producer.input[i]:
                    rewrite(producer.input[i], numpy_helper.to_array(weights[producer.input[i]]) / scale)
            smoothed_readers = {id(m) for m in matmuls}  # by identity: two nodes may compare equal as messages
            moved = [r for r in readers[out] if id(r) not in smoothed_readers]
            factor, renamed = scale, f"{out}_unsmoothed"
        else:
            moved, factor, renamed = matmuls, 1 / scale, f"{out}_smoothed"
        if not moved:
            continue
        # Not `<tensor>_scale`: dynamic quantization names its own outputs so.
        graph.initializer.append(numpy_helper.from_array(factor.astype(np.float32), f"{renamed}_factors"))
        inserted[out] = helper.make_node("Mul", [out, f"{renamed}_factors"], [renamed], name=f"{renamed}_mul")
        for reader in moved:
            reader.input[list(reader.input).index(out)] = renamed
    nodes = []
    for node in graph.node:
        nodes.append(node)
        nodes.extend(inserted[out] for out in node.output if out in inserted)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))
    return len(targets)
