"""Gradient rules: control flow. If is differentiated through both branches; Loop and Scan
have no rule, so a path through them is reported before anything is built.

The backward of an If is another If on the same condition. Each of its branches
holds the backward of the matching forward branch and outputs a gradient (or
zeros) for every outer value the forward branches read. Values that a backward
branch needs from inside its forward branch are not recomputed: the forward If
exports them as extra outputs (the other branch gives an empty stand-in of the
same type), and the backward branch reads those outputs.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, helper, numpy_helper

from amp_rewrite.autodiff.context import Context, total
from amp_rewrite.autodiff.registry import register
from amp_rewrite.ir.builder import GraphBuilder
from amp_rewrite.ir.graph import names_read, subgraphs


@register("If")
def _if(ctx: Context):
    engine, node = ctx.engine, ctx.indexed
    first = len(node.inputs)
    closure = engine.closure(node)
    targets = [key for j, key in enumerate(closure) if ctx.wants(first + j)]
    bodies = [a for a in node.proto.attribute if a.type == AttributeProto.GRAPH]
    branches = {}
    for attr, graph_id in zip(bodies, engine.index.subgraphs[node.id]):
        b = ctx.b.child()
        outputs = engine.index.graphs[graph_id].outputs
        seeds: dict = {}
        for i in range(len(node.outputs)):
            if ctx.GO(i) is not None:
                seeds.setdefault(outputs[i], []).append(ctx.GO(i))
        found = engine.run(graph_id, {k: total(b, v) for k, v in seeds.items()}, targets, b)
        made = {out for n in b.nodes for out in n.output}
        results = []
        for key in targets:
            grad = found.get(key) or b.zeros_like(key[1])
            results.append(grad if grad in made else b.op("Identity", grad))
        branches[attr.name] = (b, results)
    for name, (b, _) in branches.items():
        _export_locals(ctx, name, b, [other for other in branches if other != name])
    grads = ctx.b.ops("If", ctx.I(0), outputs=len(targets), **{
        name: helper.make_graph(b.nodes, f"{ctx.node.name or 'if'}_{name}_grad", [], [
            helper.make_tensor_value_info(out, ctx.b.types[key[1]], None) for out, key in zip(results, targets)])
        for name, (b, results) in branches.items()})
    for out, key in zip(grads, targets):
        ctx.b.types[out] = ctx.b.types[key[1]]
    by_key = dict(zip(targets, grads))
    return {first + j: by_key[key] for j, key in enumerate(closure) if key in by_key}


def _export_locals(ctx: Context, branch: str, b: GraphBuilder, others: list[str]) -> None:
    """Make the forward values of ``branch`` that ``b``'s nodes read outputs of the forward If,
    and point ``b``'s nodes at those outputs."""
    bodies = {a.name: a.g for a in ctx.node.attribute if a.type == AttributeProto.GRAPH}
    # The branch's own values now, including what the backward of an If inside it exported.
    local = {out for node in bodies[branch].node for out in node.output}
    needed = sorted(names_read(b.nodes) & local)
    if not needed:
        return
    renamed = {}
    for name in needed:
        elem_type = ctx.b.types[name]
        bodies[branch].output.append(helper.make_tensor_value_info(name, elem_type, None))
        for other in others:
            stand_in = ctx.b.names.fresh(f"{name}_unused")
            empty = numpy_helper.from_array(np.zeros(0, helper.tensor_dtype_to_np_dtype(elem_type)), stand_in)
            bodies[other].node.append(helper.make_node("Constant", [], [stand_in], value=empty))
            bodies[other].output.append(helper.make_tensor_value_info(stand_in, elem_type, None))
        exported = ctx.b.names.fresh(f"{name}_saved")
        ctx.node.output.append(exported)
        ctx.b.types[exported] = elem_type
        renamed[name] = exported
    _rename_reads(b.nodes, renamed)


def _rename_reads(nodes, renamed: dict[str, str]) -> None:
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
        for graph in subgraphs(node):
            _rename_reads(graph.node, renamed)
            for output in graph.output:
                if output.name in renamed:
                    output.name = renamed[output.name]
