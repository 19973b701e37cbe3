"""Declared shapes that onnx's own shape inference contradicts.

Exporters write some declarations wrong (a value_info of rank 2 for a value the runtime makes
at rank 3, an output's rank). ONNX Runtime merges them leniently and runs the model; a pass that
builds on a declared rank (a gradient rule choosing Gemm for a rank-2 MatMul) builds a graph the
runtime then refuses. ``truthful`` gives such passes the model without those declarations.
"""

from __future__ import annotations

import onnx

from amp_rewrite.ir.sizes import without_weights


def contradicted(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """The top-level values whose declared shape (value_info or graph output) differs in rank, or
    in a fixed extent, from what onnx's shape inference infers from the inputs and weights alone,
    with the inferred dimensions (none where the inference fails: then nothing contradicts a
    declaration)."""
    light = without_weights(model)
    del light.graph.value_info[:]
    outputs = [o.name for o in light.graph.output]
    del light.graph.output[:]  # outputs left undeclared: their inferred shapes come back in value_info
    light.graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    try:
        inferred = onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # the inference is a best effort here
        return {}
    found = {v.name: _dims(v) for v in (*inferred.value_info, *inferred.output)}
    bad = {}
    for info in (*model.graph.value_info, *model.graph.output):
        declared, guessed = _dims(info), found.get(info.name)
        if declared is None or guessed is None:
            continue
        if len(declared) != len(guessed) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                                for a, b in zip(declared, guessed)):
            bad[info.name] = guessed
    return bad


def truthful(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or where onnx's inference contradicts some of its declared shapes, a copy without
    them (a value_info dropped; a graph output declared with the inferred shape, its type kept)."""
    bad = contradicted(model)
    if not bad:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [info for info in copy.graph.value_info if info.name not in bad]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept)
    for output in copy.graph.output:
        if output.name in bad:
            shape = output.type.tensor_type.shape
            shape.ClearField("dim")
            for extent in bad[output.name]:
                dim = shape.dim.add()
                if isinstance(extent, int):
                    dim.dim_value = extent
                elif extent:
                    dim.dim_param = extent
    return copy


def _dims(info: onnx.ValueInfoProto) -> list[int | str | None] | None:
    tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tensor is None or not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim]
