"""``Bindings``: what the rules share (the inferred shapes, constants, and the bindings found so
far), and how a name is bound.

The first binding found for a name wins (``pin``). A rounded dimension binds its name to a
range of extents (a Conv of stride 2 gives 28 from 55 and 56): where the bindings break a
count, the names move within their ranges to extents that keep them all (``settle``). What a
binding or a guess must keep is checked in one place (``consistent``): every count that two
shapes share, every total a sum met, every multiple a Reshape's -1 needs, every name's
greatest extent. A name's least extent (``at_least``) is what its readers need (a Gather of
index 2 on its axis needs 3, a reflect Pad of 1 needs 2, three MaxPools of stride 2 need 15):
what a guess gives a name at the least, and what a name that nothing binds takes. The counts
themselves, and the guesses that split them, are ``counting``'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import numpy as np
import onnx
from onnx import numpy_helper

from amp_rewrite.inputs.dims.symbols import GUESSED, Dim, Pin, Sym, reaching, summed, written
from amp_rewrite.ir.graph import ModelIndex, ValueKey
from amp_rewrite.ir.tensors import constant_tensor

MAX_SEARCHED = 4096
"""The largest extent a guess tries for a name beside the one a count solves for."""


class Bindings:
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
        if producer is None or value.producer is None or producer.op_type != "Loop" or producer.domain != "":
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
        if isinstance(dim, Sym) and (pin := self.pins.get(dim.name)):
            return dim.at(pin.extent)
        return dim

    def pin(self, dim: Sym, extent: int, origin: str) -> None:
        """Bind ``dim``'s name so that ``dim`` is ``extent``: of the extents that give it (several
        where it is rounded), the first that keeps every count and the least its readers need
        (``least``), else the first that keeps every count, else the least."""
        if dim.name not in self.names or dim.name in self.pins:
            return
        solutions = [e for e in dim.solutions(extent) if e >= 1]
        if solutions:
            least = self.least.get(dim.name, 1)
            chosen = max(solutions, key=lambda e: (consistent(self, {dim.name: e}), e >= least))  # the first best
            self.pins[dim.name] = Pin(chosen, origin)
            if len(solutions) > 1:
                self.ranges[dim.name] = solutions

    def settle(self) -> bool:
        """Where the bindings break a count: the extents, in the ranges that rounded dimensions
        left their names (``ranges``), that keep every count (the first of at most MAX_SEARCHED).
        Whether a binding moved."""
        if not self.ranges or consistent(self, {}):
            return False
        names = list(self.ranges)
        for extents in itertools.islice(itertools.product(*self.ranges.values()), MAX_SEARCHED):
            if consistent(self, dict(zip(names, extents))):
                moved = any(self.pins[name].extent != extent for name, extent in zip(names, extents))
                for name, extent in zip(names, extents):
                    self.pins[name] = Pin(extent, self.pins[name].origin)
                return moved
        return False

    def group(self, name: str) -> str:
        """The name that stands for ``name``'s group of names broadcast together (``together``)."""
        while name in self.together:
            name = self.together[name]
        return name

    def sum_of(self, dims: Sequence[Dim]) -> Dim:
        """``dims`` added up: one dimension where they name at most one name (``summed``), else a
        name standing for their sum (``sums``), where each is a fixed extent or a name's, unrounded."""
        total = summed(dims)
        if total is not None or not all(isinstance(d, int) or (isinstance(d, Sym) and d.affine) for d in dims):
            return total
        name = "(" + " + ".join(written(d) if isinstance(d, Sym) else str(d) for d in dims) + ")"
        self.sums.setdefault(name, tuple(dims))
        return Sym(name)

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
            have = math.prod(d.at(self.least.get(d.name, 1)) if isinstance(d, Sym) else d
                             for d in extents if d is not None and (not isinstance(d, Sym) or d.name != last))
            least = self.least.get(last, 1)
            if have > 0 and least < MAX_SEARCHED:
                needed = reaching([d for d in unknown if d.name == last], -(-extent // have))
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


def consistent(bindings: Bindings, extents: Mapping[str, int]) -> bool:
    """Whether the names at ``extents`` (and those ``bindings`` bound) keep every count the shapes share
    (or leave it one input name, once, that some extent solves it for), and every multiple
    that a Reshape's -1 needs (``divisible``)."""
    known = {**{name: pin.extent for name, pin in bindings.pins.items()}, **extents}

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
        if len(unknown) != 1:
            return True
        side, dim = unknown[0]
        if not isinstance(dim, Sym) or dim != Sym(dim.name) or dim.name not in bindings.names:
            return True
        mine, other = count([d for d in sides[side] if d is not dim]), count(sides[1 - side])
        assert other is not None  # the one dimension left unknown is on this side
        needed = other / mine if mine else Fraction(1)
        return needed.denominator == 1 and needed >= 1

    if any(known[name] > most for name, most in bindings.most.items() if name in known):
        return False
    for terms, total in bindings.totals:
        added = [c for d in terms if (c := count([d])) is not None]
        if len(added) == len(terms) and sum(added) != total:
            return False
    for left, right in bindings.counts:
        counted = count(left), count(right)
        if None not in counted and counted[0] != counted[1]:
            return False
        if not solvable((left, right)):
            return False
    return all(counted is None or not counted % needed
               for counted, needed in ((count(dims), needed) for dims, needed in bindings.divisible))
