"""Random small float32 ONNX models with feeds they run on, for property tests (hypothesis).

``examples()`` draws an :class:`Example`: a model of at most ~30 nodes (opsets 17-21)
built from the common ops (MatMul, Gemm, arithmetic, activations, Softmax,
LayerNormalization, reductions, Transpose, Reshape to fixed targets and through
Shape -> Gather/Slice -> Concat computations, Concat, Slice, Gather, Where, Cast
round trips, Pad, Conv and the pools, Flatten (into a MatMul of the flattened extent),
Expand (to constant or Shape-computed targets), Split, Tile, If branches and Loop
bodies that read outer values; LayerNormalization decomposed with Pow or Mul and Sqrt, GELU
with Erf or Pow 3 and Tanh, Clip, Abs, Neg, Sqrt, Squeeze and Unsqueeze, BatchNormalization,
Resize by 2 to scales or Shape-computed sizes, position embeddings gathered at a Range of an
extent), with float inputs, sometimes int64 token ids into an
embedding Gather and an int64 attention mask cast to float, inputs
whose declared dimensions may be symbolic ("batch", "seq", unnamed) and constants
that leave float16's range (elements beyond 65504, below its smallest subnormal,
or whose products overflow). The feeds are concrete arrays the float32 model runs
on; most models run for any extent of their symbolic dimensions, some (a Reshape
to a literal shape, a Gather of a high index along a symbolic axis, an edge or reflect
Pad of a short unnamed axis, a Flatten into a MatMul, a Conv or pool window wider than
some extents, an Expand or a Split to literal extents) only for the extents the feeds have.

Every tensor's extent is tracked twice: its value under the feeds, and a symbol
that says when two extents are equal for every input (a literal int, an input
dimension's name, or a fresh token for a computed extent), so operands are paired
only where ONNX broadcasting holds whatever the symbols are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import count

import numpy as np
import onnx
import onnx.printer
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSETS = (17, 18, 19, 20, 21)
IR_VERSIONS = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}
MAX_NODES = 30
MAX_ELEMENTS = 4096
INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Dim:
    value: int
    """The extent under the feeds."""
    sym: int | str
    """A literal extent, or a name shared by exactly the extents equal for every input."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[Dim, ...]
    positive: bool = False
    """Every element is > 0 (Log and Div may read it)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.value for d in self.dims)

    @property
    def rank(self) -> int:
        return len(self.dims)


class Example:
    """A model and feeds it runs on in float32; printed as ONNX text (hypothesis shows a failing
    example by its ``repr``; a dataclass would be shown field by field)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
        self.model = model
        self.feeds = feeds

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {list(v.shape)}" for k, v in self.feeds.items())
        return f"Example(feeds {{{shapes}}}, model:\n{onnx.printer.to_text(self.model)})"


def fixed(value: int) -> Dim:
    return Dim(value, value)


class Graph:
    """Nodes and constants of one graph; names unique across the model (``names`` is shared)."""

    def __init__(self, names: count, opset: int, constant_nodes: bool) -> None:
        self.names = names
        self.opset = opset
        self.constant_nodes = constant_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.sub_nodes = 0
        """Nodes in the bodies of this graph's If and Loop nodes."""
        self.integer_inputs: list[Tensor] = []
        """The model's int64 inputs (``integer_inputs``), for the top-level graph."""

    def fresh(self, base: str) -> str:
        return f"{base}{next(self.names)}"

    def child(self) -> Graph:
        return Graph(self.names, self.opset, constant_nodes=True)

    @property
    def node_count(self) -> int:
        return len(self.nodes) + self.sub_nodes

    def const(self, array: np.ndarray, base: str = "c") -> str:
        name = self.fresh(base)
        tensor = numpy_helper.from_array(np.asarray(array), name)
        if self.constant_nodes:
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("n_"), value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64), "i")

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs):
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.fresh(f"n_{op_type}_"), **attrs))
        return names[0] if outputs == 1 else names


# --- drawing helpers ---------------------------------------------------------------------------

CONSTANT_KINDS = ("normal", "normal", "normal", "large", "tiny", "tiny_mixed", "overflow_product")


def weights(draw, rng: np.random.Generator, shape: tuple[int, ...], kinds=CONSTANT_KINDS) -> np.ndarray:
    """Normal values (scaled 0.1 to 30), or values that leave float16: above its max, below its
    smallest subnormal, or of magnitude 200-400 so that products of two overflow 65504."""
    kind = draw(st.sampled_from(kinds))
    base = rng.standard_normal(shape) * draw(st.sampled_from([0.1, 0.5, 1.0, 1.0, 10.0, 30.0]))
    size = int(np.prod(shape))
    if kind == "large" and size:
        flat = base.reshape(-1)
        picked = rng.choice(size, max(1, size // 8), replace=False)
        flat[picked] = rng.choice([-1, 1], len(picked)) * rng.uniform(1e5, 1e6, len(picked))
    elif kind == "tiny":
        base = rng.choice([-1, 1], shape) * rng.uniform(1e-10, 1e-8, shape)
    elif kind == "tiny_mixed" and size:
        flat = base.reshape(-1)
        picked = rng.choice(size, max(1, size // 2), replace=False)
        flat[picked] = rng.choice([-1, 1], len(picked)) * rng.uniform(1e-10, 1e-8, len(picked))
    elif kind == "overflow_product":
        base = rng.choice([-1, 1], shape) * rng.uniform(200, 400, shape)
    return np.asarray(base, np.float32)


def pick(draw, pool: list[Tensor], where=lambda t: True) -> Tensor | None:
    """A tensor of the pool, the recent ones more often."""
    candidates = [t for t in pool if where(t)]
    if not candidates:
        return None
    if draw(st.booleans()):
        return candidates[-1 - draw(st.integers(0, min(2, len(candidates) - 1)))]
    return draw(st.sampled_from(candidates))


def broadcast(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """The broadcast dims when ``a`` and ``b`` broadcast for every extent of their symbols."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else None
        y = b[-i] if i <= len(b) else None
        if x is None or y is None:
            out.append(x or y)
        elif x.sym == y.sym:
            out.append(x)
        elif x.sym == 1:
            out.append(y)
        elif y.sym == 1:
            out.append(x)
        else:
            return None
    return tuple(reversed(out))


def computed(graph: Graph, value: int, parts: list[Dim]) -> Dim:
    """The dim of an extent computed from ``parts``: literal when they all are."""
    return fixed(value) if all(isinstance(p.sym, int) for p in parts) else Dim(value, graph.fresh("~"))


def numel(dims) -> int:
    return math.prod(d.value for d in dims)


def const_like(draw, rng, graph: Graph, dims: tuple[Dim, ...], divisor: bool = False) -> Tensor:
    """A constant that broadcasts against ``dims`` for every extent: a suffix, 1 where symbolic.
    A ``divisor`` has no element in (1e-7, 0.25): it is tiny on purpose or far from 0."""
    suffix = dims[len(dims) - draw(st.integers(0, len(dims))):]
    shape = tuple(d.value if isinstance(d.sym, int) and draw(st.integers(0, 3)) else 1 for d in suffix)
    array = weights(draw, rng, shape)
    if divisor:
        array = np.where((np.abs(array) > 1e-7) & (np.abs(array) < 0.25), np.copysign(0.25, array), array)
    return Tensor(graph.const(array, "w"), tuple(fixed(n) for n in shape), positive=bool((array > 0).all()))


# --- ops: each returns the new tensor, or None when the drawn operands don't fit --------------

UNARY = ("Relu", "Sigmoid", "Tanh", "Exp")
POSITIVE_UNARY = ("Sigmoid", "Exp")


def unary(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool)
    op = draw(st.sampled_from(UNARY))
    return Tensor(g.op(op, [t.name]), t.dims, positive=op in POSITIVE_UNARY)


def log(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.positive)
    if t is None:
        x = pick(draw, pool)
        if draw(st.booleans()):
            t = Tensor(g.op("Sigmoid", [x.name]), x.dims, True)
        else:
            square = g.op("Mul", [x.name, x.name])
            t = Tensor(g.op("Add", [square, g.const(np.float32(draw(st.sampled_from([1e-3, 1.0]))))]), x.dims, True)
    return Tensor(g.op("Log", [t.name]), t.dims)


def arithmetic(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """a op b, b computed or constant; a divisor is positive or a constant far from 0 (or tiny)."""
    op = draw(st.sampled_from(("Add", "Sub", "Mul", "Div")))
    a = pick(draw, pool)
    wanted = (lambda t: t.positive) if op == "Div" else (lambda t: True)
    b = pick(draw, pool, lambda t: wanted(t) and broadcast(a.dims, t.dims) is not None) \
        if draw(st.booleans()) else None
    b = b or const_like(draw, rng, g, a.dims, divisor=op == "Div")
    if op != "Div" and draw(st.booleans()):
        a, b = b, a
    dims = broadcast(a.dims, b.dims)
    if dims is None or numel(dims) > MAX_ELEMENTS:
        return None
    positive = a.positive and b.positive and op in ("Add", "Mul", "Div")
    return Tensor(g.op(op, [a.name, b.name]), dims, positive)


def matmul(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    a = pick(draw, pool)
    if draw(st.booleans()) and a.rank >= 2:  # two computed operands: a @ b, or a @ a^T
        b = pick(draw, pool, lambda t: t.rank >= 2 and t.dims[-2].sym == a.dims[-1].sym
                 and broadcast(a.dims[:-2], t.dims[:-2]) is not None)
        if b is None:
            perm = [*range(a.rank - 2), a.rank - 1, a.rank - 2]
            b = Tensor(g.op("Transpose", [a.name], perm=perm), tuple(a.dims[p] for p in perm))
        dims = (*broadcast(a.dims[:-2], b.dims[:-2]), a.dims[-2], b.dims[-1])
    else:
        if a.rank == 0 or not isinstance(a.dims[-1].sym, int):
            return None
        n = draw(st.sampled_from([1, 2, 4, 8, 16]))
        b = Tensor(g.const(weights(draw, rng, (a.shape[-1], n)), "w"), (a.dims[-1], fixed(n)))
        dims = (*a.dims[:-1], fixed(n))
    if numel(dims) > MAX_ELEMENTS:
        return None
    return Tensor(g.op("MatMul", [a.name, b.name]), dims)


def gemm(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    trans_a = draw(st.integers(0, 1))
    a = pick(draw, pool, lambda t: t.rank == 2 and isinstance(t.dims[1 - trans_a].sym, int))
    if a is None:
        return None
    k, m = a.dims[1 - trans_a], a.dims[trans_a]
    n = draw(st.sampled_from([1, 3, 8]))
    trans_b = draw(st.integers(0, 1))
    b = g.const(weights(draw, rng, (n, k.value) if trans_b else (k.value, n)), "w")
    inputs = [a.name, b]
    if draw(st.booleans()):
        inputs.append(g.const(weights(draw, rng, draw(st.sampled_from([(n,), (1, n), ()]))), "bias"))
    alpha, beta = draw(st.sampled_from([1.0, 0.5, 2.0])), draw(st.sampled_from([1.0, 0.5]))
    return Tensor(g.op("Gemm", inputs, alpha=alpha, beta=beta, transA=trans_a, transB=trans_b), (m, fixed(n)))


def softmax(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    axis = draw(st.integers(-t.rank, t.rank - 1))
    return Tensor(g.op("Softmax", [t.name], axis=axis), t.dims, positive=True)


def layer_norm(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1 and isinstance(t.dims[-1].sym, int))
    if t is None:
        return None
    first_fixed = min(i for i in range(t.rank) if all(isinstance(d.sym, int) for d in t.dims[i:]))
    axis = draw(st.integers(max(first_fixed, t.rank - 2), t.rank - 1))
    shape = t.shape[axis:]
    scale = g.const(weights(draw, rng, shape, ("normal", "normal", "large", "tiny_mixed")), "gamma")
    inputs = [t.name, scale] + ([g.const(weights(draw, rng, shape), "beta")] if draw(st.booleans()) else [])
    if draw(st.booleans()):
        axis -= t.rank
    return Tensor(g.op("LayerNormalization", inputs, axis=axis, epsilon=draw(st.sampled_from([1e-5, 1e-12]))),
                  t.dims)


def reduce(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    op = draw(st.sampled_from(("ReduceMean", "ReduceSum")))
    axes = sorted(draw(st.sets(st.integers(0, t.rank - 1), min_size=1, max_size=t.rank)))
    keepdims = draw(st.integers(0, 1))
    dims = tuple(fixed(1) if i in axes else d for i, d in enumerate(t.dims) if keepdims or i not in axes)
    written = [a - t.rank if draw(st.booleans()) else a for a in axes]
    if op == "ReduceMean" and g.opset < 18:
        out = g.op(op, [t.name], axes=written, keepdims=keepdims)
    else:
        out = g.op(op, [t.name, g.ints(written)], keepdims=keepdims)
    return Tensor(out, dims, positive=t.positive)


def transpose(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 2)
    if t is None:
        return None
    perm = draw(st.permutations(range(t.rank)))
    return Tensor(g.op("Transpose", [t.name], perm=list(perm)), tuple(t.dims[p] for p in perm), t.positive)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def reshape_literal(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Reshape to a shape constant: [-1], [0, -1], or literal extents (which pin symbolic inputs)."""
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    total = numel(t.dims)
    form = draw(st.sampled_from(("flat", "keep_first", "literal", "literal", "literal_minus_one")))
    if form == "flat":
        target, dims = [-1], (computed(g, total, list(t.dims)),)
    elif form == "keep_first" and t.rank >= 2:
        target, dims = [0, -1], (t.dims[0], computed(g, total // t.shape[0], list(t.dims[1:])))
    else:
        first = draw(st.sampled_from(divisors(total)))
        second = draw(st.sampled_from(divisors(total // first)))
        extents = [e for e in (first, second, total // first // second) if e != 1 or draw(st.booleans())] or [total]
        target, dims = list(extents), tuple(fixed(e) for e in extents)
        if form == "literal_minus_one":
            slot = draw(st.integers(0, len(target) - 1))
            target[slot] = -1
            dims = tuple(computed(g, e, list(t.dims)) if i == slot else d
                         for i, (e, d) in enumerate(zip(extents, dims)))
    return Tensor(g.op("Reshape", [t.name, g.ints(target)]), dims, t.positive)


def shape_of(draw, g: Graph, t: Tensor, start: int, end: int) -> str:
    """The 1-D int64 extents ``t.shape[start:end]``, as exporters compute them."""
    if g.opset >= 15 and draw(st.booleans()):
        return g.op("Shape", [t.name], start=start, end=end)
    shape = g.op("Shape", [t.name])
    if draw(st.booleans()) or end - start != 1:
        return g.op("Slice", [shape, g.ints([start]), g.ints([end]), g.ints([0])])
    scalar = g.op("Gather", [shape, g.const(np.int64(start), "i")], axis=0)
    return g.op("Unsqueeze", [scalar, g.ints([0])])


def reshape_computed(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Reshape to a shape computed from Shape: merge the last two dims, split the last, swap two
    (reading one tensor's extents, reshaping another of the same element count), or append a 1."""
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    form = draw(st.sampled_from(("merge", "split", "swap", "append")))
    r = t.rank
    if form == "merge" and r >= 2:
        head = [shape_of(draw, g, t, 0, r - 2)] if r > 2 else []
        if draw(st.booleans()):
            tail = g.ints([-1])
        else:  # the product of the two extents, computed
            tail = g.op("Mul", [shape_of(draw, g, t, r - 2, r - 1), shape_of(draw, g, t, r - 1, r)])
        parts = [*head, tail]
        dims = (*t.dims[:-2], computed(g, t.shape[-2] * t.shape[-1], list(t.dims[-2:])))
    elif form == "split" and isinstance(t.dims[-1].sym, int) and t.shape[-1] % 2 == 0:
        parts = ([shape_of(draw, g, t, 0, r - 1)] if r > 1 else []) + [g.ints([2, t.shape[-1] // 2])]
        dims = (*t.dims[:-1], fixed(2), fixed(t.shape[-1] // 2))
    elif form == "swap" and r >= 2:
        i, j = sorted(draw(st.sets(st.integers(0, r - 1), min_size=2, max_size=2)))
        order = list(range(r))
        order[i], order[j] = j, i
        parts = [shape_of(draw, g, t, k, k + 1) for k in order]
        dims = tuple(t.dims[k] for k in order)
    elif form == "append":
        parts = [shape_of(draw, g, t, 0, r), g.ints([1])]
        dims = (*t.dims, fixed(1))
    else:
        return None
    target = g.op("Concat", parts, axis=0) if len(parts) > 1 else parts[0]
    return Tensor(g.op("Reshape", [t.name, target]), dims, t.positive)


def concat(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    a = pick(draw, pool, lambda t: t.rank >= 1)
    if a is None:
        return None
    axis = draw(st.integers(0, a.rank - 1))
    same = [d.sym for i, d in enumerate(a.dims) if i != axis]
    b = pick(draw, pool, lambda t: t.rank == a.rank and [d.sym for i, d in enumerate(t.dims) if i != axis] == same)
    if draw(st.integers(0, 2)) == 0 and all(isinstance(s, int) for s in same):
        shape = tuple(d.value if i != axis else draw(st.integers(1, 3)) for i, d in enumerate(a.dims))
        b = Tensor(g.const(weights(draw, rng, shape), "w"), tuple(fixed(n) for n in shape))
    dims = tuple(computed(g, d.value + b.dims[axis].value, [d, b.dims[axis]]) if i == axis else d
                 for i, d in enumerate(a.dims))
    if numel(dims) > MAX_ELEMENTS:
        return None
    inputs = [a.name, b.name] if draw(st.booleans()) else [b.name, a.name]
    return Tensor(g.op("Concat", inputs, axis=axis - a.rank * draw(st.integers(0, 1))), dims,
                  a.positive and b.positive)


def slice_(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    axis = draw(st.integers(0, t.rank - 1))
    d = t.dims[axis]
    if isinstance(d.sym, int):
        step = draw(st.sampled_from([1, 1, 2, -1]))
        positions = list(range(d.value))[::step]
        start = draw(st.integers(0, len(positions) - 1))
        stop = draw(st.integers(start + 1, len(positions)))
        begin = positions[start] - d.value * draw(st.integers(0, 1))
        end = (positions[stop] if stop < len(positions) else (INT64_MAX if step > 0 else -INT64_MAX))
        starts, ends, extent = g.ints([begin]), g.ints([end]), fixed(stop - start)
        inputs = [t.name, starts, ends, g.ints([axis]), g.ints([step])]
    else:
        form = draw(st.sampled_from(("first", "last", "drop_first", "drop_last")))
        if form.startswith("drop") and d.value < 2:
            return None
        if form == "drop_last":  # the end computed from the extent
            end = g.op("Sub", [shape_of(draw, g, t, axis, axis + 1), g.ints([1])])
            inputs, extent = [t.name, g.ints([0]), end, g.ints([axis])], Dim(d.value - 1, g.fresh("~"))
        else:
            begin, end, extent = {"first": (0, 1, fixed(1)), "last": (-1, INT64_MAX, fixed(1)),
                                  "drop_first": (1, INT64_MAX, Dim(d.value - 1, g.fresh("~")))}[form]
            inputs = [t.name, g.ints([begin]), g.ints([end]), g.ints([axis])]
    dims = tuple(extent if i == axis else e for i, e in enumerate(t.dims))
    return Tensor(g.op("Slice", inputs), dims, t.positive)


def gather(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    axis = draw(st.integers(0, t.rank - 1))
    n = t.shape[axis]
    if isinstance(t.dims[axis].sym, int) or draw(st.integers(0, 3)) == 0:  # any index, or (pinning) one in range
        index = st.integers(-n, n - 1)
    else:
        index = st.sampled_from([0, -1])
    if draw(st.booleans()):
        indices, dims = np.int64(draw(index)), tuple(d for i, d in enumerate(t.dims) if i != axis)
    else:
        chosen = draw(st.lists(index, min_size=1, max_size=4))
        indices = np.asarray(chosen, np.int64)
        dims = tuple(fixed(len(chosen)) if i == axis else d for i, d in enumerate(t.dims))
    return Tensor(g.op("Gather", [t.name, g.const(indices, "idx")], axis=axis - t.rank * draw(st.integers(0, 1))),
                  dims, t.positive)


def where(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    c = pick(draw, pool)
    threshold = g.const(np.float32(draw(st.sampled_from([0.0, 0.5, -1.0]))))
    cond = g.op(draw(st.sampled_from(("Greater", "Less"))), [c.name, threshold])
    x = pick(draw, pool, lambda t: broadcast(c.dims, t.dims) is not None)
    fill = g.const(np.float32(draw(st.sampled_from([0.0, -1e4, -1e9, 3e5, 1.5]))))
    branches = [x.name, fill] if draw(st.booleans()) else [fill, x.name]
    return Tensor(g.op("Where", [cond, *branches]), broadcast(c.dims, x.dims))


def cast_round_trip(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool)
    name = t.name
    rounding = draw(st.sampled_from((None, "Floor", "Round")))
    if rounding:
        name = g.op(rounding, [name])
    integer = g.op("Cast", [name], to=TensorProto.INT64)
    return Tensor(g.op("Cast", [integer], to=TensorProto.FLOAT), t.dims)


def expand(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Expand to a target that keeps an axis (1, or its extent computed from Shape), writes its
    extent (which pins a named one: to it, or to 1), or widens an axis of 1; maybe a new leading
    axis. The target is one constant, or a Concat of Shape slices and constants."""
    t = pick(draw, pool)
    computed_target = draw(st.booleans())
    lead = [draw(st.integers(1, 3))] if draw(st.booleans()) else []
    literal, parts, dims = list(lead), [g.ints(lead)] if lead and computed_target else [], [fixed(e) for e in lead]
    for axis, d in enumerate(t.dims):
        if draw(st.booleans()):  # kept
            literal.append(1)
            if computed_target:
                parts.append(shape_of(draw, g, t, axis, axis + 1))
            dims.append(d)
        else:
            extent = draw(st.integers(1, 4)) if d.sym == 1 else d.value
            literal.append(extent)
            if computed_target:
                parts.append(g.ints([extent]))
            dims.append(fixed(extent))
    if not literal or numel(dims) > MAX_ELEMENTS:
        return None
    concatenated = computed_target and len(parts) > 1
    target = g.op("Concat", parts, axis=0) if concatenated else parts[0] if computed_target else g.ints(literal)
    return Tensor(g.op("Expand", [t.name, target]), tuple(dims), t.positive)


def split(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Split along an axis of extent 2 or more into literal sizes (which pin a named axis to
    their sum) or, from opset 18, into ``num_outputs`` even parts; one part goes on."""
    t = pick(draw, pool, lambda t: any(d.value >= 2 for d in t.dims))
    if t is None:
        return None
    axis = draw(st.sampled_from([i for i, d in enumerate(t.dims) if d.value >= 2]))
    n = t.shape[axis]
    written = axis - t.rank * draw(st.integers(0, 1))
    if g.opset >= 18 and n % 2 == 0 and draw(st.booleans()):
        parts = g.op("Split", [t.name], 2, axis=written, num_outputs=2)
        extent = computed(g, n // 2, [t.dims[axis]])
    else:
        first = draw(st.integers(1, n - 1))
        parts = g.op("Split", [t.name, g.ints([first, n - first])], 2, axis=written)
        extent = fixed(first)
    dims = tuple(extent if i == axis else d for i, d in enumerate(t.dims))
    return Tensor(parts[0], dims, t.positive)


def tile(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    repeats = [draw(st.integers(1, 2)) for _ in t.dims]
    dims = tuple(d if r == 1 else computed(g, d.value * r, [d]) for d, r in zip(t.dims, repeats))
    if numel(dims) > MAX_ELEMENTS:
        return None
    return Tensor(g.op("Tile", [t.name, g.ints(repeats)]), dims, t.positive)


def pad(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    mode = draw(st.sampled_from(("constant", "constant", "edge", "reflect")))
    axes = sorted(draw(st.sets(st.integers(0, t.rank - 1), min_size=1, max_size=2)))
    amounts = {a: (draw(st.integers(0, 2)), draw(st.integers(0, 2))) for a in axes}
    if mode == "reflect" and any(max(amounts[a]) >= t.shape[a] for a in axes):
        return None
    dims = tuple(d if i not in amounts or sum(amounts[i]) == 0 else computed(g, d.value + sum(amounts[i]), [d])
                 for i, d in enumerate(t.dims))
    if numel(dims) > MAX_ELEMENTS:
        return None
    inputs = [t.name]
    if g.opset >= 18 and draw(st.booleans()):
        pads = [amounts[a][0] for a in axes] + [amounts[a][1] for a in axes]
        extra = [g.ints(axes)]
    else:
        pads = [amounts.get(a, (0, 0))[0] for a in range(t.rank)] + [amounts.get(a, (0, 0))[1] for a in range(t.rank)]
        extra = []
    inputs.append(g.ints(pads))
    if mode == "constant":
        value = np.float32(draw(st.sampled_from([0.0, 1.0, -1e5, 1e-9])))
        inputs.append(g.const(value))
    elif extra:
        inputs.append("")
    return Tensor(g.op("Pad", inputs + extra, mode=mode), dims, t.positive and mode != "constant")


def window(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Conv, MaxPool or AveragePool over [N, C, spatial...] (C literal): kernel, stride,
    dilation, pads or auto_pad, ceil_mode (a pool's, only where ONNX Runtime's rule for a last
    window that starts past the input cannot apply: then ceil is exact)."""
    t = pick(draw, pool, lambda t: t.rank in (3, 4) and isinstance(t.dims[1].sym, int))
    if t is None:
        return None
    op = draw(st.sampled_from(("Conv", "MaxPool", "AveragePool")))
    spatial = t.rank - 2
    auto_pad = draw(st.sampled_from(("NOTSET", "NOTSET", "VALID", "SAME_UPPER")))
    kernel = [draw(st.integers(1, 3)) for _ in range(spatial)]
    # SAME with a stride beyond the kernel makes ONNX Runtime's pool pads negative (an error)
    strides = [draw(st.integers(1, k if auto_pad == "SAME_UPPER" else 3)) for k in kernel]
    dilated = op != "AveragePool" and auto_pad != "SAME_UPPER"
    dilations = [draw(st.integers(1, 2)) if dilated else 1 for _ in range(spatial)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2] if auto_pad == "NOTSET" else [0] * 2 * spatial
    windows = [dilation * (k - 1) + 1 for k, dilation in zip(kernel, dilations)]
    # one ceil_mode for every axis: only where no axis' end pad and stride reach past its window
    ceil_mode = (op != "Conv" and auto_pad == "NOTSET" and draw(st.booleans())
                 and all(pads[axis + spatial] + stride <= w for axis, (stride, w) in enumerate(zip(strides, windows))))
    extents = []
    for axis, (stride, window_size) in enumerate(zip(strides, windows)):
        extent = t.shape[2 + axis]
        if auto_pad == "SAME_UPPER":
            extents.append(-(-extent // stride))
            continue
        span = window_size - pads[axis] - pads[axis + spatial]
        if extent < span:
            return None
        extents.append((extent - span + (stride - 1 if ceil_mode else 0)) // stride + 1)
    attrs = {"strides": strides}
    attrs.update({"pads": pads} if auto_pad == "NOTSET" else {"auto_pad": auto_pad})
    if dilated:
        attrs["dilations"] = dilations
    inputs, channels = [t.name], t.dims[1]
    if op == "Conv":
        channels = fixed(draw(st.sampled_from([1, 2, 4])))
        inputs.append(g.const(weights(draw, rng, (channels.value, t.shape[1], *kernel)), "w"))
    else:
        attrs.update(kernel_shape=kernel, ceil_mode=int(ceil_mode))
    dims = (t.dims[0], channels, *(computed(g, e, [d]) for e, d in zip(extents, t.dims[2:])))
    if numel(dims) > MAX_ELEMENTS:
        return None
    return Tensor(g.op(op, inputs, **attrs), dims, t.positive and op != "Conv")


def flatten(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Flatten at an axis, and often a MatMul whose weight takes the flattened extent that the
    feeds give (as a classifier's head does: it binds the input extents before it)."""
    t = pick(draw, pool, lambda t: t.rank >= 2)
    if t is None:
        return None
    axis = draw(st.integers(1, t.rank - 1))
    dims = tuple(computed(g, numel(part), list(part)) for part in (t.dims[:axis], t.dims[axis:]))
    flat = g.op("Flatten", [t.name], axis=axis - t.rank if draw(st.booleans()) else axis)
    if draw(st.booleans()):
        return Tensor(flat, dims, t.positive)
    n = draw(st.sampled_from([1, 2, 4, 8]))
    weight = g.const(weights(draw, rng, (dims[1].value, n)), "w")
    return Tensor(g.op("MatMul", [flat, weight]), (dims[0], fixed(n)))


def norm_decomposed(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """LayerNormalization as exporters decompose it over the last axis: x - mean, its square
    (Pow 2, or Mul), the mean of that plus epsilon, Sqrt, Div; a weight and bias after."""
    t = pick(draw, pool, lambda t: t.rank >= 1)
    if t is None:
        return None
    last = g.ints([-1])

    def mean(x: str) -> str:  # axes an attribute before opset 18
        return g.op("ReduceMean", [x], axes=[-1]) if g.opset < 18 else g.op("ReduceMean", [x, last])

    centred = g.op("Sub", [t.name, mean(t.name)])
    squared = (g.op("Pow", [centred, g.const(np.float32(2.0))]) if draw(st.booleans())
               else g.op("Mul", [centred, centred]))
    variance = mean(squared)
    epsilon = g.const(np.float32(draw(st.sampled_from([1e-5, 1e-12]))))
    normed = g.op("Div", [centred, g.op("Sqrt", [g.op("Add", [variance, epsilon])])])
    if isinstance(t.dims[-1].sym, int) and draw(st.booleans()):
        scale = g.const(weights(draw, rng, (t.shape[-1],), ("normal", "normal", "large")), "gamma")
        normed = g.op("Add", [g.op("Mul", [normed, scale]), g.const(weights(draw, rng, (t.shape[-1],)), "beta")])
    return Tensor(normed, t.dims)


def gelu(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """GELU as exporters write it: x * 0.5 * (1 + Erf(x / sqrt 2)), or its tanh form with Pow 3."""
    t = pick(draw, pool)
    if draw(st.booleans()):
        inner = g.op("Erf", [g.op("Div", [t.name, g.const(np.float32(math.sqrt(2.0)))])])
    else:
        cubed = g.op("Pow", [t.name, g.const(np.float32(3.0))])
        widened = g.op("Add", [t.name, g.op("Mul", [cubed, g.const(np.float32(0.044715))])])
        inner = g.op("Tanh", [g.op("Mul", [widened, g.const(np.float32(math.sqrt(2.0 / math.pi)))])])
    half = g.op("Mul", [t.name, g.const(np.float32(0.5))])
    return Tensor(g.op("Mul", [half, g.op("Add", [inner, g.const(np.float32(1.0))])]), t.dims)


def clip(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Clip to constant bounds (ReLU6 and its like), Abs, Neg or Sqrt of a positive tensor."""
    t = pick(draw, pool)
    form = draw(st.sampled_from(("Clip", "Abs", "Neg", "Sqrt")))
    if form == "Clip":
        low, high = sorted(draw(st.sampled_from([(0.0, 6.0), (-1.0, 1.0), (-7e4, 7e4), (0.0, 1e5)])))
        bounds = [g.const(np.float32(low)), g.const(np.float32(high))] if draw(st.booleans()) else \
            [g.const(np.float32(low))]
        return Tensor(g.op("Clip", [t.name, *bounds]), t.dims)
    if form == "Sqrt":
        t = pick(draw, pool, lambda t: t.positive)
        if t is None:
            return None
    return Tensor(g.op(form, [t.name]), t.dims, positive=form == "Sqrt" or (form == "Abs" and t.positive))


def squeeze(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Unsqueeze a new axis of 1, or Squeeze an axis of literal extent 1 (axes an input from opset 13)."""
    t = pick(draw, pool)
    ones = [i for i, d in enumerate(t.dims) if d.sym == 1]
    if ones and draw(st.booleans()):
        axis = draw(st.sampled_from(ones))
        dims = tuple(d for i, d in enumerate(t.dims) if i != axis)
        return Tensor(g.op("Squeeze", [t.name, g.ints([axis - t.rank * draw(st.integers(0, 1))])]), dims, t.positive)
    axis = draw(st.integers(0, t.rank))
    dims = (*t.dims[:axis], fixed(1), *t.dims[axis:])
    return Tensor(g.op("Unsqueeze", [t.name, g.ints([axis])]), dims, t.positive)


def batch_norm(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """BatchNormalization in inference over [N, C, ...] (C literal); its variance may be tiny."""
    t = pick(draw, pool, lambda t: t.rank >= 2 and isinstance(t.dims[1].sym, int))
    if t is None:
        return None
    c = t.shape[1]
    variance = np.abs(weights(draw, rng, (c,), ("normal", "normal", "tiny"))) + np.float32(1e-12)
    params = [g.const(weights(draw, rng, (c,)), "scale"), g.const(weights(draw, rng, (c,)), "bias"),
              g.const(weights(draw, rng, (c,)), "mean"), g.const(variance.astype(np.float32), "var")]
    return Tensor(g.op("BatchNormalization", [t.name, *params], epsilon=draw(st.sampled_from([1e-5, 1e-3]))), t.dims)


def resize(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Resize by 2 (nearest or linear) over the spatial axes of [N, C, H, W], by scales or by
    sizes computed from the input's Shape, as decoders upsample."""
    t = pick(draw, pool, lambda t: t.rank == 4)
    if t is None:
        return None
    dims = (*t.dims[:2], *(computed(g, 2 * d.value, [d]) for d in t.dims[2:]))
    if numel(dims) > MAX_ELEMENTS:
        return None
    mode = draw(st.sampled_from(("nearest", "linear")))
    if draw(st.booleans()):
        steer = ["", g.const(np.array([1, 1, 2, 2], np.float32), "scales")]
    else:
        doubled = g.op("Mul", [shape_of(draw, g, t, 2, 4), g.ints([2])])
        steer = ["", "", g.op("Concat", [shape_of(draw, g, t, 0, 2), doubled], axis=0)]
    return Tensor(g.op("Resize", [t.name, *steer], mode=mode), dims, t.positive)


def positions(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Position embeddings as language models compute them: Range(0, Shape(x)[axis]) gathered
    from a table at least as long as the feeds' extent, added to x."""
    t = pick(draw, pool, lambda t: t.rank >= 2 and isinstance(t.dims[-1].sym, int))
    if t is None:
        return None
    axis = t.rank - 2
    length = g.op("Squeeze", [shape_of(draw, g, t, axis, axis + 1), g.ints([0])])
    ids = g.op("Range", [g.const(np.int64(0), "i"), length, g.const(np.int64(1), "i")])
    table = g.const(weights(draw, rng, (t.shape[axis] + draw(st.integers(0, 8)), t.shape[-1])), "pos")
    return Tensor(g.op("Add", [t.name, g.op("Gather", [table, ids], axis=0)]), t.dims)


BODY_OPS = ("unary", "arithmetic", "arithmetic")


def elementwise_chain(draw, rng, body: Graph, start: Tensor, outer: list[Tensor]) -> Tensor:
    """1-3 ops from ``start`` whose result keeps ``start``'s dims, reading outer tensors too."""
    current = start
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.sampled_from(BODY_OPS)) == "unary":
            op = draw(st.sampled_from(UNARY))
            current = Tensor(body.op(op, [current.name]), current.dims)
            continue
        op = draw(st.sampled_from(("Add", "Sub", "Mul")))
        dims = current.dims
        other = pick(draw, outer, lambda t, dims=dims: broadcast(dims, t.dims) == dims)
        if other is None or draw(st.booleans()):
            other = const_like(draw, rng, body, current.dims)
        current = Tensor(body.op(op, [current.name, other.name]), current.dims)
    return current


def if_(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """If with two branches that read outer values; the condition from data, from an extent, or constant."""
    source = pick(draw, pool)
    form = draw(st.sampled_from(("data", "extent", "constant")))
    if form == "data":
        total = g.op("ReduceSum", [source.name], keepdims=0)
        cond = g.op("Greater", [total, g.const(np.float32(0.0))])
    elif form == "extent" and source.rank:
        axis = draw(st.integers(0, source.rank - 1))
        extent = g.op("Gather", [g.op("Shape", [source.name]), g.const(np.int64(axis), "i")], axis=0)
        cond = g.op("Greater", [extent, g.const(np.int64(draw(st.integers(1, 4))), "i")])
    else:
        cond = g.const(np.bool_(draw(st.booleans())), "flag")
    t = pick(draw, pool)
    branches = []
    for branch in ("then", "else"):
        body = g.child()
        out = elementwise_chain(draw, rng, body, t, pool)
        g.sub_nodes += len(body.nodes)
        branches.append(helper.make_graph(body.nodes, g.fresh(branch), [],
                                          [declared(out)]))
    return Tensor(g.op("If", [cond], then_branch=branches[0], else_branch=branches[1]), t.dims)


def loop(draw, rng, g: Graph, pool: list[Tensor]) -> Tensor | None:
    """Loop of 1-3 iterations carrying a tensor through elementwise ops that read outer values."""
    t = pick(draw, pool)
    trips = draw(st.integers(1, 3))
    body = g.child()
    iteration, cond_in = body.fresh("iter"), body.fresh("cond")
    carried = Tensor(body.fresh("carried"), t.dims)
    out = elementwise_chain(draw, rng, body, carried, pool)
    cond_out = body.op("Identity", [cond_in])
    scan = draw(st.booleans()) and numel(t.dims) * trips <= MAX_ELEMENTS
    outputs = [out] + ([Tensor(body.op("Identity", [out.name]), out.dims)] if scan else [])
    g.sub_nodes += len(body.nodes)
    graph = helper.make_graph(
        body.nodes, g.fresh("body"),
        [helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond_in, TensorProto.BOOL, []),
         declared(carried)],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []), *map(declared, outputs)])
    results = g.op("Loop", [g.const(np.int64(trips), "trips"), g.const(np.bool_(True), "go"), t.name], 1 + scan,
                   body=graph)
    if scan:
        final, stacked = results
        pool.append(Tensor(stacked, (fixed(trips), *t.dims)))
        return Tensor(final, t.dims)
    return Tensor(results, t.dims)


OPS = {unary: 3, log: 1, arithmetic: 4, matmul: 6, gemm: 2, softmax: 1, layer_norm: 2, reduce: 2, transpose: 1,
       reshape_literal: 2, reshape_computed: 2, concat: 1, slice_: 1, gather: 1, where: 1, cast_round_trip: 1,
       pad: 1, if_: 1, loop: 1, window: 2, flatten: 1, expand: 1, split: 1, tile: 1, norm_decomposed: 1, gelu: 1,
       clip: 1, squeeze: 1, batch_norm: 1, resize: 1, positions: 1}
OP_CHOICES = [op for op, weight in OPS.items() for _ in range(weight)]


# --- inputs and the model -----------------------------------------------------------------------


def input_dims(draw, g: Graph, extents: dict[str, int], rank: int) -> tuple[Dim, ...]:
    dims = []
    for i in range(rank):
        kind = draw(st.sampled_from(("batch", "seq", "fixed", "fixed", "unnamed") if i else ("batch", "fixed")))
        if kind == "fixed" or (kind == "seq" and "seq" in [d.sym for d in dims]):
            dims.append(fixed(draw(st.sampled_from([1, 2, 3, 4, 8]))))
        elif kind == "unnamed":
            dims.append(Dim(draw(st.integers(1, 3)), g.fresh("?")))
        else:
            if kind not in extents:
                extents[kind] = draw(st.integers(1, 4) if kind == "batch" else st.integers(2, 6))
            dims.append(Dim(extents[kind], kind))
    return tuple(dims)


def declared(t: Tensor, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """With the input dimension names and literal extents; computed extents left unnamed."""
    shape = [d.sym if isinstance(d.sym, int) or d.sym in ("batch", "seq") else None for d in t.dims]
    return helper.make_tensor_value_info(t.name, elem_type, shape)


def integer_inputs(draw, rng, g: Graph, extents: dict[str, int], pool: list[Tensor]) -> dict[str, np.ndarray]:
    """What language models read besides floats, drawn in: token ids into an embedding table,
    and an attention mask of 0 and 1 cast to float; the float results join the pool. Returns
    each input's feed."""
    feeds = {}
    if draw(st.integers(0, 3)) == 0:
        ids = Tensor("ids", input_dims(draw, g, extents, draw(st.integers(1, 2))))
        vocab, width = draw(st.integers(2, 50)), draw(st.sampled_from([1, 2, 4, 8]))
        table = g.const(weights(draw, rng, (vocab, width)), "emb")
        pool.append(Tensor(g.op("Gather", [table, ids.name]), (*ids.dims, fixed(width))))
        feeds[ids.name] = rng.integers(0, vocab, ids.shape).astype(np.int64)
        g.integer_inputs.append(ids)
    if draw(st.integers(0, 3)) == 0:
        mask = Tensor("attention_mask", input_dims(draw, g, extents, draw(st.integers(1, 2))))
        pool.append(Tensor(g.op("Cast", [mask.name], to=TensorProto.FLOAT), mask.dims))
        feeds[mask.name] = rng.integers(0, 2, mask.shape).astype(np.int64)
        g.integer_inputs.append(mask)
    return feeds


@st.composite
def examples(draw) -> Example:
    """A random model and feeds on which its float32 form runs (see the module docstring)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    opset = draw(st.sampled_from(OPSETS))
    g = Graph(count(), opset, constant_nodes=draw(st.integers(0, 3)) == 0)
    extents: dict[str, int] = {}
    first = Tensor("x", input_dims(draw, g, extents, draw(st.integers(1, 4))))
    inputs = [first]
    if draw(st.booleans()):
        dims = first.dims[draw(st.integers(0, first.rank - 1)):] if draw(st.booleans()) else \
            input_dims(draw, g, extents, draw(st.integers(1, 3)))
        inputs.append(Tensor("y", dims))
    pool = list(inputs)
    integer_feeds = integer_inputs(draw, rng, g, extents, pool)
    # "Another op?" before each (not a count drawn up front) lets the shrinker drop trailing ops.
    # One op adds up to ~10 nodes (an If with constant nodes).
    while g.node_count < MAX_NODES - 10 and draw(st.integers(0, 15)):
        op = draw(st.sampled_from(OP_CHOICES))
        result = op(draw, rng, g, pool)
        if result is not None and numel(result.dims) <= MAX_ELEMENTS:
            pool.append(result)
    computed_tensors = [t for t in pool if t not in inputs and t.name not in integer_feeds]
    if not computed_tensors:
        computed_tensors.append(Tensor(g.op("Relu", [first.name]), first.dims))
    outputs = [computed_tensors[-1]] + draw(st.lists(st.sampled_from(computed_tensors), max_size=2))
    outputs = list({t.name: t for t in outputs}.values())
    declared_inputs = [declared(t) for t in inputs] + [declared(t, TensorProto.INT64) for t in g.integer_inputs]
    graph = helper.make_graph(g.nodes, "fuzz", declared_inputs, [declared(t) for t in outputs], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSIONS[opset])
    feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in inputs} | integer_feeds
    return Example(model, feeds)
