"""Gradient rules: control flow. If is differentiated through both branches and Loop through
its iterations; Scan has no rule, so a path through it is reported before anything is built.

The backward of an If is another If on the same condition. Each of its branches
holds the backward of the matching forward branch and outputs a gradient (or
zeros) for every outer value the forward branches read. Values that a backward
branch needs from inside its forward branch are not recomputed: the forward If
exports them as extra outputs (the other branch gives an empty stand-in of the
same type), and the backward branch reads those outputs.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.context import Context, total
from amp_rewrite.autodiff.registry import register
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder
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
    outputs = {o.name for o in bodies[branch].output}
    for name in needed:
        elem_type = ctx.b.types[name]
        source = name
        if name in outputs:  # a graph lists an output once: the export is a copy of it
            source = ctx.b.names.fresh(f"{name}_copy")
            bodies[branch].node.append(helper.make_node("Identity", [name], [source], name=f"{source}_node"))
        bodies[branch].output.append(helper.make_tensor_value_info(source, elem_type, None))
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


@register("Loop")
def _loop(ctx: Context):
    """Loop(M, cond, v...) with body (iter, cond, v...) -> (cond, v..., scans...): a backward Loop
    runs as many iterations in reverse. It carries the gradient of each float state and a sum
    for each outer value the body reads; iteration ``i`` reads slice ``T-1-i`` of the forward
    values it needs, which the forward Loop exports as extra scan outputs."""
    engine, node, b = ctx.engine, ctx.indexed, ctx.b
    graph_id = engine.index.subgraphs[node.id][0]
    body = engine.index.graphs[graph_id].proto
    scope = engine.index.graphs[graph_id].scope
    first, states = len(node.inputs), len(body.input) - 2
    closure = engine.closure(node)
    targets = [key for j, key in enumerate(closure) if ctx.wants(first + j)]
    carried = [j for j in range(states) if b.types.get(body.input[2 + j].name) in FLOAT_TYPES]
    counter = _export(ctx, body, body.input[0].name)  # one slice per iteration: the trip count
    trips = b.op("Gather", b.op("Shape", counter), b.const(np.int64(0)), axis=0)
    bb = b.child()
    step, condition = bb.names.fresh("grad_iter"), bb.names.fresh("grad_cond")
    bb.types[step] = TensorProto.INT64
    reverse = bb.op("Sub", bb.op("Sub", trips, bb.const(np.int64(1))), step)
    state_in = {j: bb.names.fresh(f"{body.input[2 + j].name}_grad_in") for j in carried}
    sums_in = {key: bb.names.fresh(f"{key[1]}_grad_sum") for key in targets}
    for j, name in state_in.items():
        bb.types[name] = b.types[body.input[2 + j].name]
    for key, name in sums_in.items():
        bb.types[name] = b.types[key[1]]
    outputs = [scope[o.name] if o.name in scope else engine.key_of(graph_id, o.name) for o in body.output]
    seeds: dict = {}
    for j in carried:
        seeds.setdefault(outputs[1 + j], []).append(state_in[j])
    for s in range(len(node.outputs) - states):
        if ctx.GO(states + s) is not None:
            seeds.setdefault(outputs[1 + states + s], []).append(bb.op("Gather", ctx.GO(states + s), reverse, axis=0))
    prologue = len(bb.nodes)
    state_keys = [scope[body.input[2 + j].name] for j in carried]
    found = engine.run(graph_id, {k: total(bb, v) for k, v in seeds.items()}, [*state_keys, *targets], bb)
    results = [bb.op("Identity", bb.const(np.array(True)))]
    results += [bb.op("Identity", found[key]) if key in found else bb.zeros_like(state_in[j])
                for j, key in zip(carried, state_keys)]
    results += [bb.op("Add", sums_in[key], found[key]) if key in found else bb.op("Identity", sums_in[key])
                for key in targets]
    _gather_locals(ctx, body, bb, prologue, reverse)
    inputs = [helper.make_tensor_value_info(step, TensorProto.INT64, []),
              helper.make_tensor_value_info(condition, TensorProto.BOOL, []),
              *(helper.make_tensor_value_info(n, bb.types[n], None) for n in (*state_in.values(), *sums_in.values()))]
    read = names_read(bb.nodes)  # the forward body's own constants the backward nodes read come along
    graph = helper.make_graph(bb.nodes, f"{ctx.node.name or 'loop'}_grad", inputs,
                              [helper.make_tensor_value_info(r, bb.types.get(r, TensorProto.BOOL), None)
                               for r in results], [t for t in body.initializer if t.name in read])
    initial = [ctx.go_or_zeros(j) for j in carried] + [b.zeros_like(key[1]) for key in targets]
    finals = b.ops("Loop", trips, "", *initial, outputs=len(initial), body=graph)
    for name, value in zip(finals, initial):
        b.types[name] = b.types[value]
    grads = {2 + j: finals[k] for k, j in enumerate(carried) if ctx.wants(2 + j)}
    by_key = dict(zip(targets, finals[len(carried):]))
    grads.update((first + j, by_key[key]) for j, key in enumerate(closure) if key in by_key)
    return grads


def _export(ctx: Context, body, name: str) -> str:
    """Make the body value ``name`` a scan output of the forward Loop; return the stacked value."""
    elem_type = ctx.b.types[name]
    copy = ctx.b.names.fresh(f"{name}_each")
    body.node.append(helper.make_node("Identity", [name], [copy], name=ctx.b.names.fresh(f"{copy}_node")))
    body.output.append(helper.make_tensor_value_info(copy, elem_type, None))
    stacked = ctx.b.names.fresh(f"{name}_stacked")
    ctx.node.output.append(stacked)
    ctx.b.types[stacked] = elem_type
    return stacked


def _gather_locals(ctx: Context, body, bb: GraphBuilder, at: int, reverse: str) -> None:
    """Point ``bb``'s nodes (from ``at`` on) at this iteration's slice of every forward body value
    they read, exported by the forward Loop."""
    local = {out for node in body.node for out in node.output} | {i.name for i in body.input}
    needed = sorted(names_read(bb.nodes[at:]) & local)
    renamed, gathers = {}, []
    for name in needed:
        stacked = _export(ctx, body, name)
        sliced = bb.names.fresh(f"{name}_at")
        gathers.append(helper.make_node("Gather", [stacked, reverse], [sliced], axis=0,
                                        name=bb.names.fresh(f"{sliced}_node")))
        bb.types[sliced] = ctx.b.types[name]
        renamed[name] = sliced
    _rename_reads(bb.nodes[at:], renamed)
    bb.nodes[at:at] = gathers
