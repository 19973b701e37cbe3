"""Where each data array holds its samples, and the batches cut from them.

Axis 0 is the sample axis unless the user says otherwise: a recurrent state shaped
[layers, batch, hidden] has it on axis 1, a sequence output with time first too. An array
named ``fixed``, and every 0-d array (a sample rate, a flag), is fed whole at every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from amp_rewrite.errors import UserError


@dataclass(frozen=True)
class Batching:
    axes: Mapping[str, int] = field(default_factory=dict)
    """The sample axis of the arrays that do not hold samples on axis 0."""
    fixed: frozenset[str] = frozenset()
    """Arrays fed whole at every step."""

    @classmethod
    def parse(cls, axes: Iterable[str], fixed: Iterable[str]) -> Batching:
        """From the command line's ``NAME:AXIS`` items and names."""
        parsed = {}
        for item in axes:
            name, _, axis = item.rpartition(":")
            try:
                parsed[name] = int(axis)
            except ValueError:
                raise UserError(f"--batch-axis takes NAME:AXIS, such as state:1; got {item!r}") from None
            if not name:
                raise UserError(f"--batch-axis takes NAME:AXIS, such as state:1; got {item!r}")
        return cls(parsed, frozenset(fixed))

    def whole(self, name: str, array: np.ndarray) -> bool:
        """Whether ``array`` is fed whole at every step."""
        return name in self.fixed or np.ndim(array) == 0

    def axis(self, name: str) -> int:
        return self.axes.get(name, 0)

    def count(self, data: Mapping[str, np.ndarray], names: Iterable[str], origin: str = "the data") -> int:
        """How many samples ``data`` holds for ``names``: every name present, the batched ones all
        of one length along their sample axes."""
        names = list(names)
        missing = [n for n in names if n not in data]
        if missing:
            raise UserError(f"{origin} has no array for {', '.join(missing)} (it has {', '.join(data) or 'none'})")
        unknown = sorted((set(self.axes) | self.fixed) - set(names))
        if unknown:
            raise UserError(f"--batch-axis/--fixed name {', '.join(unknown)}, not among the step's data "
                            f"({', '.join(names)})")
        lengths = {}
        for name in names:
            if self.whole(name, data[name]):
                continue
            axis = self.axis(name)
            if not -np.ndim(data[name]) <= axis < np.ndim(data[name]):
                raise UserError(f"{origin}: {name!r} has {np.ndim(data[name])} axes; its sample axis {axis} is not one")
            lengths[name] = np.shape(data[name])[axis]
        if not lengths:
            raise UserError(f"{origin}: every array is fed whole (--fixed, or 0-d): none holds samples")
        if len(set(lengths.values())) != 1:
            raise UserError(f"{origin}: the arrays disagree in length along their sample axes: " +
                            ", ".join(f"{n} {v}" for n, v in lengths.items()))
        return next(iter(lengths.values()))

    def take(self, data: Mapping[str, np.ndarray], names: Iterable[str], rows) -> dict[str, np.ndarray]:
        """The batch of ``rows`` (indices or a slice) of ``names``; whole arrays as they are."""
        batch = {}
        for name in names:
            array = data[name]
            if self.whole(name, array):
                batch[name] = np.asarray(array)
            elif isinstance(rows, slice):
                batch[name] = np.asarray(array[(slice(None),) * (self.axis(name) % np.ndim(array)) + (rows,)])
            else:
                batch[name] = np.take(array, rows, axis=self.axis(name))
        return batch
