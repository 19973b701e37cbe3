"""Measurements of a model's values, as data: what a run showed of each float value
(``ValueStats``, by value key: ``StatsByKey``, packed for the trip between processes:
``PackedStats``) against a low type's ``Thresholds``, and a measurement's ``Table``, or why it found
nothing (``Failure``). ``runtime`` makes them (it runs the model), the rewrite's range check judges
them (it runs nothing): both read them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from amp_rewrite.ir.graph import ValueKey
from amp_rewrite.ir.precision import Precision


@dataclass(frozen=True)
class Thresholds:
    """The magnitudes below which statistics count nonzero elements: ``flush`` (they become
    zero in the low type) and ``normal`` (the low type's smallest normal: below it a value
    keeps fewer significant bits, and rounding upstream can flush it)."""

    flush: float
    normal: float

    @classmethod
    def of(cls, precision: Precision) -> Thresholds:
        return cls(precision.flush_below, precision.smallest_normal)


class ValueStats(NamedTuple):
    """What a run showed of one float value. A tuple: a measurement's statistics of every value
    cross from the measuring child to the caller pickled, and tuples pickle and load faster than
    frozen dataclasses."""

    max_abs: float
    nonzero: int
    small: int
    """Nonzero elements with magnitude below ``Thresholds.flush``."""
    subnormal: int
    """Nonzero elements with magnitude below ``Thresholds.normal`` (``small`` among them)."""

    @classmethod
    def of(cls, array: np.ndarray, thresholds: Thresholds) -> ValueStats:
        """Over the finite elements: a -inf mask value overflows nothing."""
        magnitude = np.abs(np.asarray(array, dtype=np.float32)).ravel()
        peak = float(magnitude.max()) if magnitude.size else 0.0
        if peak < np.inf:  # the common case: no inf or NaN (a NaN peak compares false too)
            below_normal = int(np.count_nonzero(magnitude < thresholds.normal))
            if not below_normal:  # the commonest: no zero, nothing small
                return cls(peak, magnitude.size, 0, 0)
            nonzero = int(np.count_nonzero(magnitude))
            zeros = magnitude.size - nonzero
            subnormal = below_normal - zeros
            small = int(np.count_nonzero(magnitude < thresholds.flush)) - zeros if subnormal else 0
            return cls(peak, nonzero, small, subnormal)
        finite = magnitude[np.isfinite(magnitude)]
        peak = float(finite.max()) if finite.size else 0.0  # all -inf (a mask's fill): float16 holds it
        positive = finite[finite > 0]
        return cls(peak, int(positive.size), int(np.count_nonzero(positive < thresholds.flush)),
                   int(np.count_nonzero(positive < thresholds.normal)))

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> ValueStats:
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        if not rows.size:
            return cls(0.0, 0, 0, 0)
        return cls(float(rows[:, 0].max()), *(int(count) for count in rows[:, 1:].sum(axis=0)))

    def merged(self, other: ValueStats) -> ValueStats:
        return ValueStats(max(self.max_abs, other.max_abs), self.nonzero + other.nonzero, self.small + other.small,
                          self.subnormal + other.subnormal)

    @property
    def small_share(self) -> float:
        return self.small / self.nonzero if self.nonzero else 0.0


class PackedStats:
    """Statistics by value key, packed for the trip from a measuring child to its caller: the
    keys, and their ``ValueStats`` as rows of one array. A dict of ValueStats, an object per value,
    would hold more memory in the caller once unpickled, at the end of a conversion (its memory
    peak), than the keys and rows with the position of each key. Read as a Mapping's ``get``."""

    def __init__(self, stats: Mapping[ValueKey, ValueStats]) -> None:
        self.keys = list(stats)
        self.rows = np.array(list(stats.values()), dtype=np.float64).reshape(-1, 4)
        self._at: dict[ValueKey, int] | None = None

    def __getstate__(self) -> tuple[list[ValueKey], np.ndarray]:
        return self.keys, self.rows

    def __setstate__(self, state: tuple[list[ValueKey], np.ndarray]) -> None:
        self.keys, self.rows = state
        self._at = None

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, key: ValueKey, default: ValueStats | None = None) -> ValueStats | None:
        if self._at is None:
            self._at = {k: i for i, k in enumerate(self.keys)}
        at = self._at.get(key)
        if at is None:
            return default
        peak, nonzero, small, subnormal = self.rows[at].tolist()
        return ValueStats(peak, int(nonzero), int(small), int(subnormal))


StatsByKey = Mapping[ValueKey, ValueStats] | PackedStats
"""Statistics by value key, as a measurement gives them: read with ``get`` (a ``PackedStats`` is no Mapping)."""


@dataclass(frozen=True)
class Failure:
    """Why a measurement found nothing, as the range check reports it."""

    reason: str
    """The error's first line (ONNX Runtime's, its first line), or where the data could not be made
    (``inputs``), the error itself."""
    inputs: bool
    """Whether the data could not be made (a ``UserError`` before any run): else ONNX Runtime
    could not run the model on them, or crashed or hung running it."""
    opset_floor: int | None
    """The oldest opset ONNX Runtime has kernels for  where
    the model is left as it is: at that opset or later, or below it where
    ``onnx.version_converter`` could not upgrade it. None where it upgraded the model."""


class Table(NamedTuple):
    """What a measurement found: the extents generated inputs took (empty for given data), and
    the statistics of each measured value by key; where it found nothing, why (``failure``)."""

    description: str
    stats: StatsByKey
    in_process: str | None = None
    """Why the measurement ran in this process (``isolate.in_process``), if it did."""
    failure: Failure | None = None
