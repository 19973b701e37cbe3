"""A dimension's form (``Sym``), a name's binding (``Pin``), and their arithmetic.

A dimension is a fixed extent or a name times a scale plus an offset, divided and rounded down
(``batch + 1``, ``2 x batch``, ``(height - 1) // 2``): Pad with constant pads (its axes input
too, which inference does not follow), Slice with constant starts and ends (``[1:]`` is
``batch - 1``) or ends computed from a Shape (``x[:Shape(x)[0] - 1]``, where inference gives up
on every axis), Concat of a named extent with fixed ones or with itself, and Conv and the pools
(kernel, stride, dilation, pads, auto_pad; ceil_mode where it cannot drop a last window) give
such dimensions, and a fresh name that inference gave in their place stands for them wherever
it reaches. The helpers here compute with dimensions alone (they read no graph): where a result
has no such form they give None, or the tuple of its factors where several names multiply.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction


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
TO_THE_END = 2**31 - 1
"""A Slice end at least this large reaches the end of any axis (INT32_MAX, INT64_MAX are usual)."""
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


def reaching(dims: Sequence[Sym], count: int) -> int:
    """The least extent of the name that ``dims`` share at which their product is ``count`` or
    more (a binary search: the product grows with the name)."""
    low = max(1, *(d.reaching(1) for d in dims))
    high = max(low, *(d.reaching(count) for d in dims))  # each factor alone reaches count there
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if math.prod(d.at(middle) for d in dims) < count else (low, middle)
    return low


def solutions(dims: Sequence[Sym], count: int) -> Iterator[int]:
    """The extents of the name that ``dims`` share at which their product is ``count``, least
    first (on from ``reaching`` while it holds: a rounded dimension holds over several)."""
    extent = reaching(dims, count)
    while math.prod(d.at(extent) for d in dims) == count:
        yield extent
        extent += 1


def factors_of(dims: Sequence[Dim | tuple[Dim, ...]]) -> list[Dim]:
    """``dims`` with each product (a tuple of its factors, as ``shape_value`` gives it) spread out."""
    return [f for d in dims for f in (d if isinstance(d, tuple) else (d,))]


def multiplied(a: Dim | tuple[Dim, ...], b: Dim | tuple[Dim, ...]) -> Dim | tuple[Dim, ...]:
    """``a x b``: a fixed extent, a name scaled (``2 x batch``), or where several dimensions with
    names meet (or a fraction: half of ``batch x seq``), the tuple of the factors, the fixed
    ones multiplied into the last."""
    factors = factors_of([a, b])
    if None in factors:
        return None
    fixed = math.prod(f for f in factors if f is not None and not isinstance(f, Sym))
    if isinstance(fixed, Fraction) and fixed.denominator == 1:
        fixed = int(fixed)
    named = [f for f in factors if isinstance(f, Sym)]
    if not named or fixed == 0:
        return fixed
    if len(named) == 1 and (fixed == 1 or (named[0].affine and isinstance(fixed, int))):
        (one,) = named
        return one if fixed == 1 else Sym(one.name, one.offset * fixed, one.scale * fixed)
    return (*named, fixed) if fixed != 1 else tuple(named)


def summed(dims: Sequence[Dim | tuple[Dim, ...]]) -> Dim:
    """Fixed extents and dimensions of at most one name added up (Concat's axis, a padded one), or
    None (where a product is among them too)."""
    named = [d for d in dims if not isinstance(d, int)]
    total = sum(d for d in dims if isinstance(d, int))
    if not named:
        return total
    if len(named) == 1 and isinstance(one := named[0], Sym):  # a rounded one adds whole extents: (a + t x d) // d
        return Sym(one.name, one.offset + total * one.divisor, one.scale, one.divisor)
    syms = [d for d in named if isinstance(d, Sym)]
    if len(syms) == len(named) and all(d.affine and d.name == syms[0].name for d in syms):
        return Sym(syms[0].name, total + sum(d.offset for d in syms), sum(d.scale for d in syms))
    return None


def divided(dim: Dim, add: int, divisor: int) -> Dim:
    """``(dim + add) // divisor``."""
    if isinstance(dim, int):
        return (dim + add) // divisor
    if isinstance(dim, Sym):
        return Sym(dim.name, dim.offset + add * dim.divisor, dim.scale, dim.divisor * divisor)
    return None


def sliced(dim: Dim, start: Dim, end: Dim, step: int) -> Dim:
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
    return summed([dim, stop - start]) if start >= 0 else None


def written(dim: Sym) -> str:
    """A dimension as a formula of its name (``2 x a + 1``)."""
    text = f"{dim.scale} x {dim.name}" if dim.scale != 1 else dim.name
    return f"{text} + {dim.offset}" if dim.offset else text
