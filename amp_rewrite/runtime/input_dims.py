"""Extents that a graph implies for its inputs' symbolic dimensions.

Generated inputs give a named dimension one extent everywhere (``batch`` = 8), which breaks a
model that reshapes ``batch x 16`` to a fixed [1, 4, 64]: the graph says ``batch`` is 4.
``implied_dims`` reads such bindings off the graph. ONNX shape inference, run on a copy
without the model's own value_info (an unnamed input dimension named ``input[axis]`` there),
carries the inputs' dimension names through elementwise ops, MatMul and their like, in every
graph (If and Loop bodies included); a Loop-carried output it leaves without a shape takes
its initial value's, and inference runs again from there. A dimension is a fixed extent or a
name times a scale plus an offset, divided and rounded down (``batch + 1``, ``2 x batch``,
``(height - 1) // 2``): Pad with constant pads (its axes input too, which inference does not
follow), Slice with constant starts and ends (``[1:]`` is ``batch - 1``) or ends computed from
a Shape (``x[:Shape(x)[0] - 1]``, where inference gives up on every axis), Concat of a named
extent with fixed ones or with itself, and Conv and the pools (kernel, stride, dilation, pads,
auto_pad; ceil_mode where it cannot drop a last window) give such dimensions, and a fresh name
that inference gave in their place stands for them wherever it reaches; a fresh name for a
product (Flatten's, a Reshape's -1 over several names, or a Reshape target computed as
``Shape(x)[0] x Shape(x)[1]``) stands for the product, one name for each product.
Then, until nothing new is learnt:

- a Loop body's carried input whose shape its carried output keeps has its initial value's
  dimensions (where inference named the body's ``?`` afresh); a Loop that runs to its
  constant trip count M stacks M of each scan output;
- Reshape to a constant shape without -1: the element counts agree (with the tensor it
  reshapes, and with those that Reshapes before it reshaped, through nodes that keep the
  shape, Loops that carry a value at its initial shape, MatMuls, whose fixed extents K
  and N scale the count by K / N, and Gathers of constant indices, which leave out the
  picked axis' dimension), which gives the one input dimension left unknown, offset
  or repeated too (``(batch + 1) x batch = 12``); with -1, the count is a multiple of the
  fixed extents, and the -1 is the count over the others where that is one dimension
  (``[batch, batch]`` to ``[0, -1]`` is ``[batch, batch]``);
- a fixed extent that the model's value_info or outputs declare where inference has a name;
- Split into constant sizes: the axis holds their sum; Tile by constant repeats multiplies;
  an If's output has the dimensions both its branches give it;
- broadcasting (elementwise ops, Expand to a constant or Shape-computed target, MatMul's
  batch dimensions) against one fixed extent
  above 1 (a Tile or Expand of a constant reaches here through its inferred shape), and
  dimensions that must be equal (Concat's off its axis, MatMul's and Gemm's contracted ones;
  a Concat of several names on its axis is their sum, and a fixed extent it meets gives the
  one name left unknown, or when guessing the last of them, the others at their least;
  a product that meets a fixed extent there is a count: LeNet's Flatten into a Gemm of 864
  inputs is 6 x h x w = 864; two named dimensions that meet there are a count that any
  guess must keep: a Conv's and a MaxPool's output of the same input agree at some of its
  extents only);
  an elementwise op or Expand gives its output, where inference left a fresh name, the
  dimension of each column that is not 1 (``batch`` beside a sliced 1).

A Range of a constant start and step holds (limit - start) / step elements (a limit computed
from a Shape gives a dimension); position ids Range(0, seq) gathered from a table of N rows
allow seq N at most: no guess exceeds it, and a name that nothing binds takes it where the
default is more.

Each binding names the node or value that implied it; the first one found wins. When names
are still unbound after that, the rules run again guessing. First, names broadcast together
with no fixed extent among them are taken as equal (the fresh name inference gave their
result stands for the first; one bound binds the others; an input name broadcast together
with one Concat's sum of other input names is that sum, whatever extents they take: a
mask[batch, total] against attention scores over Concat(past keys, new keys), with shapes
followed through Transposes), and what follows from that (the least extents below) is learnt
before any count is split. Then a count that several names
share goes to the last of them that appears once (the one that needs most, below), the others
1 (marked "guessed"; a second guess, ``guess=2``, gives them 2 where the count allows it;
where that breaks another count of the same names, a lone other name takes the first extent
that keeps them all), or the least their readers need: a Gather of a constant index on the
axis (index 2 needs 3), a reflect Pad (a pad of 1 needs 2).
A Reshape with -1, whose count need only be a multiple, guesses last, once every exact count
has had its guess. A rounded dimension binds its name to a range of extents (a Conv of stride
2 gives 28 from 55 and 56): where the bindings break a count, the names move within their
ranges to extents that keep them all. A name that nothing binds takes at least what its
readers need (three MaxPools of stride 2 need 15).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import onnx
from onnx import defs, numpy_helper

from amp_rewrite.ir.graph import ModelIndex, Node, ValueKey, names_read, subgraphs
from amp_rewrite.ir.sizes import iter_graphs, without_weights
from amp_rewrite.ir.tensors import constant_tensor


@dataclass(frozen=True)
class Sym:
    """A dimension named ``name``, times ``scale``, plus ``offset``, divided by ``divisor``
    and rounded down (``batch + 1`` after a Pad of one, ``2 x batch`` after a Concat of a value
    with itself, ``(height - 1) // 2`` after a Conv of kernel 3 and stride 2). A window op
    after another divides what the first gave: ``(a // b + c) // d`` is ``(a + c x b) // (b x d)``,
    so the form holds through a chain of them."""

    name: str
    offset: int = 0
    scale: int = 1
    divisor: int = 1

    def at(self, extent: int) -> int:
        """The dimension where its name is ``extent``."""
        return (self.scale * extent + self.offset) // self.divisor

    def reaching(self, extent: int) -> int:
        """The least extent of its name at which the dimension is ``extent`` or more."""
        return -((self.offset - extent * self.divisor) // self.scale)

    def solved(self, extent: int) -> int | None:
        """Its name's least extent where the dimension is ``extent``, or None where none gives it."""
        solved = self.reaching(extent)
        return solved if self.at(solved) == extent else None

    def solutions(self, extent: int) -> range:
        """Its name's extents where the dimension is ``extent`` (more than one where it is rounded)."""
        return range(self.reaching(extent), self.reaching(extent + 1))

    @property
    def affine(self) -> bool:
        """Whether it is ``scale x name + offset`` exactly (no rounding)."""
        return self.divisor == 1


Dim = int | Sym | None
"""A fixed extent, a named one, or None where nothing is known."""
MAX_ROUNDS = 4
"""Rounds of the rules over the graph; a binding found late can enable another."""
MAX_SEARCHED = 4096
"""The largest extent a guess tries for a name beside the one a count solves for."""
TO_THE_END = 2**31 - 1
"""A Slice end at least this large reaches the end of any axis (INT32_MAX, INT64_MAX are usual)."""


@functools.cache
def broadcasting() -> frozenset[str]:
    """Ops whose inputs broadcast numpy-style, as their ONNX schemas say (Add, Mul, Where, ...);
    read when first asked for: reading every schema costs more than importing onnx does."""
    return frozenset(s.name for s in defs.get_all_schemas()
                     if s.domain == "" and "multidirectional" in (s.doc or "").lower())


GUESSED = ", guessed"
"""How a guessed binding's origin ends (``from Reshape 'r1', guessed``)."""
AT_LEAST = ", at least"
"""How the origin of a name's least extent ends, where nothing bound it (``for Conv 'c1', at least``)."""
AT_MOST = ", at most"
"""How the origin of a name's greatest extent ends, where nothing bound it (``for Gather 'g', at most``)."""


@dataclass(frozen=True)
class Pin:
    """An extent for a dimension name, and what implied it."""

    extent: int
    origin: str
    sum_of: tuple[str, ...] = ()
    """Where not empty, the name is these names' sum, whatever extents they take (``extent`` is 0):
    a mask's length that broadcasting ties to a Concat of cached and new keys."""

    @property
    def guessed(self) -> bool:
        return self.origin.endswith(GUESSED)

    @property
    def floor(self) -> bool:
        """Whether it is the least extent the name may take (nothing bound it), not its extent."""
        return self.origin.endswith(AT_LEAST)

    @property
    def ceiling(self) -> bool:
        """Whether it is the greatest extent the name may take (nothing bound it), not its extent."""
        return self.origin.endswith(AT_MOST)


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
    rules = _Rules(ModelIndex(inferred), names, pins)
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
    for name, terms in rules.sums_broadcast_with().items():  # a sum of others, whatever extents they take
        if name not in pins:
            pins[name] = Pin(0, f"the sum {' + '.join(terms)} it is broadcast with", sum_of=terms)
    for name in names - set(pins):  # what the readers of a name that nothing bound need at least, or allow at most
        if rules.least.get(name, 1) > 1:
            pins[name] = Pin(rules.least[name], rules.least_origin[name] + AT_LEAST)
        elif name in rules.most:
            pins[name] = Pin(rules.most[name], rules.most_origin[name] + AT_MOST)
    return pins


def _apply(rules: _Rules, declared: list[tuple[ValueKey, tuple]]) -> None:
    """The rules, in rounds until a round learns nothing new."""
    broadcast_ops = broadcasting()
    for _ in range(MAX_ROUNDS):
        found = rules.learnt()
        for node in rules.index.nodes:
            rule = _NODE_RULES.get(node.op_type) or (_broadcast if node.op_type in broadcast_ops else None)
            if rule is not None and node.domain == "":
                rule(rules, node)
        for key, dims in declared:
            inferred = rules.shape(key)
            if inferred is not None and len(inferred) == len(dims):
                rules.agree(zip(inferred, dims), f"the declared shape of {key[1]!r}")
        if rules.learnt() == found:
            break


class _Rules:
    """What the rules share: the inferred shapes, constants, and the bindings found so far."""

    def __init__(self, index: ModelIndex, names: set[str], pins: dict[str, Pin]) -> None:
        self.index, self.names, self.pins = index, names, pins
        self.equal_broadcasts = False
        """Whether names broadcast together with no fixed extent among them are taken as equal."""
        self.guess = 0
        """When not 0, ``same_count`` may split a count among several names, the others getting
        this extent where the count allows it, else 1."""
        self.multiples = False
        """Whether ``multiple_of`` guesses: only once the exact counts have had their guesses
        (a Reshape to [-1, 2, 2] guessing seq = 4 first broke a Reshape of the same x to [2, 2, 2])."""
        self.aliases: dict[str, Dim] = {}
        """What a fresh name that inference gave (``unk__0`` for a Pad's padded axis) stands for."""
        self.derived: dict[ValueKey, tuple] = {}
        """Shapes that rules computed for values whose inferred shape lacks them (a Pad with axes)."""
        self.least: dict[str, int] = {}
        """The smallest extent each name may take (a Gather of index 2 on its axis needs 3): what
        a guess gives a name at the least."""
        self.least_origin: dict[str, str] = {}
        """What needs each name's least extent (``for Conv 'c1'``)."""
        self.most: dict[str, int] = {}
        """The greatest extent each name may take (position ids Range(0, seq) gathered from a
        table of 4 rows allow 4): what no guess may exceed."""
        self.most_origin: dict[str, str] = {}
        """What allows each name's greatest extent (``for Gather 'g'``)."""
        self.ranges: dict[str, list[int]] = {}
        """The extents that would have given the dimension that bound a name, where it is rounded
        (a Conv of stride 2 gives 28 from 55 and 56): ``settle`` may move the name within them."""
        self.products: dict[str, tuple[Dim, ...]] = {}
        """What a fresh name that inference gave stands for as a product of dimensions (Flatten's
        [batch, channels x height x width]): a fixed extent it meets is a count of them."""
        self.counts: set[tuple[tuple[Dim, ...], tuple[Dim, ...]]] = set()
        """Every count that two shapes share, of input names and fixed extents: what a guess
        for one of them must not contradict (x[batch, seq] to [6] beside y[batch, batch, seq]
        to [18] is batch 3, not the 1 that the first alone would guess)."""
        self.sums: dict[str, tuple[Dim, ...]] = {}
        """What a name that no input has stands for as a sum of dimensions of several names
        (a Concat of x[batch, a] and y[batch, b] on its last axis: a + b): a fixed extent it
        meets is a total of them."""
        self.totals: set[tuple[tuple[Dim, ...], int]] = set()
        """Every total that a sum met, which a guess must keep too."""
        self.together: dict[str, str] = {}
        """Names broadcast together with no fixed extent among them, while guessing: each name's
        link toward the one that stands for its group (``group``)."""
        self.divisible: set[tuple[tuple[Dim, ...], int]] = set()
        """Counts that a Reshape with -1 needs to be multiples of its fixed extents' product,
        which a guess must keep too (x[batch, batch, seq] to [-1, 9] beside x[0:1] to [2, 3]:
        batch x seq = 6 is batch 3, seq 2, not batch 1, seq 6)."""

    def learnt(self) -> int:
        """How much the rules have found: more after a round that found something."""
        return (len(self.pins) + len(self.aliases) + len(self.derived) + sum(self.least.values())
                + len(self.most) - sum(self.most.values()))

    def shape(self, key: ValueKey | None) -> tuple[Dim, ...] | None:
        """The shape, each name as a Sym (or what it is an alias of): as derived, else as inferred;
        for a Loop's carried value that inference left without one (its shape could change
        between iterations), the shape of its initial value."""
        if key is None:
            return None
        dims = self.derived.get(key, self.index.values[key].shape)
        if dims is None and (initial := self.initial(key)) is not None:
            return self.shape(initial)
        return None if dims is None else tuple(self.resolved(Sym(d)) if isinstance(d, str) else d for d in dims)

    def resolved(self, dim: Dim) -> Dim:
        """What a fresh name stands for (``aliases``), through fresh names that stand for others
        (the Add of a Loop body's carried value and x named afresh, which stands for the carried
        value's fresh name, which stands for x's dimension); a dimension computed from a fresh
        name (a Pad's ``unk__1 + 1``) is computed from what that stands for."""
        seen = set()
        while isinstance(dim, Sym) and dim.name in self.aliases and dim.name not in seen:
            seen.add(dim.name)
            target = self.aliases[dim.name]
            if dim == Sym(dim.name):
                dim = target
            elif isinstance(target, int):
                dim = dim.at(target)
            elif isinstance(target, Sym) and target.affine:  # s x (t x name + u) + o, over d
                dim = Sym(target.name, dim.scale * target.offset + dim.offset, dim.scale * target.scale, dim.divisor)
            else:
                break
        return dim

    def initial(self, key: ValueKey) -> ValueKey | None:
        """For a Loop's carried output, its initial value (the Loop's input that it carries)."""
        value = self.index.values[key]
        producer = self.index.producer_node(value)
        if producer is None or producer.op_type != "Loop" or producer.domain != "":
            return None
        carried = value.producer[1] + 2
        return producer.inputs[carried] if carried < len(producer.inputs) else None

    def derive(self, key: ValueKey | None, dims: Sequence[Dim]) -> None:
        """A rule computed ``key``'s ``dims``: a fresh name that inference gave in their place
        stands for them from now on; where inference gave no shape or no name, they are the shape."""
        if key is None or all(d is None for d in dims):
            return
        inferred = self.index.values[key].shape
        if inferred is None or len(inferred) != len(dims):
            self.derived.setdefault(key, tuple(dims))
            return
        for was, now in zip(inferred, dims):
            if isinstance(was, str) and was not in self.names and now is not None and now != Sym(was):
                self.aliases.setdefault(was, now)
        if any(was is None and now is not None for was, now in zip(inferred, dims)):
            self.derived.setdefault(key, tuple(now if was is None else was for was, now in zip(inferred, dims)))

    def constant(self, key: ValueKey | None) -> np.ndarray | None:
        """The value of a constant int tensor (a small initializer or a Constant node's), or None."""
        array = self.array(key)
        return array.astype(np.int64).reshape(-1) if array is not None and array.dtype.kind in "iu" else None

    def array(self, key: ValueKey | None) -> np.ndarray | None:
        """The value of a constant tensor (an initializer or a Constant node's), or None."""
        if key is None:
            return None
        tensor = self.index.initializers.get(key)
        producer = self.index.producer_node(self.index.values[key])
        if tensor is None and producer is not None and producer.op_type == "Constant":
            tensor = constant_tensor(producer.proto)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)

    def extent(self, dim: Dim) -> Dim:
        pin = self.pins.get(dim.name) if isinstance(dim, Sym) else None
        return dim.at(pin.extent) if pin else dim

    def pin(self, dim: Sym, extent: int, origin: str) -> None:
        """Bind ``dim``'s name so that ``dim`` is ``extent``: of the extents that give it (several
        where it is rounded), the first that keeps every count and the least its readers need
        (``least``), else the first that keeps every count, else the least."""
        if dim.name not in self.names or dim.name in self.pins:
            return
        solutions = [e for e in dim.solutions(extent) if e >= 1]
        if solutions:
            least = self.least.get(dim.name, 1)
            chosen = max(solutions, key=lambda e: (self.consistent({dim.name: e}), e >= least))  # the first best
            self.pins[dim.name] = Pin(chosen, origin)
            if len(solutions) > 1:
                self.ranges[dim.name] = solutions

    def settle(self) -> bool:
        """Where the bindings break a count: the extents, in the ranges that rounded dimensions
        left their names (``ranges``), that keep every count (the first of at most MAX_SEARCHED).
        Whether a binding moved."""
        if not self.ranges or self.consistent({}):
            return False
        names = list(self.ranges)
        for extents in itertools.islice(itertools.product(*self.ranges.values()), MAX_SEARCHED):
            if self.consistent(dict(zip(names, extents))):
                moved = any(self.pins[name].extent != extent for name, extent in zip(names, extents))
                for name, extent in zip(names, extents):
                    self.pins[name] = Pin(extent, self.pins[name].origin)
                return moved
        return False

    def agree(self, columns: Iterable[Sequence[Dim]], origin: str, broadcast: bool = False) -> None:
        """Each column holds dimensions that must be equal (``broadcast``: or 1): one fixed
        extent among them (above 1 when broadcasting) binds the names there; two named ones
        that differ (a Concat of a Conv's and a MaxPool's output of the same input, equal only
        at some extents of its name) are a count that the extents a guess takes must keep."""
        for column in columns:
            extents = [self.extent(d) for d in column]
            if not broadcast:
                named = list(dict.fromkeys(d for d in extents if isinstance(d, Sym)))
                self.counts.update(((a,), (b,)) for a, b in zip(named, named[1:]) if {a.name, b.name} <= self.names)
            fixed = {d for d in extents if isinstance(d, int) and (d > 1 or not broadcast)}
            literal = {d for d in column if isinstance(d, int) and (d > 1 or not broadcast)}
            if len(literal) == 1:  # a name bound to another extent breaks a count: for ``settle`` to mend
                self.counts.update(((d,), tuple(literal)) for d, bound in zip(column, extents)
                                   if isinstance(d, Sym) and d.name in self.names and isinstance(bound, int)
                                   and bound not in literal and not (broadcast and bound == 1))
            if len(fixed) == 1:
                extent = next(iter(fixed))
                for d in extents:
                    if isinstance(d, Sym) and d.name in self.products:
                        # a count of the product, at the one extent that gives this one where it is
                        # offset or rounded (a Slice of all but the last of a flattened x)
                        product = d if d.affine and not d.offset else Sym(d.name)
                        solved = d.solutions(extent) if product != d else [extent]
                        if len(solved) == 1:
                            self.same_count((product,), (solved[0],), origin)
                    elif isinstance(d, Sym) and d.name in self.sums:
                        self.total(d, extent, origin)
                    elif isinstance(d, Sym):
                        self.pin(d, extent, origin)
            elif broadcast and self.equal_broadcasts and not fixed:  # names broadcast together are taken as equal:
                plain = [d.name for d in extents if isinstance(d, Sym) and d == Sym(d.name)]
                for a, b in zip(plain, plain[1:]):
                    if self.group(a) != self.group(b):
                        self.together[self.group(a)] = self.group(b)
                bound = {e for d, e in zip(column, extents) if isinstance(d, Sym) and d.name in self.pins}
                if len(bound) == 1:  # one bound to 1 (x[3] beside y[3] = 1) binds the others to 1
                    for d in extents:
                        if isinstance(d, Sym):
                            self.pin(d, next(iter(bound)), origin + GUESSED)

    def multiple_of(self, dims: Sequence[Dim], factors: Sequence[Dim], origin: str) -> None:
        """When guessing multiples: ``dims`` must hold a multiple of the fixed ``factors``' product; the
        last name of ``dims`` not yet bound makes up what the fixed extents lack, at the
        smallest extent that does (others at their least, 1 mostly; a name may appear more
        than once: seq x seq a multiple of 4 makes seq 2)."""
        spread = self.spread(dims)
        extents = [self.extent(d) for d in spread]
        factors = [self.extent(f) for f in factors]
        if all(isinstance(f, int) for f in factors) and math.prod(factors) > 1:
            self.divisible.add((tuple(spread), math.prod(factors)))
        if (not self.multiples or None in extents or not all(isinstance(f, int) for f in factors)
                or any(isinstance(e, Fraction) for e in extents)):
            return
        needed = math.prod(factors)
        have = math.prod(e for e in extents if isinstance(e, int))
        unknown = [e for e in extents if isinstance(e, Sym)]
        if not unknown or needed <= 0 or have <= 0 or not have % needed or not self.inputs_only(unknown):
            return
        names = list(dict.fromkeys(d.name for d in unknown))
        # the least extent of the last name that gives a multiple and keeps every other count, multiple
        # and most (x[1, batch, seq] to [-1, 2, 2] and to [-1, 6]: seq 12, not 4); where none does, of
        # another name (x[batch, batch, seq] to [-1, 4] with seq 2 at most: batch 2); else the least
        # extent of the last name that gives a multiple
        chosen = fallback = None
        for turn, last in enumerate([names[-1], *reversed(names[:-1])]):
            at = {name: self.least.get(name, 1) for name in names if name != last}
            rest = have * math.prod(d.at(at[d.name]) for d in unknown if d.name != last)
            mine = [d for d in unknown if d.name == last]
            low = max(self.least.get(last, 1), *(d.reaching(1) for d in mine))
            span = MAX_SEARCHED if not turn else min(MAX_SEARCHED, 4 * needed)
            for fit in (e for e in range(low, low + span) if not rest * math.prod(d.at(e) for d in mine) % needed):
                if self.consistent({**at, last: fit}):
                    chosen = (at, last, fit)
                    break
                if fallback is None and not turn:
                    fallback = (at, last, fit)
            if chosen is not None:
                break
        chosen = chosen or fallback
        if chosen is not None:
            at, last, extent = chosen
            self.split([Sym(name) for name in (*at, last)], extent, origin, last_guessed=True, others=at)

    def group(self, name: str) -> str:
        """The name that stands for ``name``'s group of names broadcast together (``together``)."""
        while name in self.together:
            name = self.together[name]
        return name

    def sums_broadcast_with(self) -> dict[str, tuple[str, ...]]:
        """For each input name broadcast together with one sum of input names and nothing else
        that binds it (a mask[batch, total] against attention scores over cached and new keys,
        Concat(past, seq)): the names it is the sum of."""
        groups: dict[str, list[str]] = {}
        for name in {*self.together, *self.together.values()}:
            groups.setdefault(self.group(name), []).append(name)
        found = {}
        for members in groups.values():
            totals = [self.sums[m] for m in members if m in self.sums]
            inputs = [m for m in members if m in self.names]
            if len(totals) != 1 or len(inputs) != 1:
                continue
            terms = totals[0]
            if all(isinstance(t, Sym) and t == Sym(t.name) and t.name in self.names and t.name != inputs[0]
                   for t in terms):
                found[inputs[0]] = tuple(t.name for t in terms)
        return found

    def sum_of(self, dims: Sequence[Dim]) -> Dim:
        """``dims`` added up: one dimension where they name at most one name (``_sum``), else a
        name standing for their sum (``sums``), where each is a fixed extent or a name's, unrounded."""
        total = _sum(dims)
        if total is not None or not all(isinstance(d, int) or (isinstance(d, Sym) and d.affine) for d in dims):
            return total
        name = "(" + " + ".join(str(d) if isinstance(d, int) else _written(d) for d in dims) + ")"
        self.sums.setdefault(name, tuple(dims))
        return Sym(name)

    def total(self, dim: Sym, extent: int, origin: str) -> None:
        """``dim``, a sum of dimensions (``sums``), is ``extent``: solve for the one name left
        unknown; when guessing, for the last of several, the others at the guess or their least
        (x[batch, a] and y[batch, b] concatenated into a MatMul of 6 inputs: a = 1, b = 5)."""
        solved = dim.solutions(extent)
        if len(solved) != 1:
            return
        terms = [self.resolved(d) for d in self.sums[dim.name]]
        if not all(isinstance(d, int) or (isinstance(d, Sym) and d.affine and d.name in self.names) for d in terms):
            return
        self.totals.add((tuple(terms), solved[0]))
        left = solved[0] - sum(d for d in map(self.extent, terms) if isinstance(d, int))
        factors: dict[str, list[Sym]] = {}
        for d in terms:
            if isinstance(self.extent(d), Sym):
                factors.setdefault(d.name, []).append(d)
        if not factors or (len(factors) > 1 and not self.guess):
            return
        least = {name: max(self.least.get(name, 1), *(d.reaching(1) for d in dims)) for name, dims in factors.items()}
        *others, last = sorted(factors, key=lambda name: (len(factors[name]) == 1, least[name]))
        for at in ({name: max(self.guess, least[name]) for name in others}, {name: least[name] for name in others}):
            rest = left - sum(d.at(at[name]) for name in others for d in factors[name])
            extent, remainder = divmod(rest - sum(d.offset for d in factors[last]),
                                       sum(d.scale for d in factors[last]))
            if not remainder and extent >= least[last] and self.consistent({**at, last: extent}):
                self.split([Sym(name) for name in (*others, last)], extent, origin, others=at)
                return

    def inputs_only(self, dims: Iterable[Sym]) -> bool:
        """Whether ``dims`` name only input dimensions: a count that a fresh name of inference's
        shares (``unk__0`` for a Reshape's -1) solves for nothing, and a guess there would bind
        the input names beside it for nothing."""
        return all(d.name in self.names for d in dims)

    def product_of(self, dim: Dim) -> tuple[Dim, ...] | None:
        """The dimensions whose product ``dim`` is, where it is a fresh name standing for one."""
        return self.products.get(dim.name) if isinstance(dim, Sym) and dim == Sym(dim.name) else None

    def spread(self, dims: Sequence[Dim], within: frozenset[str] = frozenset()) -> list[Dim]:
        """``dims`` with each fresh name standing for a product (``products``; scaled: ``2 x
        unk__0``) replaced by its factors, those of products in turn (not those ``within``,
        being spread already), and each fresh name that stands for a dimension (``aliases``)
        by it."""
        spread: list[Dim] = []
        for dim in dims:
            dim = self.resolved(dim)  # a factor named afresh that a later rule resolved
            if (isinstance(dim, Sym) and dim.name in self.products and dim.affine and not dim.offset
                    and dim.name not in within):
                spread += [dim.scale] if dim.scale != 1 else []
                spread += self.spread(self.products[dim.name], within | {dim.name})
            else:
                spread.append(dim)
        return spread

    def at_least(self, dim: Dim, extent: int, origin: str) -> None:
        """``dim`` must be ``extent`` or more (a product, ``products``: the last of its names not
        bound makes up what the others lack at their least)."""
        if (product := self.product_of(dim)) is not None:
            extents = [self.extent(d) for d in product]
            unknown = [d for d in extents if isinstance(d, Sym)]
            if None in extents or not unknown or not self.inputs_only(unknown):
                return
            last = unknown[-1].name
            have = math.prod(d.at(self.least.get(d.name, 1)) if isinstance(d, Sym) and d.name != last else d
                             for d in extents if not isinstance(d, Sym) or d.name != last)
            least = self.least.get(last, 1)
            if have > 0 and least < MAX_SEARCHED:
                needed = _reaching([d for d in unknown if d.name == last], -(-extent // have))
                self.at_least(Sym(last), max(least, min(needed, MAX_SEARCHED)), origin)
        elif isinstance(dim, Sym) and dim.name in self.names and dim.reaching(extent) > self.least.get(dim.name, 1):
            self.least[dim.name] = dim.reaching(extent)
            self.least_origin[dim.name] = origin

    def at_most(self, dim: Dim, extent: int, origin: str) -> None:
        """``dim`` must be ``extent`` or less (one input name, affine)."""
        if isinstance(dim, Sym) and dim.name in self.names and dim.affine and dim.scale > 0:
            most = dim.reaching(extent + 1) - 1
            if most >= 1 and most < self.most.get(dim.name, most + 1):
                self.most[dim.name], self.most_origin[dim.name] = most, origin

    def split(self, dims: Sequence[Sym], extent: int, origin: str, last_guessed: bool = False,
              others: Mapping[str, int] | None = None) -> None:
        """``extent`` for the last of ``dims`` (a guess too if ``last_guessed``), ``others``
        (guessed: 1 where it names none) for the others' names."""
        for dim in dims[:-1]:
            self.pin(Sym(dim.name), (others or {}).get(dim.name, 1), origin + GUESSED)
        self.pin(dims[-1], extent, origin + GUESSED if last_guessed else origin)

    def same_count(self, left: Sequence[Dim], right: Sequence[Dim], origin: str) -> None:
        """``left`` and ``right`` hold as many elements: solve for the one name left unknown
        (where it appears more than once too: batch x (batch + 1) = 12; a product shifted or
        scaled, 1 + batch x seq after a Concat with one element, against a fixed count too)."""
        for one, other in ((left, right), (right, left)):
            dims = [self.resolved(d) for d in one]
            named = [d for d in dims if not isinstance(d, int)]
            dim = named[0] if len(named) == 1 else None
            if isinstance(dim, Sym) and dim.name in self.products and dim.affine and dim != Sym(dim.name):
                have = math.prod(d for d in dims if isinstance(d, int))
                extents = [self.extent(d) for d in self.spread(other)]
                if have and all(isinstance(e, int) for e in extents):
                    count, rest = divmod(math.prod(extents), have)
                    if not rest and (solved := dim.solved(count)):
                        self.same_count([Sym(dim.name)], [solved], origin)
                return
        left, right = self.spread(left), self.spread(right)
        fixed, named = [1, 1], [Counter(), Counter()]
        for side, dims in enumerate((left, right)):
            for dim in map(self.extent, dims):
                if dim is None:
                    return
                if isinstance(dim, int):
                    fixed[side] *= dim
                elif isinstance(dim, Fraction):  # a product's 1/2 is a 2 on the other side
                    fixed[side] *= dim.numerator
                    fixed[1 - side] *= dim.denominator
                else:
                    named[side][dim] += 1
        unknown = [named[0] - named[1], named[1] - named[0]]
        sides = [side for side in (0, 1) if unknown[side]]
        if not sides and fixed[0] != fixed[1] and self.inputs_only(d for d in (*left, *right) if isinstance(d, Sym)):
            self.counts.add((tuple(left), tuple(right)))  # the names bound break it: for ``settle`` to mend
        if len(sides) != 1 or 0 in fixed:
            return
        if not self.inputs_only(unknown[sides[0]]):
            return
        self.counts.add((tuple(left), tuple(right)))
        side, factors = sides[0], {}
        for dim in unknown[sides[0]].elements():
            factors.setdefault(dim.name, []).append(dim)
        if len(factors) > 1 and not self.guess:
            return
        # a name's least: what its readers need, and 1 in each of its dimensions (batch - 1 needs 2)
        least = {name: max(self.least.get(name, 1), *(d.reaching(1) for d in dims)) for name, dims in factors.items()}
        # solve for a name appearing once, the one that needs the most if any: it takes what is left
        *others, last = sorted(factors, key=lambda name: (len(factors[name]) == 1, least[name]))
        # the others at the guess (and their least) where the count allows, else at their least, else 1
        tries = [{name: max(self.guess, least[name]) for name in others},
                 {name: least[name] for name in others}, dict.fromkeys(others, 1)]
        # then each other name at the other extents the count allows, the rest at their least: for
        # one that the other counts and the leasts allow too
        tries += [{**{other: least[other] for other in others}, name: extent} for name in others
                  for extent in range(1, min(fixed[1 - side], MAX_SEARCHED) + 1)]
        # the first guess that keeps every count and every name's least, else the first that keeps
        # every count, else the first that keeps this count and the leasts, else this count alone;
        # the last name below its least only where no guess gives it that (a count is exact, a least
        # may come from a product's need that another name can meet)
        chosen, best = None, None
        for at, extent in self._candidates(tries, others, last, factors, fixed[side], fixed[1 - side]):
            rank = (extent >= least[last], self.consistent({**at, last: extent}),
                    all(at[name] >= least[name] for name in others))
            if best is None or rank > best:
                chosen, best = (at, extent), rank
            if all(rank):
                break
        if chosen is not None:
            self.split([Sym(name) for name in (*others, last)], chosen[1], origin, others=chosen[0])
            for name, dims in factors.items():  # the extents that give the same factors, where they are rounded
                pin = self.pins.get(name)
                if pin is not None and not all(d.affine for d in dims):
                    same = set.intersection(*(set(d.solutions(d.at(pin.extent))) for d in dims))
                    if len(same) > 1:
                        self.ranges.setdefault(name, sorted(same))

    @staticmethod
    def _candidates(tries: list[dict[str, int]], others: list[str], last: str, factors: Mapping[str, list[Sym]],
                    have: int, count: int) -> Iterator[tuple[dict[str, int], int]]:
        """For each of ``tries`` (the other names' extents, each once), the extents of ``last``
        that make ``have`` times the factors' product ``count`` (several where its factors are rounded)."""
        for at in (dict(t) for t in dict.fromkeys(tuple(t.items()) for t in tries)):
            rest = math.prod(d.at(at[name]) for name in others for d in factors[name])
            wanted, left_over = divmod(count, have * rest) if rest > 0 else (0, 1)
            if not left_over:
                yield from ((at, extent) for extent in _solutions(factors[last], wanted))

    def consistent(self, extents: Mapping[str, int]) -> bool:
        """Whether the names at ``extents`` (and those bound) keep every count the shapes share
        (or leave it one input name, once, that some extent solves it for), and every multiple
        that a Reshape's -1 needs (``divisible``)."""
        known = {**{name: pin.extent for name, pin in self.pins.items()}, **extents}

        def count(dims: Sequence[Dim]) -> Fraction | None:
            total = Fraction(1)
            for dim in dims:
                if isinstance(dim, Sym) and dim.name in known:
                    dim = dim.at(known[dim.name])
                if not isinstance(dim, (int, Fraction)):
                    return None
                total *= dim
            return total

        def solvable(sides: tuple[Sequence[Dim], Sequence[Dim]]) -> bool:
            """With one input name left once, alone (x[batch, seq] to [16] with seq 3 leaves batch
            16 / 3), whether a whole extent of it keeps the count."""
            unknown = [(side, d) for side, dims in enumerate(sides) for d in dims if count([d]) is None]
            if len(unknown) != 1 or unknown[0][1] != Sym(unknown[0][1].name) or unknown[0][1].name not in self.names:
                return True
            side, dim = unknown[0]
            mine, other = count([d for d in sides[side] if d is not dim]), count(sides[1 - side])
            needed = other / mine if mine else Fraction(1)
            return needed.denominator == 1 and needed >= 1

        if any(known[name] > most for name, most in self.most.items() if name in known):
            return False
        for terms, total in self.totals:
            added = [count([d]) for d in terms]
            if None not in added and sum(added) != total:
                return False
        for left, right in self.counts:
            counted = count(left), count(right)
            if None not in counted and counted[0] != counted[1]:
                return False
            if not solvable((left, right)):
                return False
        return all(counted is None or not counted % needed
                   for counted, needed in ((count(dims), needed) for dims, needed in self.divisible))


def _reaching(dims: Sequence[Sym], count: int) -> int:
    """The least extent of the name that ``dims`` share at which their product is ``count`` or
    more (a binary search: the product grows with the name)."""
    low = max(1, *(d.reaching(1) for d in dims))
    high = max(low, *(d.reaching(count) for d in dims))  # each factor alone reaches count there
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if math.prod(d.at(middle) for d in dims) < count else (low, middle)
    return low


def _solutions(dims: Sequence[Sym], count: int) -> Iterator[int]:
    """The extents of the name that ``dims`` share at which their product is ``count``, least
    first (on from ``_reaching`` while it holds: a rounded dimension holds over several)."""
    extent = _reaching(dims, count)
    while math.prod(d.at(extent) for d in dims) == count:
        yield extent
        extent += 1


def _reshape(rules: _Rules, node: Node) -> None:
    """The target's dimensions (constant, or computed from Shapes: ``_shape_value``); a -1 takes
    what is left; a target dimension that is a product of names (Shape(x)[0] x Shape(x)[1]), and
    a -1 that takes several names, leave a fresh name standing for the product (``_product``)."""
    data = rules.shape(node.inputs[0])
    target = _shape_value(rules, node.inputs[1]) if len(node.inputs) > 1 else None
    if data is None or target is None:
        return
    allowzero = any(a.name == "allowzero" and a.i for a in node.proto.attribute)
    if not allowzero and any(t == 0 and i >= len(data) for i, t in enumerate(target)):
        return
    result = [data[i] if t == 0 and not allowzero else t for i, t in enumerate(target)]
    missing = [i for i, t in enumerate(target) if t == -1]
    if len(missing) == 1:
        at = missing[0]
        result[at] = _left_over(data, _factors(result[:at] + result[at + 1:]))
    rules.derive(node.outputs[0], [_product(rules, node.outputs[0], i, d) if isinstance(d, tuple) else d
                                   for i, d in enumerate(result)])
    known = [d for d, t in zip(result, target) if t != -1]
    for counted, times, per in _reshaped_from(rules, node.inputs[0]):
        if not missing:  # counted x per = result x times
            rules.same_count((*counted, per), (*_factors(result), times), f"Reshape {node.label!r}")
        elif times == per:  # a -1 takes what is left: the count need only be a multiple of the rest
            rules.multiple_of(counted, _factors(known), f"Reshape {node.label!r}")


def _factors(dims: Sequence[Dim | tuple[Dim, ...]]) -> list[Dim]:
    """``dims`` with each product (a tuple of its factors, as ``_shape_value`` gives it) spread out."""
    return [f for d in dims for f in (d if isinstance(d, tuple) else (d,))]


def _left_over(data: Sequence[Dim], others: Sequence[Dim]) -> Dim | tuple[Dim, ...]:
    """What a Reshape's -1 takes: ``data``'s count over the product of the ``others`` (``batch``
    for [batch, batch] to [0, -1]; 2 x seq for [seq, 2] to [-1]; where several names are left,
    their product as ``_times`` gives it: (batch, seq, 2) for [batch, 1, seq, 4] to [2, -1], and
    (batch, seq, 1/2) for [batch, seq] to [2, -1])."""
    fixed, named = [1, 1], [Counter(), Counter()]
    for side, dims in enumerate((data, others)):
        for dim in dims:
            if dim is None:
                return None
            if isinstance(dim, int):
                fixed[side] *= dim
            elif dim.offset or not dim.affine:
                named[side][dim] += 1
            else:
                fixed[side] *= dim.scale
                named[side][Sym(dim.name)] += 1
    left = named[0] - named[1]
    if named[1] - named[0] or fixed[1] <= 0 or (fixed[0] % fixed[1] and not left):
        return None
    if not left:
        return fixed[0] // fixed[1]
    return functools.reduce(_times, left.elements(), Fraction(fixed[0], fixed[1]))


def _reshaped_from(rules: _Rules, key: ValueKey | None) -> Iterator[tuple[tuple[Dim, ...], int, int]]:
    """The shape of ``key`` and those that the Reshapes producing it reshaped, nearest first,
    through nodes whose first input has their output's shape (a Relu between two Reshapes),
    Loops whose carried value has its initial value's shape, MatMuls, and Gathers of constant
    indices (the gathered axis' dimension left out of every shape further back, while they
    hold it), each with (times, per): it holds ``key``'s count times ``times``, per ``per``
    (where a Reshape to [-1] left a fresh name, the one before it has names)."""
    times = per = 1
    gathered: list[Dim] = []
    while key is not None:
        shape = rules.shape(key)
        if shape is not None:
            shape = _leaving_out(shape, gathered)
            if shape is None:
                return
            yield shape, times, per
        producer = rules.index.producer_node(rules.index.values[key])
        source = rules.initial(key) or (producer.inputs[0] if producer is not None and producer.inputs else None)
        reshape = producer is not None and producer.op_type in ("Reshape", "Flatten") and producer.domain == ""
        if reshape or (shape is not None and rules.shape(source) == shape):
            key = source
        elif (contracted := _contracted(rules, producer, shape)) is not None:
            times, per, key = times * contracted[0], per * contracted[1], source
        elif (picked := _picked(rules, producer)) is not None:
            gathered.append(picked[0])
            per, key = per * int(picked[1].size), source
        else:
            key = None


def _product(rules: _Rules, key: ValueKey | None, position: int, dims: Sequence[Dim]) -> Dim:
    """The dimension at ``position`` of ``key`` that is the product of ``dims``: a fixed extent or
    one name scaled (``_times``); where several names meet, None, and the fresh name that
    inference gave there (``products``) stands for their product (the first such name for
    each product: the others are its aliases)."""
    dims = functools.reduce(_times, dims, 1)
    if not isinstance(dims, tuple):
        return dims
    inferred = rules.index.values[key].shape if key is not None else None
    name = inferred[position] if inferred is not None and position < len(inferred) else None
    if isinstance(name, str) and name not in rules.names and name not in rules.products:
        same = next((other for other, factors in rules.products.items() if Counter(factors) == Counter(dims)), None)
        if same is None:
            rules.products[name] = tuple(dims)
        else:  # one name for one product: two flattenings of x concatenated are 2 x (batch x seq)
            rules.aliases.setdefault(name, Sym(same))
    return None


def _flatten(rules: _Rules, node: Node) -> None:
    """[d0, ..., dn] flattened at ``axis`` is [d0 x ... x d(axis - 1), d(axis) x ... x dn]
    (``_product``: a Gemm's weight after it fixes the count of the flattened dimensions)."""
    data = rules.shape(node.inputs[0])
    if data is None:
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 1)
    axis += len(data) if axis < 0 else 0
    if 0 <= axis <= len(data):
        rules.derive(node.outputs[0], [_product(rules, node.outputs[0], side, dims)
                                       for side, dims in enumerate((data[:axis], data[axis:]))])


def _window(rules: _Rules, node: Node) -> None:
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
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else list(weight[2:]) if weight else None
    if kernel is None or len(kernel) != spatial or not all(isinstance(k, int) for k in kernel):
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
            dims.append(_divided(dim, stride - 1, stride))
            continue
        window = dilation * (k - 1) + 1
        end_pad = pads[axis + spatial]
        span = window - pads[axis] - end_pad
        rules.at_least(dim, span, f"for {node.op_type} {node.label!r}")
        if not ceil_mode:
            dims.append(_divided(dim, stride - span, stride))
        else:
            dims.append(_divided(dim, 2 * stride - 1 - span, stride) if end_pad + stride <= window else None)
    for key in node.outputs[:2]:  # MaxPool's indices have its output's shape
        rules.derive(key, dims)


def _divided(dim: Dim, add: int, divisor: int) -> Dim:
    """``(dim + add) // divisor``."""
    if isinstance(dim, int):
        return (dim + add) // divisor
    if isinstance(dim, Sym):
        return Sym(dim.name, dim.offset + add * dim.divisor, dim.scale, dim.divisor * divisor)
    return None


def _leaving_out(shape: tuple[Dim, ...], dims: Sequence[Dim]) -> tuple[Dim, ...] | None:
    """``shape`` without one of its dimensions equal to each of ``dims``; None where one is missing."""
    left = list(shape)
    for dim in dims:
        if dim is None or dim not in left:
            return None
        left.remove(dim)
    return tuple(left)


def _picked(rules: _Rules, node: Node | None) -> tuple[Dim, np.ndarray] | None:
    """For a Gather of constant indices: the dimension of the axis it picks on, and the indices
    (its output holds its data's count over that dimension, times as many as there are)."""
    if node is None or node.op_type != "Gather" or node.domain != "" or len(node.inputs) < 2:
        return None
    data, indices = rules.shape(node.inputs[0]), rules.constant(node.inputs[1])
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if data is None or indices is None or not -len(data) <= axis < len(data):
        return None
    return data[axis], indices


def _contracted(rules: _Rules, node: Node | None, shape: tuple[Dim, ...] | None) -> tuple[int, int] | None:
    """For a MatMul whose first input [..., K] has its output's [..., N] rank and leading
    dimensions, K and N fixed: (K, N), the elements the input holds for each N of the output's."""
    if node is None or node.op_type != "MatMul" or node.domain != "" or shape is None:
        return None
    first = rules.shape(node.inputs[0])
    if first is None or len(first) != len(shape) or len(shape) < 2 or first[:-1] != shape[:-1]:
        return None
    k, n = first[-1], shape[-1]
    return (k, n) if isinstance(k, int) and isinstance(n, int) and k > 0 and n > 0 else None


def _broadcast(rules: _Rules, node: Node) -> None:
    shapes = [rules.shape(key) for key in node.inputs if key is not None]
    if node.op_type == "Expand":  # the target: constant or computed from Shapes (a product: not followed)
        target = _shape_value(rules, node.inputs[1]) if len(node.inputs) > 1 else None
        shapes[1:] = [None if target is None else [None if isinstance(d, tuple) else d for d in target]]
    if all(s is not None for s in shapes):
        columns = _aligned(shapes)
        rules.agree(columns, f"{node.op_type} {node.label!r}", broadcast=True)
        rules.derive(node.outputs[0] if node.outputs else None,
                     [_broadcast_dim(column, rules.equal_broadcasts) for column in columns])


def _broadcast_dim(column: Sequence[Dim], guessing: bool = False) -> Dim:
    """The dimension that broadcasting ``column`` gives: the one that is not 1 where they agree
    (``batch`` and 1 give ``batch``); when guessing, the first of several names (``x[2]`` and
    ``y[2]`` added are taken as equal: once one is bound, broadcasting binds the other); else None."""
    wider = set(column) - {1}
    if not wider:
        return 1
    if len(wider) == 1 and None not in wider:
        return next(iter(wider))
    return next(d for d in column if d != 1) if guessing and all(isinstance(d, Sym) for d in wider) else None


def _concat(rules: _Rules, node: Node) -> None:
    shapes = [rules.shape(key) for key in node.inputs if key is not None]
    if not shapes or any(s is None or len(s) != len(shapes[0]) for s in shapes):
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0) % max(len(shapes[0]), 1)
    rules.agree((column for i, column in enumerate(zip(*shapes)) if i != axis), f"Concat {node.label!r}")
    rules.derive(node.outputs[0],
                 [rules.sum_of(column) if i == axis else None for i, column in enumerate(zip(*shapes))])


def _pad(rules: _Rules, node: Node) -> None:
    """Each padded axis grows by its pads (negative ones crop): ``batch + 2``."""
    data, pads = rules.shape(node.inputs[0]), _ints(rules, node, 1, "pads")
    if data is None or pads is None:
        return
    axes = _ints(rules, node, 3, default=range(len(data)))
    if axes is None or len(pads) != 2 * len(axes):
        return
    dims = list(data)
    mirrored = any(a.name == "mode" and a.s == b"reflect" for a in node.proto.attribute)
    for axis, before, after in zip(axes, pads[:len(axes)], pads[len(axes):]):
        if not -len(dims) <= axis < len(dims):
            return
        if mirrored:  # a reflection of n needs more than n elements
            rules.at_least(dims[axis], max(int(before), int(after)) + 1, f"for Pad {node.label!r}")
        dims[axis] = _sum([dims[axis], int(before + after)])
    rules.derive(node.outputs[0], dims)


def _transpose(rules: _Rules, node: Node) -> None:
    """The output has the input's dimensions, permuted (reversed without ``perm``): the sum that a
    Concat of cached and new keys gives reaches the attention scores' MatMul through one."""
    data = rules.shape(node.inputs[0]) if node.inputs else None
    if data is None:
        return
    perm = next((list(a.ints) for a in node.proto.attribute if a.name == "perm"), None) or range(len(data))[::-1]
    if sorted(perm) == list(range(len(data))):
        rules.derive(node.outputs[0], [data[axis] for axis in perm])


def _if(rules: _Rules, node: Node) -> None:
    """An output has the dimensions that both branches give it (inference merges only names
    that are the same: a Pad by one in one branch and a Concat of one row in the other are
    both ``batch + 1``, under two fresh names)."""
    branches = rules.index.subgraphs.get(node.id) or []
    if len(branches) != 2:
        return
    outputs = zip(*(rules.index.graphs[branch].outputs for branch in branches))
    for key, pair in zip(node.outputs, outputs):
        then, other = (rules.shape(k) for k in pair)
        if then is not None and then == other:
            rules.derive(key, then)


def _tile(rules: _Rules, node: Node) -> None:
    """Each axis repeated by a constant: ``2 x batch`` (inference gives a repeated named axis a
    fresh name, even for a repeat of 1); a rounded one repeated is a product (``_product``:
    2 x (seq // 2) has no one-name form)."""
    data, repeats = rules.shape(node.inputs[0]), _ints(rules, node, 1)
    if data is not None and repeats is not None and len(repeats) == len(data):
        rules.derive(node.outputs[0], [_product(rules, node.outputs[0], axis, (d, int(r)))
                                       for axis, (d, r) in enumerate(zip(data, repeats))])


def _resize(rules: _Rules, node: Node) -> None:
    """Resize (and Upsample) to constant sizes, or sizes computed from Shapes, gives those (a
    product: ``_product``); by constant scales, each axis times its scale, rounded down (a whole
    scale of a name: ``2 x height``; another scale of a name: unknown). Resize's ``axes`` name
    the axes that the sizes or scales are for."""
    data = rules.shape(node.inputs[0]) if node.inputs else None
    if data is None:
        return
    axes = next((list(a.ints) for a in node.proto.attribute if a.name == "axes"), range(len(data)))
    if not all(-len(data) <= a < len(data) for a in axes):
        return
    sizes = _shape_value(rules, node.inputs[3]) if node.op_type == "Resize" and len(node.inputs) == 4 else None
    dims: list[Dim] = list(data)
    if sizes is not None and len(sizes) == len(axes):
        for axis, size in zip(axes, sizes):
            dims[axis] = _product(rules, node.outputs[0], axis % len(data), size) if isinstance(size, tuple) else size
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
                dims[axis] = _product(rules, node.outputs[0], axis % len(data), (dim, int(scale))) if whole else None
    rules.derive(node.outputs[0], dims)


def _range(rules: _Rules, node: Node) -> None:
    """Range of a constant start and step holds (limit - start) / step elements, rounded up: a
    limit computed from a Shape gives a dimension (position ids Range(0, Shape(x)[1]): seq)."""
    bounds = _range_bounds(rules, node)
    if bounds is None:
        return
    begin, end, step = bounds
    if isinstance(begin, int) and isinstance(step, int) and step >= 1 and not isinstance(end, tuple):
        length = _divided(_sum([end, -begin]), step - 1, step)
        rules.derive(node.outputs[0], [max(length, 0) if isinstance(length, int) else length])


def _range_bounds(rules: _Rules, node: Node) -> tuple[Dim | tuple[Dim, ...], ...] | None:
    """A Range node's start, limit and step as dimensions (``_shape_value``: a limit may come from a Shape)."""
    if node.domain != "" or len(node.inputs) != 3:
        return None
    values = [_shape_value(rules, key) for key in node.inputs]
    return tuple(value[0] for value in values) if all(value and len(value) == 1 for value in values) else None


def _split(rules: _Rules, node: Node) -> None:
    """The axis holds the split sizes' sum (sizes [1, 2] make it 3; from its opset 13 an input,
    before an attribute), each output the size of its part; without sizes, a whole number of
    equal parts (before opset 18), or at least one element per part (``num_outputs``, each
    part but the last the axis over their number, rounded up)."""
    data = rules.shape(node.inputs[0])
    if data is None or not data:
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if not -len(data) <= axis < len(data):
        return
    axis %= len(data)
    origin = f"Split {node.label!r}"
    sizes = _ints(rules, node, 1, "split")
    if sizes is not None and len(sizes) == len(node.outputs):
        rules.agree([(data[axis], int(sum(sizes)))], origin)
        for key, size in zip(node.outputs, sizes):
            rules.derive(key, [int(size) if i == axis else d for i, d in enumerate(data)])
    elif any(a.name == "num_outputs" for a in node.proto.attribute):
        parts = len(node.outputs)
        rules.at_least(data[axis], parts, f"for {origin}")
        part = _divided(data[axis], parts - 1, parts)  # each but the last: the extent over the parts, rounded up
        for key in node.outputs[:-1]:
            rules.derive(key, [part if i == axis else d for i, d in enumerate(data)])
    elif sizes is None and (len(node.inputs) < 2 or node.inputs[1] is None):
        rules.multiple_of([data[axis]], [len(node.outputs)], origin)


def _gather(rules: _Rules, node: Node) -> None:
    """Constant indices on a named axis need it to hold them: index 2 (or -3) needs 3. Indices
    Range(0, d) (position ids, through Unsqueeze, Expand, Reshape or Cast) on an axis of fixed
    extent N need d to be N at most."""
    picked = _picked(rules, node)
    if picked is not None and picked[1].size:
        rules.at_least(picked[0], max(int(picked[1].max()) + 1, -int(picked[1].min())), f"for Gather {node.label!r}")
    data = rules.shape(node.inputs[0]) if len(node.inputs) == 2 else None
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if data is None or not -len(data) <= axis < len(data) or not isinstance(data[axis], int):
        return
    source = rules.index.producer_node(rules.index.values[node.inputs[1]])
    while source is not None and source.op_type in ("Unsqueeze", "Expand", "Reshape", "Cast") and source.inputs:
        source = rules.index.producer_node(rules.index.values[source.inputs[0]])
    bounds = _range_bounds(rules, source) if source is not None and source.op_type == "Range" else None
    if bounds is not None and bounds[0] == 0 and bounds[2] == 1:
        rules.at_most(bounds[1], data[axis], f"for Gather {node.label!r}")


def _slice(rules: _Rules, node: Node) -> None:
    """The sliced axes' extents; the others keep the input's (where ends computed from a Shape
    made inference give up on every axis). A named axis keeps at least one element (ONNX
    Runtime's ReduceMean of an empty slice kept the axes it reduced, and a Split after it failed)."""
    data, starts, ends = rules.shape(node.inputs[0]), _bounds(rules, node, 1, "starts"), _bounds(rules, node, 2, "ends")
    if data is None or starts is None or ends is None or len(starts) != len(ends):
        return
    axes = _ints(rules, node, 3, "axes", default=range(len(starts)))
    steps = _ints(rules, node, 4, default=[1] * len(starts))
    if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
        return
    dims = list(data)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        if not -len(dims) <= axis < len(dims):
            return
        dims[axis] = _sliced(data[axis], start, end, int(step))
        if isinstance(dims[axis], Sym):
            rules.at_least(dims[axis], 1, f"for Slice {node.label!r}")
    rules.derive(node.outputs[0], dims)


def _bounds(rules: _Rules, node: Node, position: int, attribute: str) -> Sequence[Dim] | None:
    """Slice's starts or ends: constants (input or attribute), or dimensions computed from a Shape."""
    if position < len(node.inputs) and node.inputs[position] is not None:
        return _shape_value(rules, node.inputs[position])
    return _ints(rules, node, position, attribute)


SHAPE_ARITHMETIC = frozenset({"Shape", "Identity", "Cast", "Squeeze", "Unsqueeze", "Concat", "Gather", "Slice", "Add",
                              "Sub", "Mul"})
"""The ops through which ``_shape_value`` follows a tensor of dimensions back to a Shape."""


def _shape_value(rules: _Rules, key: ValueKey | None) -> list[Dim | tuple[Dim, ...]] | None:
    """The elements of a small int tensor as dimensions: a constant's, or those a Shape gives
    (its start and end), through Identity, Cast, Squeeze, Unsqueeze, Concat, Gather of constant
    indices, Slice of constant bounds, Add or Sub of a constant (``Shape(x)[0] - 1`` is
    ``batch - 1``), and Mul (``_times``: a product of names is the tuple of its factors)."""
    constant = rules.constant(key)
    if constant is not None:
        return [int(v) for v in constant]
    node = rules.index.producer_node(rules.index.values[key]) if key is not None else None
    if node is None or node.domain != "" or node.op_type not in SHAPE_ARITHMETIC:
        return None
    op = node.op_type
    if op == "Shape":
        shape = rules.shape(node.inputs[0])
        bounds = {a.name: a.i for a in node.proto.attribute}
        return None if shape is None else list(shape[bounds.get("start", 0):bounds.get("end", len(shape))])
    if op in ("Identity", "Cast", "Squeeze", "Unsqueeze"):
        return _shape_value(rules, node.inputs[0])
    parts = [_shape_value(rules, k) for k in node.inputs]
    if any(p is None for p in parts):
        return None
    if op == "Concat":
        return [d for p in parts for d in p]
    if op == "Gather" and len(parts) == 2 and not any(a.name == "axis" and a.i for a in node.proto.attribute):
        data, indices = parts
        inside = all(isinstance(i, int) and -len(data) <= i < len(data) for i in indices)
        return [data[i] for i in indices] if inside else None
    if op == "Slice" and len(parts) in (3, 4, 5):  # a 1-D tensor: one axis, 0
        bounds = [*parts[1:], *([[0], [1]][len(parts) - 3:])]
        if all(len(b) == 1 and isinstance(b[0], int) for b in bounds) and bounds[2][0] in (0, -1) and bounds[3][0]:
            (start,), (end,), _, (step,) = bounds
            return parts[0][start:end:step]
        return None
    if op in ("Add", "Sub", "Mul") and len(parts) == 2:
        left, right = (p * len(parts[1 - i]) if len(p) == 1 else p for i, p in enumerate(parts))
        if len(left) != len(right):
            return None
        if op == "Mul":
            return [_times(a, b) for a, b in zip(left, right)]
        if op == "Sub":  # only constants are subtracted: a name's negative is no dimension
            if not all(isinstance(d, int) for d in right):
                return None
            right = [-d for d in right]
        return [_sum([a, b]) for a, b in zip(left, right)]
    return None


def _times(a: Dim | tuple[Dim, ...], b: Dim | tuple[Dim, ...]) -> Dim | tuple[Dim, ...]:
    """``a x b``: a fixed extent, a name scaled (``2 x batch``), or where several dimensions with
    names meet (or a fraction: half of ``batch x seq``), the tuple of the factors, the fixed
    ones multiplied into the last."""
    factors = _factors([a, b])
    if None in factors:
        return None
    fixed = math.prod(f for f in factors if not isinstance(f, Sym))
    if isinstance(fixed, Fraction) and fixed.denominator == 1:
        fixed = int(fixed)
    named = [f for f in factors if isinstance(f, Sym)]
    if not named or fixed == 0:
        return fixed
    if len(named) == 1 and (fixed == 1 or (named[0].affine and isinstance(fixed, int))):
        (one,) = named
        return one if fixed == 1 else Sym(one.name, one.offset * fixed, one.scale * fixed)
    return (*named, fixed) if fixed != 1 else tuple(named)


def _sliced(dim: Dim, start: Dim, end: Dim, step: int) -> Dim:
    """The extent of ``dim[start:end:step]``: exact for a fixed one; for a named one (step 1),
    ``name - start`` from a start counted from the beginning to the end, ``name - start - k``
    to an end k back from it (``-k``, or ``name - k`` computed from a Shape), and where both
    ends count from the same side (``[0:2]``, ``[-2:]``) the slice taken as fitting in the axis."""
    if (isinstance(end, Sym) and isinstance(dim, Sym) and end.affine and dim.affine
            and (end.name, end.scale) == (dim.name, dim.scale)):
        back_by = end.offset - dim.offset  # the end as counted from the axis' end
        end = TO_THE_END if back_by >= 0 else back_by
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    if isinstance(dim, int):
        return len(range(dim)[start:end:step]) if step else None
    if not isinstance(dim, Sym) or not dim.affine or step != 1:
        return None
    back = end < 0 or end >= TO_THE_END  # the end counted back from the axis' end
    stop = 0 if end >= TO_THE_END else end
    if (start < 0) == back:
        return max(0, stop - start)
    return _sum([dim, stop - start]) if start >= 0 else None


def _matmul(rules: _Rules, node: Node) -> None:
    a, b = (rules.shape(key) for key in node.inputs[:2])
    if not a or not b:
        return
    origin = f"MatMul {node.label!r}"
    rules.agree([(a[-1], b[-2] if len(b) > 1 else b[0])], origin)
    columns = _aligned([a[:-2], b[:-2]])
    rules.agree(columns, origin, broadcast=True)
    if len(a) > 1 and len(b) > 1:  # the output: the broadcast leading dimensions, a's rows, b's columns
        rules.derive(node.outputs[0], [*(_broadcast_dim(c, rules.equal_broadcasts) for c in columns), a[-2], b[-1]])


def _gemm(rules: _Rules, node: Node) -> None:
    """A's contracted dimension (its first where transA, else its second) equals B's (its second
    where transB, else its first)."""
    a, b = (rules.shape(key) for key in node.inputs[:2])
    if not a or not b or len(a) != 2 or len(b) != 2:
        return
    trans = {attr.name: attr.i for attr in node.proto.attribute if attr.name in ("transA", "transB")}
    rules.agree([(a[0 if trans.get("transA") else 1], b[1 if trans.get("transB") else 0])], f"Gemm {node.label!r}")


def _aligned(shapes: Sequence[Sequence[Dim] | None]) -> list[list[Dim]]:
    """Columns of right-aligned shapes (numpy broadcasting), each with the dims that reach it."""
    rank = max((len(s) for s in shapes if s is not None), default=0)
    return [[s[len(s) - rank + i] for s in shapes if s is not None and len(s) - rank + i >= 0]
            for i in range(rank)]


def _sum(dims: Sequence[Dim]) -> Dim:
    """Fixed extents and dimensions of at most one name added up (Concat's axis, a padded one), or None."""
    named = [d for d in dims if not isinstance(d, int)]
    total = sum(d for d in dims if isinstance(d, int))
    if not named:
        return total
    if len(named) == 1 and isinstance(named[0], Sym):  # a rounded one adds whole extents: (a + t x d) // d
        (one,) = named
        return Sym(one.name, one.offset + total * one.divisor, one.scale, one.divisor)
    if all(isinstance(d, Sym) and d.affine and d.name == named[0].name for d in named):
        return Sym(named[0].name, total + sum(d.offset for d in named), sum(d.scale for d in named))
    return None


def _written(dim: Sym) -> str:
    """A dimension as a formula of its name (``2 x a + 1``)."""
    text = f"{dim.scale} x {dim.name}" if dim.scale != 1 else dim.name
    return f"{text} + {dim.offset}" if dim.offset else text


def _ints(rules: _Rules, node: Node, position: int, attribute: str = "",
          default: Sequence[int] | None = None) -> Sequence[int] | np.ndarray | None:
    """The constant ints of input ``position`` or, in opsets before it was an input, of
    ``attribute``; ``default`` when the node has neither; None when they are not constant."""
    if position < len(node.inputs) and node.inputs[position] is not None:
        return rules.constant(node.inputs[position])
    found = next((a for a in node.proto.attribute if a.name == attribute), None)
    return list(found.ints) if found is not None else default


def _loop(rules: _Rules, node: Node) -> None:
    """A body's carried input that its carried output keeps the shape of has, at every
    iteration, its initial value's shape (a fresh name that inference gave the body's ``?``
    stands for the initial value's dimension). A Loop that runs to its constant trip count M
    (its body passes the condition on as it came) stacks M of each scan output: their first
    dimension is M."""
    bodies = rules.index.subgraphs.get(node.id)
    if not bodies:
        return
    body = rules.index.graphs[bodies[0]]
    for info, kept, initial in zip(body.proto.input[2:], body.outputs[1:], node.inputs[2:]):
        key = body.scope.get(info.name)
        shape = rules.shape(key)
        if shape is not None and shape == rules.shape(kept) and (start := rules.shape(initial)) is not None:
            rules.derive(key, start)
    trips = rules.constant(node.inputs[0] if node.inputs else None)
    graph = body.proto
    if trips is None or trips.size != 1 or len(graph.input) < 2 or not graph.output:
        return
    kept, condition = graph.input[1].name, graph.output[0].name
    if condition != kept and not any(n.op_type == "Identity" and list(n.input) == [kept] and condition in n.output
                                     for n in graph.node):
        return
    for key in node.outputs[len(node.inputs) - 2:]:
        inferred = rules.index.values[key].shape if key is not None else None
        if inferred:
            rules.derive(key, [int(trips[0]), *[None] * (len(inferred) - 1)])


_NODE_RULES: dict[str, Callable[[_Rules, Node], None]] = {
    "Reshape": _reshape, "Expand": _broadcast, "Concat": _concat, "MatMul": _matmul, "Gemm": _gemm, "Pad": _pad,
    "Slice": _slice, "Gather": _gather, "Loop": _loop, "Flatten": _flatten, "Conv": _window, "MaxPool": _window,
    "AveragePool": _window, "LpPool": _window, "Split": _split, "Tile": _tile, "If": _if, "Resize": _resize,
    "Upsample": _resize, "Range": _range, "Transpose": _transpose}


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

