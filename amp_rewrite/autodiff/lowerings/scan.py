"""Scan unrolled into copies of its body, so that the rules of the body's ops differentiate it.

A top-level Scan (opset 9 and later) whose scan length is static (a specialized step's is, see
``ir.specialize``) becomes, per iteration, its scan inputs' slices (``Gather`` along each
input's axis, from the end where its direction is 1), a copy of the body with its values
renamed apart (the values it reads from the outer graph kept, nested graphs' references to
body values renamed too; the body's initializers made once, as Constant nodes), and the
states passed on; the final states are the node's first outputs, and each scan output
stacks the iterations' values along its axis (last iteration first where its direction is 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.autodiff.context import DynamicShapes
from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder


def unrolled_scan(node: onnx.NodeProto, b: GraphBuilder, shapes: Mapping[str, tuple | None], opset: int) -> None:
    """Append to ``b`` the nodes that compute ``node``'s outputs (by their names) without a Scan;
    ``shapes``: the shapes of the node's inputs."""
    label = f"Scan node {node.name or node.output[0]!r}"
    if opset < 9:
        raise UserError(f"cannot differentiate {label}: opset {opset}'s Scan (with a batch axis) is not unrolled")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body: onnx.GraphProto = attrs["body"]
    scans = attrs["num_scan_inputs"]
    states = len(node.input) - scans
    outputs = len(body.output) - states
    in_dirs = list(attrs.get("scan_input_directions") or [0] * scans)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * outputs)
    in_axes, out_axes = list(attrs.get("scan_input_axes") or [0] * scans), list(
        attrs.get("scan_output_axes") or [0] * outputs)
    ranks = [len(shape) if (shape := shapes.get(name)) is not None else None for name in node.input[states:]]
    if any(r is None for r in ranks) and any(a < 0 for a in in_axes):
        raise DynamicShapes(f"cannot differentiate {label}: a negative scan axis of an input whose rank is not known")
    in_axes = [a % r if a < 0 else a for a, r in zip(in_axes, ranks)]
    lengths = {shape[a] for name, a in zip(node.input[states:], in_axes) if (shape := shapes.get(name)) is not None}
    steps = next(iter(lengths)) if len(lengths) == 1 else None
    if not isinstance(steps, int):
        raise DynamicShapes(f"cannot differentiate {label}: its scan length is not static")
    constants = {t.name: _constant(b, t) for t in body.initializer}
    carried = list(node.input[:states])
    produced: list[list[str]] = []
    for t in range(steps):
        sliced = [b.op("Gather", x, b.const(np.int64(steps - 1 - t if d else t)), axis=a)
                  for x, d, a in zip(node.input[states:], in_dirs, in_axes)]
        results = _body_copy(b, body, dict(zip([i.name for i in body.input], carried + sliced)), constants)
        carried, produced = results[:states], [*produced, results[states:]]
    for value, name in zip(carried, node.output[:states]):
        if name:
            b.op("Identity", value, outputs=[name])
    for k, name in enumerate(node.output[states:states + outputs]):
        if not name:
            continue
        rank = len(shape) if (shape := shapes.get(name)) is not None else None
        axis = out_axes[k]
        if axis < 0:
            if rank is None:
                raise DynamicShapes(f"cannot differentiate {label}: a negative output axis of unknown rank")
            axis %= rank
        order = range(steps - 1, -1, -1) if out_dirs[k] else range(steps)
        parts = [b.axes_op("Unsqueeze", produced[t][k], [axis]) for t in order]
        b.op("Concat", *parts, axis=axis, outputs=[name])


def _constant(b: GraphBuilder, tensor: onnx.TensorProto) -> str:
    """The body initializer ``tensor`` as one Constant node of the outer graph."""
    name = b.names.fresh(f"scan_{tensor.name}")
    value = onnx.TensorProto()
    value.CopyFrom(tensor)
    value.name = name
    b.nodes.append(helper.make_node("Constant", [], [name], name=b.names.fresh(f"{name}_node"), value=value))
    b.types[name] = tensor.data_type
    return name


def _body_copy(b: GraphBuilder, body: onnx.GraphProto, bound: dict[str, str], constants: dict[str, str]) -> list[str]:
    """One copy of ``body``'s nodes in ``b``, its inputs ``bound`` to outer values; its outputs."""
    renamed = {**bound, **constants}
    for node in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for i, name in enumerate(copy.input):
            copy.input[i] = renamed.get(name, name)
        for i, name in enumerate(copy.output):
            if name:
                renamed[name] = b.names.fresh(f"scan_{name}")
                copy.output[i] = renamed[name]
        copy.name = b.names.fresh(f"scan_{node.name or node.op_type}")
        for attribute in copy.attribute:
            for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_references(graph, renamed)
        b.nodes.append(copy)
    return [renamed.get(o.name, o.name) for o in body.output]


def _rename_references(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Point a nested graph's reads of body values at their copies (its own values shadow them)."""
    own = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {
        o for n in graph.node for o in n.output}
    outer = {k: v for k, v in renamed.items() if k not in own}
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = outer.get(name, name)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_references(sub, outer)
    for output in graph.output:
        output.name = outer.get(output.name, output.name)
