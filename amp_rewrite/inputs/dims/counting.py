"""``Solver``: the bindings (``Bindings``) and the counting that the rules call: dimensions that
must agree, element counts that two shapes share, sums that meet a fixed extent, and the
multiples that a Reshape's -1 needs.

A count solves for the one input name left unknown in it, offset or repeated too
(``(batch + 1) x batch = 12``). When guessing, a count that several names share goes to the
last of them that appears once (the one that needs most), the others 1 (marked "guessed"; a
second guess, ``guess=2``, gives them 2 where the count allows it; where that breaks another
count of the same names, a lone other name takes the first extent that keeps them all), or the
least their readers need (``Bindings.at_least``). A count need only be a multiple where a
Reshape has a -1: that guesses last (``multiple_of``), once every exact count has had its
guess. A count that fresh names of inference's share solves for nothing (``inputs_only``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction

from amp_rewrite.inputs.dims.bindings import MAX_SEARCHED, Bindings, consistent
from amp_rewrite.inputs.dims.symbols import GUESSED, Dim, Sym, solutions


class Solver(Bindings):
    """The bindings, with the counts that the rules find: what each rule is given."""

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
                bound = {e for d, e in zip(column, extents) if isinstance(d, Sym) and d.name in self.pins
                         and isinstance(e, int)}  # a bound name's dimension is a fixed extent
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
        fixed = [f for f in factors if isinstance(f, int)]
        if len(fixed) == len(factors) and math.prod(fixed) > 1:
            self.divisible.add((tuple(spread), math.prod(fixed)))
        if (not self.multiples or None in extents or len(fixed) != len(factors)
                or any(isinstance(e, Fraction) for e in extents)):
            return
        needed = math.prod(fixed)
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
                if consistent(self, {**at, last: fit}):
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
            if isinstance(d, Sym) and isinstance(self.extent(d), Sym):
                factors.setdefault(d.name, []).append(d)
        if not factors or (len(factors) > 1 and not self.guess):
            return
        least = {name: max(self.least.get(name, 1), *(d.reaching(1) for d in dims)) for name, dims in factors.items()}
        *others, last = sorted(factors, key=lambda name: (len(factors[name]) == 1, least[name]))
        for at in ({name: max(self.guess, least[name]) for name in others}, {name: least[name] for name in others}):
            rest = left - sum(d.at(at[name]) for name in others for d in factors[name])
            extent, remainder = divmod(rest - sum(d.offset for d in factors[last]),
                                       sum(d.scale for d in factors[last]))
            if not remainder and extent >= least[last] and consistent(self, {**at, last: extent}):
                self.split([Sym(name) for name in (*others, last)], extent, origin, others=at)
                return

    def same_count(self, left: Sequence[Dim], right: Sequence[Dim], origin: str) -> None:
        """``left`` and ``right`` hold as many elements: solve for the one name left unknown
        (where it appears more than once too: batch x (batch + 1) = 12; a product shifted or
        scaled, 1 + batch x seq after a Concat with one element, against a fixed count too)."""
        for one, other in ((left, right), (right, left)):
            dims = [self.resolved(d) for d in one]
            not_fixed = [d for d in dims if not isinstance(d, int)]
            dim: Dim = not_fixed[0] if len(not_fixed) == 1 else None
            if isinstance(dim, Sym) and dim.name in self.products and dim.affine and dim != Sym(dim.name):
                have = math.prod(d for d in dims if isinstance(d, int))
                extents = [self.extent(d) for d in self.spread(other)]
                fixed_extents = [e for e in extents if isinstance(e, int)]
                if have and len(fixed_extents) == len(extents):
                    count, rest = divmod(math.prod(fixed_extents), have)
                    if not rest and (solved := dim.solved(count)):
                        self.same_count([Sym(dim.name)], [solved], origin)
                return
        left, right = self.spread(left), self.spread(right)
        fixed, named = [1, 1], [Counter[Sym](), Counter[Sym]()]
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
        side, factors = sides[0], dict[str, list[Sym]]()
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
            rank = (extent >= least[last], consistent(self, {**at, last: extent}),
                    all(at[name] >= least[name] for name in others))
            if best is None or rank > best:
                chosen, best = (at, extent), rank
            if all(rank):
                break
        if chosen is not None:
            self.split([Sym(name) for name in (*others, last)], chosen[1], origin, others=chosen[0])
            for name, parts in factors.items():  # the extents that give the same factors, where they are rounded
                pin = self.pins.get(name)
                if pin is not None and not all(d.affine for d in parts):
                    same = set.intersection(*(set(d.solutions(d.at(pin.extent))) for d in parts))
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
                yield from ((at, extent) for extent in solutions(factors[last], wanted))
