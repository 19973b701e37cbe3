"""What the range check (``MeasureRanges``) is given to judge: measurements, as data. The rewrite
runs nothing: a ``Meter`` (``runtime.ranges.Meter``, which these describe) measures the model,
and the callers above both layers (``workflows``, ``training``) hand the pipeline one, as
calibration hands a quantizer its table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import onnx

from amp_rewrite.ir.graph import Value, ValueKey
from amp_rewrite.rewrite.options import MeasurementOptions


class Stats(Protocol):
    """What a run showed of one float value (``expose.ValueStats``)."""

    @property
    def max_abs(self) -> float: ...
    @property
    def small(self) -> int: ...
    @property
    def subnormal(self) -> int: ...
    @property
    def small_share(self) -> float: ...


class StatsByKey(Protocol):
    """Statistics by value key, read with ``get``."""

    def get(self, key: ValueKey, /) -> Stats | None: ...


class Failure(Protocol):
    """Why a measurement found nothing (``ranges.Failure``)."""

    @property
    def reason(self) -> str: ...
    @property
    def inputs(self) -> bool:
        """Whether the data could not be made: ``reason`` is then the error itself."""
    @property
    def opset_floor(self) -> int | None:
        """ONNX Runtime's oldest opset where the model stays as it is: below it, not upgradable."""


class Table(Protocol):
    """What a measurement found (``ranges.Table``): the extents generated inputs took, the
    statistics by key, why it ran in this process if it did; or why it found nothing."""

    @property
    def description(self) -> str: ...
    @property
    def stats(self) -> StatsByKey: ...
    @property
    def in_process(self) -> str | None: ...
    @property
    def failure(self) -> Failure | None: ...


class Measurement(Protocol):
    """A measurement of every float value, started beside the analysis (``ranges.Measurement``)."""

    def result(self) -> Table | None:
        """The table (or, for a hang, one that says so), or None where the values a caller
        watches should be measured on their own."""

    def close(self) -> None: ...


class Meter(Protocol):
    """Measures a model's values on the data it was made for (``ranges.Meter``)."""

    def start(self, model: onnx.ModelProto) -> Measurement | None:
        """Every float value, measured beside the caller (None where no child can be had)."""

    def measure(self, model: onnx.ModelProto, keys: list[ValueKey]) -> Table:
        """``keys``, measured now."""


@dataclass(frozen=True)
class Pending:
    """The values MeasureRanges left for ``settle``, and how they are measured."""

    watched: list[Value]
    sources: dict[ValueKey, ValueKey]
    """The ``_same_elements_source`` of each watched value whose statistics stand under another's
    key (the others' stand under their own, which a dict of every watched value would repeat)."""
    calibrated: bool
    source: str
    """What the values are measured on (the report's words)."""
    options: MeasurementOptions
    """The thresholds the values are judged by."""
