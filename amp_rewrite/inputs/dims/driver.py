"""``implied_dims``: shape inference, then the rules in rounds, then the guesses; and what
``samples`` asks besides (``total_stride``, ``unnamed_dim``).

ONNX shape inference, run on a copy without the model's own value_info (an unnamed input
dimension named ``input[axis]`` there), carries the inputs' dimension names through elementwise
ops, MatMul and their like, in every graph (If and Loop bodies included); a Loop-carried output
it leaves without a shape takes its initial value's, and inference runs again from there. Then
each node's rule (``registry``) runs, until nothing new is learnt, and a fixed extent that the
model's value_info or outputs declare where inference has a name binds it.

Each binding names the node or value that implied it; the first one found wins. When names are
still unbound after that, the rules run again guessing. First, names broadcast together with no
fixed extent among them are taken as equal (the fresh name inference gave their result stands
for the first; one bound binds the others; an input name broadcast together with one Concat's
sum of other input names is that sum, whatever extents they take: a mask[batch, total] against
attention scores over Concat(past keys, new keys), with shapes followed through Transposes),
and what follows from that (the least extents that readers need) is learnt before any count is
split. Then a count that several names share is split among them (``counting``). A Reshape
with -1, whose count need only be a multiple, guesses last, once every exact count has had its
guess. Where the bindings then break a count, names bound by rounded dimensions move within
their ranges (``Bindings.settle``). A name that nothing binds takes at least what its readers
need (three MaxPools of stride 2 need 15), or at most what they allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from amp_rewrite.inputs.dims.bindings import Bindings
from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import lookup
from amp_rewrite.inputs.dims.symbols import AT_LEAST, AT_MOST, Pin, Sym
from amp_rewrite.ir.graph import ModelIndex, ValueKey, names_read, subgraphs
from amp_rewrite.ir.sizes import iter_graphs, without_weights

MAX_ROUNDS = 4
"""Rounds of the rules over the graph; a binding found late can enable another."""


def unnamed_dim(input_name: str, axis: int) -> str:
    """The name an input's unnamed dimension goes by in bindings."""
    return f"{input_name}[{axis}]"


STRIDED = ("Conv", "MaxPool", "AveragePool", "LpPool")
MOST_STRIDE = 512
"""The largest extent ``total_stride`` gives: an HRNet's paths of stride-2 fusions multiply without end."""


def total_stride(model: onnx.ModelProto) -> int:
    """The largest product of Conv and pool strides along a path through the main graph (at most
    MOST_STRIDE), an upsampling counting as none: spatial extents that are multiples of it survive
    every downsampling, and a map upsampled to meet an earlier one in a Concat meets its own
    extent (YOLO's feature pyramid needs multiples of 32; its input names bind to nothing)."""
    strides: dict[str, int] = {}
    for node in model.graph.node:
        own = max((max(a.ints, default=1) for a in node.attribute if a.name == "strides"), default=1) \
            if node.op_type in STRIDED else 1
        reached = max((strides.get(name, 1) for name in node.input), default=1) * own
        strides.update((name, min(reached, MOST_STRIDE)) for name in node.output)
    return max(strides.values(), default=1)


def implied_dims(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | str]],
                 given: Mapping[str, Pin] | None = None, guess: int = 1) -> dict[str, Pin]:
    """Bindings of the dimension names in ``shapes`` (the model's inputs, each dimension fixed
    or named) that the graph implies, starting from ``given``, which wins over them. ``guess``
    is the extent a guess gives the names that share a count with the last, where the count
    allows it (else 1): 2 is a second guess for a model that the first (1) does not run (a
    reflect Pad needs an extent above 1)."""
    pins = dict(given or {})
    names = {d for dims in shapes.values() for d in dims if isinstance(d, str)}
    if not names - set(pins):
        return pins
    try:
        inferred = onnx.shape_inference.infer_shapes(_undeclared(model, shapes), data_prop=True)
        if _carry_initial_shapes(inferred):  # and what follows from them past the Loops
            inferred = onnx.shape_inference.infer_shapes(inferred, data_prop=True)
    except Exception:  # shape inference is a best effort: a custom op or a bad model stops it
        return pins
    rules = Solver(ModelIndex(inferred), names, pins)
    declared = _declared(model, rules.index)
    _apply(rules, declared)
    if names - set(pins):  # then guess: names broadcast together are equal (what follows from that,
        rules.equal_broadcasts = True  # the least extents its readers need included, comes first),
        _apply(rules, declared)
    if names - set(pins):  # and a count shared by several names goes to the last of them
        rules.guess = guess
        _apply(rules, declared)
    if names - set(pins):  # then what a -1 allows: a multiple, guessed after every exact count
        rules.multiples = True
        _apply(rules, declared)
    if rules.settle():  # a binding moved: the counts it left a name may solve now
        _apply(rules, declared)
    for name, terms in _sums_broadcast_with(rules).items():  # a sum of others, whatever extents they take
        if name not in pins:
            pins[name] = Pin(0, f"the sum {' + '.join(terms)} it is broadcast with", sum_of=terms)
    for name in names - set(pins):  # what the readers of a name that nothing bound need at least, or allow at most
        if rules.least.get(name, 1) > 1:
            pins[name] = Pin(rules.least[name], rules.least_origin[name] + AT_LEAST)
        elif name in rules.most:
            pins[name] = Pin(rules.most[name], rules.most_origin[name] + AT_MOST)
    return pins


def _apply(rules: Solver, declared: list[tuple[ValueKey, tuple]]) -> None:
    """The rules, in rounds until a round learns nothing new."""
    for _ in range(MAX_ROUNDS):
        found = rules.learnt()
        for node in rules.index.nodes:
            rule = lookup(node.op_type)
            if rule is not None and node.domain == "":
                rule(rules, node)
        for key, dims in declared:
            inferred = rules.shape(key)
            if inferred is not None and len(inferred) == len(dims):
                rules.agree(zip(inferred, dims), f"the declared shape of {key[1]!r}")
        if rules.learnt() == found:
            break


def _undeclared(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | str]]) -> onnx.ModelProto:
    """A copy without weights' bytes and with no declared shape but the inputs', whose
    unnamed dimensions get their binding names: what inference concludes from the inputs alone."""
    light = without_weights(model)
    for graph in iter_graphs(light.graph):
        del graph.value_info[:]
        for info in graph.output:
            info.type.tensor_type.ClearField("shape")
    for info in light.graph.input:
        for dim, named in zip(info.type.tensor_type.shape.dim, shapes.get(info.name, ())):
            if isinstance(named, str):
                dim.dim_param = named
    return light


def _carry_initial_shapes(model: onnx.ModelProto) -> bool:
    """Give each Loop-carried output that inference left without a shape (the body may change
    it between iterations) its initial value's type, in ``model`` as inference returned it, with
    what inference found downstream of it dropped (kept, a name it gave afresh there, the
    carried shape missing, stayed over what the second inference finds: a Gemm's batch after a
    Loop); whether any got one. (A Relu after the Loop had no shape either, which ended a
    Reshape's walk back.)"""
    carried = False
    for graph in iter_graphs(model.graph):
        infos = {info.name: info for info in (*graph.input, *graph.value_info, *graph.output)}
        starts: dict[str, onnx.TypeProto] = {}
        for node in graph.node:
            if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
                continue
            for initial, output in zip(node.input[2:], node.output):
                start, info = infos.get(initial), infos.get(output)
                if (output and start is not None and start.type.tensor_type.HasField("shape")
                        and (info is None or not info.type.tensor_type.HasField("shape"))):
                    starts[output] = onnx.TypeProto()
                    starts[output].CopyFrom(start.type)  # its info may be dropped below
        if starts:
            _forget_downstream(graph, set(starts))
            outputs = {info.name: info for info in graph.output}  # a graph output's type is its own
            for output, type_proto in starts.items():
                (outputs.get(output) or graph.value_info.add(name=output)).type.CopyFrom(type_proto)
            carried = True
    return carried


def _forget_downstream(graph: onnx.GraphProto, names: set[str]) -> None:
    """Drop the inferred types of what ``graph``'s nodes compute from ``names`` (within the
    subgraphs of the nodes that read them too), for inference to find again."""
    for node in graph.node:
        if names_read([node]) & names:
            names.update(o for o in node.output if o)
            for body in subgraphs(node):
                for inner in iter_graphs(body):
                    del inner.value_info[:]
    kept = [info for info in graph.value_info if info.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    for info in graph.output:
        if info.name in names:
            info.type.tensor_type.ClearField("shape")


def _declared(model: onnx.ModelProto, index: ModelIndex) -> list[tuple[ValueKey, tuple]]:
    """(key, dims) of the shapes the model declares for values that nodes compute, in any graph."""
    declared = []
    for graph, proto in zip(index.graphs, iter_graphs(model.graph)):
        for info in (*proto.value_info, *proto.output):
            key = graph.scope.get(info.name)
            tensor_type = info.type.tensor_type
            if key is not None and index.values[key].producer is not None and tensor_type.HasField("shape"):
                declared.append((key, tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                                            for d in tensor_type.shape.dim)))
    return declared


def _sums_broadcast_with(b: Bindings) -> dict[str, tuple[str, ...]]:
    """For each input name broadcast together with one sum of input names and nothing else
    that binds it (a mask[batch, total] against attention scores over cached and new keys,
    Concat(past, seq)): the names it is the sum of."""
    groups: dict[str, list[str]] = {}
    for name in {*b.together, *b.together.values()}:
        groups.setdefault(b.group(name), []).append(name)
    found = {}
    for members in groups.values():
        totals = [b.sums[m] for m in members if m in b.sums]
        inputs = [m for m in members if m in b.names]
        if len(totals) != 1 or len(inputs) != 1:
            continue
        terms = [t for t in totals[0] if isinstance(t, Sym)]
        if len(terms) == len(totals[0]) and all(t == Sym(t.name) and t.name in b.names and t.name != inputs[0]
                                                for t in terms):
            found[inputs[0]] = tuple(t.name for t in terms)
    return found
