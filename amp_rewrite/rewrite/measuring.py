"""What the range check (``MeasureRanges``) is given to judge: measurements, as data
(``ir.measurements``: tables of value statistics). The rewrite runs nothing: ``runtime.ranges``
measures the model, and the callers above both layers (``workflows``, ``training``) start, wait for
and close the measurement, handing the pipeline ``Ranges``, as calibration hands a quantizer its table;
what the range check leaves for them to judge later is ``Pending``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from amp_rewrite.ir.graph import Value, ValueKey
from amp_rewrite.ir.measurements import StatsByKey, Table
from amp_rewrite.rewrite.options import MeasurementOptions


@dataclass(frozen=True)
class Ranges:
    """What the range check judges, as the pipeline is handed it: data, or calls that return data
    (the pipeline waits in them; it never holds a running measurement). ``measured``: statistics of
    every float value measured ahead (a calibration, the float32 run of a validation), used as they
    are. ``table``: the table of every float value's statistics, which the caller measures beside
    the analysis (None back where the values the range check watches should be measured on their
    own). ``measure``: those values of the model analyzed, measured now. ``defer``: the range check
    leaves its values ``pending`` and the caller judges them once its measurement is in
    (``MeasureRanges.settle``), converting on meanwhile."""

    measured: StatsByKey | None = None
    table: Callable[[], Table | None] | None = None
    measure: Callable[[onnx.ModelProto, list[ValueKey]], Table] | None = None
    defer: bool = False

    @property
    def ahead(self) -> bool:
        """Whether every value is measured, or being measured, apart from what the range check watches."""
        return self.measured is not None or self.table is not None


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
