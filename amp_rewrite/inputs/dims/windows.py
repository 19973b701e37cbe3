"""Rules: Conv and the pools, Pad, Resize and Upsample: the ops that change spatial extents.

Conv and the pools (kernel, stride, dilation, pads, auto_pad; ceil_mode where it cannot drop a
last window) give a rounded dimension (``(height - 1) // 2``); Pad with constant pads (its axes
input too, which inference does not follow) adds them (``batch + 2``); Resize to sizes gives
those, by a whole scale multiplies. Their readers' needs are least extents: a window must fit
in its input (three MaxPools of stride 2 need 15), a reflect Pad of n needs more than n.
"""

from __future__ import annotations

import math

import numpy as np

from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import rule
from amp_rewrite.inputs.dims.reshape import product_dim
from amp_rewrite.inputs.dims.slicing import constant_ints, shape_value
from amp_rewrite.inputs.dims.symbols import Dim, divided, summed
from amp_rewrite.ir.graph import Node


@rule("Conv", "MaxPool", "AveragePool", "LpPool")
def _window(rules: Solver, node: Node) -> None:
    """Conv and the pools (MaxPool, AveragePool, LpPool) over [batch, channels, spatial...]:
    each spatial extent becomes ``(in + pads - dilation x (kernel - 1) - 1) / stride + 1``
    rounded down (up with ceil_mode, where the end pad and the stride cannot start a last
    window past the input, which ONNX Runtime would drop: not followed otherwise), or
    ``in / stride`` rounded up for auto_pad SAME; it must be at least ``dilation x (kernel -
    1) + 1 - pads`` (what a guess gives the name at least). The batch is the input's, the
    channels the weight's first extent (Conv) or the input's; a Conv's input has its weight's
    second extent times ``group`` channels."""
    data = rules.shape(node.inputs[0])
    if data is None or len(data) < 3:
        return
    attrs = {a.name: a for a in node.proto.attribute}
    spatial = len(data) - 2
    weight = rules.shape(node.inputs[1]) if node.op_type == "Conv" and len(node.inputs) > 1 else None
    given = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else list(weight[2:]) if weight else None
    kernel = [k for k in given if isinstance(k, int)] if given is not None else []
    if given is None or len(given) != spatial or len(kernel) != spatial:
        return
    strides, dilations = (list(attrs[n].ints) if n in attrs else [1] * spatial for n in ("strides", "dilations"))
    auto_pad = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
    # pads count only where auto_pad is NOTSET (VALID pads nothing)
    pads = list(attrs["pads"].ints) if "pads" in attrs and auto_pad == "NOTSET" else [0] * 2 * spatial
    ceil_mode = "ceil_mode" in attrs and attrs["ceil_mode"].i
    if not len(strides) == len(dilations) == spatial or len(pads) != 2 * spatial:
        return
    group = attrs["group"].i if "group" in attrs else 1
    if weight and len(weight) > 1 and isinstance(weight[1], int):  # the input's channels: the weight's times groups
        rules.agree([(data[1], weight[1] * group)], f"Conv {node.label!r}")
    dims: list[Dim] = [data[0], (weight[0] if weight else None) if node.op_type == "Conv" else data[1]]
    for axis, (dim, k, stride, dilation) in enumerate(zip(data[2:], kernel, strides, dilations)):
        if auto_pad.startswith("SAME"):
            dims.append(divided(dim, stride - 1, stride))
            continue
        window = dilation * (k - 1) + 1
        end_pad = pads[axis + spatial]
        span = window - pads[axis] - end_pad
        rules.at_least(dim, span, f"for {node.op_type} {node.label!r}")
        if not ceil_mode:
            dims.append(divided(dim, stride - span, stride))
        else:
            dims.append(divided(dim, 2 * stride - 1 - span, stride) if end_pad + stride <= window else None)
    for key in node.outputs[:2]:  # MaxPool's indices have its output's shape
        rules.derive(key, dims)


@rule("Pad")
def _pad(rules: Solver, node: Node) -> None:
    """Each padded axis grows by its pads (negative ones crop): ``batch + 2``."""
    data, pads = rules.shape(node.inputs[0]), constant_ints(rules, node, 1, "pads")
    if data is None or pads is None:
        return
    axes = constant_ints(rules, node, 3, default=range(len(data)))
    if axes is None or len(pads) != 2 * len(axes):
        return
    dims = list(data)
    mirrored = any(a.name == "mode" and a.s == b"reflect" for a in node.proto.attribute)
    for axis, before, after in zip(axes, pads[:len(axes)], pads[len(axes):]):
        if not -len(dims) <= axis < len(dims):
            return
        if mirrored:  # a reflection of n needs more than n elements
            rules.at_least(dims[axis], max(int(before), int(after)) + 1, f"for Pad {node.label!r}")
        dims[axis] = summed([dims[axis], int(before + after)])
    rules.derive(node.outputs[0], dims)


@rule("Resize", "Upsample")
def _resize(rules: Solver, node: Node) -> None:
    """Resize (and Upsample) to constant sizes, or sizes computed from Shapes, gives those (a
    product: ``product_dim``); by constant scales, each axis times its scale, rounded down (a whole
    scale of a name: ``2 x height``; another scale of a name: unknown). Resize's ``axes`` name
    the axes that the sizes or scales are for."""
    data = rules.shape(node.inputs[0]) if node.inputs else None
    if data is None:
        return
    axes = next((list(a.ints) for a in node.proto.attribute if a.name == "axes"), range(len(data)))
    if not all(-len(data) <= a < len(data) for a in axes):
        return
    sizes = shape_value(rules, node.inputs[3]) if node.op_type == "Resize" and len(node.inputs) == 4 else None
    dims: list[Dim] = list(data)
    if sizes is not None and len(sizes) == len(axes):
        for axis, size in zip(axes, sizes):
            dims[axis] = (product_dim(rules, node.outputs[0], axis % len(data), size) if isinstance(size, tuple)
                          else size)
    else:
        position = 2 if node.op_type == "Resize" and rules.index.opset(node) >= 11 else 1  # (X, roi, scales, sizes)
        scales = rules.array(node.inputs[position]) if len(node.inputs) > position else None
        if scales is None:
            scales = next((np.asarray(a.floats) for a in node.proto.attribute if a.name == "scales"), None)
        if scales is None or scales.size != len(axes):
            return
        for axis, scale in zip(axes, scales.reshape(-1).tolist()):
            dim = data[axis]
            if isinstance(dim, int):
                dims[axis] = math.floor(dim * scale)
            elif scale != 1:
                whole = float(scale).is_integer() and scale > 0
                dims[axis] = product_dim(rules, node.outputs[0], axis % len(data), (dim, int(scale))) if whole else None
    rules.derive(node.outputs[0], dims)
