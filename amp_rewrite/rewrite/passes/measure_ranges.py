"""MeasureRanges: judge the float32 model's measured value ranges, and keep float32 what does not fit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import onnx

from amp_rewrite.errors import RangeCheckFailed
from amp_rewrite.ir.graph import Value, ValueKey, node_key
from amp_rewrite.ir.measurements import Failure, StatsByKey, Table
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import value_bytes
from amp_rewrite.policy.oplists import SAME_ELEMENTS
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.measuring import Pending
from amp_rewrite.rewrite.options import MeasurementOptions
from amp_rewrite.rewrite.passes.base import Pass, PassResult
from amp_rewrite.rewrite.records import recorded_fp32

_GENERATED = "generated inputs"
_NAMED = 5
"""Values named in the warning when none could be measured."""


class MeasureRanges(Pass[Analysis]):
    """Invariant: when values were measured (on calibration data, or on generated
    inputs when the range check runs), no candidate produces or reads in low precision
    a value, in any graph, whose measured magnitude exceeds ``precision max / headroom``
    or (calibration data only) of whose nonzero elements more than ``flush_share``
    flush to zero, or (any data) of whose nonzero elements any is subnormal in the low type
    where a reader turns zero into inf or NaN (``ZERO_SINGULAR_INPUTS``: log, divisor): a
    subnormal keeps few significant bits, and rounding upstream flushes one that the float32
    run left just above the flush threshold; such nodes
    are fixed float32 (SAFETY) with the measured figure as reason. A node that the measurement
    made infer (``MEASURED_CLASSES``: a Pow) whose output was not measured is fixed float32 too;
    when nothing could be measured, such nodes are deny again, and the report says so
    prominently (``--range-check on``: an error).

    The pass judges tables (``ir.measurements.Table``) and runs nothing: its caller measures every float
    value beside the analysis (``analysis.ranges.table``; which values may run low is known only
    when the coloring is done, and measuring all of them beside the analysis costs less time than
    measuring fewer after it), and gives the pass a way to measure the watched values alone where
    that measurement failed (``analysis.ranges.measure``: a node that no watched value needs may
    be one that ONNX Runtime cannot run).

    A conversion may go on past this pass while the measurement runs (``ranges.defer``): the
    pass then leaves its values ``pending``, and ``settle`` says, given the measurement once it is
    in, whether it changes nothing (the usual case: what was converted and written stands) or the
    conversion must run again with it.
    """

    def __init__(self, options: MeasurementOptions) -> None:
        self.options = options

    def skip_reason(self, model: onnx.ModelProto) -> str | None:
        """Why the range check does not run on ``model``, if it does not: then nothing is to be
        measured for it."""
        return _skip_reason(_initializers(model), self.options, bool(self.options.calibrate))

    def run(self, analysis: Analysis) -> PassResult:
        before = analysis.coloring.changes
        notes = self._judge(analysis)
        return PassResult(analysis.coloring.changes != before, tuple(notes))

    def _judge(self, analysis: Analysis) -> list[str]:
        """Keep float32 what the measured ranges rule out; the notes for the report."""
        self._apply_record(analysis)
        options = self.options
        ranges = analysis.ranges
        calibrated = bool(options.calibrate) or ranges.measured is not None
        # a measurement started only where nothing ruled the check out (and calibrated rules out less)
        skip = None if ranges.table is not None else _skip_reason(analysis.index.initializers.values(), options,
                                                                   calibrated)
        if skip:
            analysis.range_check = f"skipped: {skip}"
            return []
        watched = self._watched(analysis)
        if not watched:
            analysis.range_check = "skipped: no value could change precision"
            return []
        source = _source(options, calibrated)
        measured: StatsByKey | dict | None = ranges.measured
        sources = None
        notes: list[str] = []
        if measured is None:
            sources = {v.key: found for v in watched if (found := _same_elements_source(analysis, v)) != v.key}
            if ranges.defer and ranges.table is not None:
                analysis.pending = Pending(watched, sources, calibrated, source, options)
                analysis.range_check = "pending"
                return []
            table = _measure(analysis, watched, sources)
            if (failure := table.failure) is not None:  # a model ORT can't run is still converted, and says so loudly
                refusal = RangeCheckFailed(failure.reason, None if failure.inputs else source)  # inputs: never made
                if source != _GENERATED or options.shapes or options.range_check == "on":
                    raise refusal from None
                return self._not_measured(analysis, watched, refusal.on(source), failure)
            notes.extend(_described(table))
            measured = table.stats
        count, verdicts = _judged(analysis, options, watched, sources, measured, calibrated, source)
        for value, reason in verdicts:
            for node_id in _touching(analysis, value):
                if analysis.coloring.fix(node_id, Color.FP32, reason, Priority.SAFETY):
                    key = node_key(analysis.index.nodes[node_id])
                    if key:
                        analysis.measured_fp32.setdefault(key, reason)
        analysis.range_check = _measured_line(analysis, count, source, len(verdicts))
        return notes

    @staticmethod
    def settle(analysis: Analysis, found: Table | None) -> bool:
        """Whether ``found``, the measurement that the ``pending`` values waited for, changes
        nothing: then the report says what it measured. False where it would keep a node float32,
        or did not run (None, or a failure: the watched values are then measured on their own):
        convert again."""
        pending, analysis.pending = analysis.pending, None
        assert pending is not None  # ``run`` left them pending
        if found is None or found.failure is not None:
            return False
        count, verdicts = _judged(analysis, pending.options, pending.watched, pending.sources, found.stats,
                                  pending.calibrated, pending.source)
        if verdicts:
            return False
        analysis.notes.extend(_described(found))
        analysis.range_check = _measured_line(analysis, count, pending.source, 0)
        return True

    def _not_measured(self, analysis: Analysis, watched: list[Value], why: str, failure: Failure) -> list[str]:
        """The measured-infer nodes deny again, as without a measurement; the warning to report."""
        for node_id in {v.producer[0] for v in watched if v.producer is not None and _lifted_producer(analysis, v)}:
            analysis.deny(node_id, "the range check measured nothing")
        names = ", ".join(repr(v.name) for v in watched[:_NAMED])
        more = f" and {len(watched) - _NAMED} more" if len(watched) > _NAMED else ""
        analysis.range_check = f"NOT RUN: {why}"
        advice = _advice(analysis, failure)
        return [f"warning: NO RANGE WAS MEASURED: {why}. {len(watched)} values that may run in "
                f"{analysis.precision.value} were not checked for overflow ({names}{more}). {advice}, "
                f"or --range-check on to make this an error."]

    def _apply_record(self, analysis: Analysis) -> None:
        kept = recorded_fp32(analysis.index.model)
        if not kept:
            return
        for node_id in analysis.slots:
            key = node_key(analysis.index.nodes[node_id])
            reason = kept.get(key)
            if reason and analysis.coloring.fix(node_id, Color.FP32, f"recorded by an earlier run: {reason}",
                                                Priority.SAFETY):
                analysis.measured_fp32[key] = reason

    def _watched(self, analysis: Analysis) -> list[Value]:
        """Values computed by a node and touched by a node that may run low, in every graph."""
        seen: dict[ValueKey, Value] = {}
        nodes, value_of, decisions = analysis.index.nodes, analysis.index.value, analysis.coloring.decisions
        for node_id, slots in analysis.slots.items():
            decision = decisions.get(node_id)
            if decision is not None and decision.color is Color.FP32:
                continue
            node = nodes[node_id]
            for keys, at in ((node.inputs, slots.inputs), (node.outputs, slots.outputs)):
                for i in at:
                    key = keys[i]
                    if key not in seen and (value := value_of(key)).producer is not None:
                        seen[value.key] = value
        return list(seen.values())


def _skip_reason(weights: Iterable[onnx.TensorProto], options: MeasurementOptions, calibrated: bool) -> str | None:
    """Why the range check does not run, if it does not (``weights``: every initializer, read
    only when their size decides)."""
    if options.precision is Precision.BFLOAT16:
        return "bfloat16 has float32's range"
    if calibrated:
        return None
    if options.range_check == "off":
        return "range_check=off"
    weight_bytes = sum(value_bytes(t) for t in weights)
    if options.range_check == "auto" and weight_bytes > options.range_check_max_bytes:
        return (f"weights of {weight_bytes / 2**30:.1f} GiB exceed range_check_max_bytes "
                f"({options.range_check_max_bytes / 2**30:.1f} GiB); use range_check=on")
    return None


def _judged(analysis: Analysis, options: MeasurementOptions, watched: list[Value],
            sources: Mapping[ValueKey, ValueKey] | None, measured: StatsByKey, calibrated: bool,
            source: str) -> tuple[int, list[tuple[Value, str]]]:
    """How many watched values were measured (``sources``: the key each one's statistics are
    under, ``_same_elements_source``, where it is not its own; None: all their own), and those
    that must stay float32, each with the measured reason: one pass over them."""
    limit = analysis.precision.max / options.headroom
    count, verdicts = 0, []
    for value in watched:
        stats = measured.get(value.key if sources is None else sources.get(value.key, value.key))
        if stats is None:
            if (unmeasured := _lifted_producer(analysis, value)) is not None:
                verdicts.append((value, f"value {value.name!r} of {unmeasured} was not measured on {source}"))
            continue
        count += 1
        if stats.max_abs <= limit and not stats.subnormal:  # the commonest (``small`` counts among subnormal)
            continue
        if stats.max_abs > limit:
            verdicts.append((value, f"value {value.name!r} reached {stats.max_abs:.3g} on {source}, beyond "
                                    f"{limit:.4g} ({analysis.precision.value} max / headroom {options.headroom:g})"))
        elif calibrated and stats.small_share > options.flush_share:
            verdicts.append((value, f"value {value.name!r}: {stats.small_share:.0%} of its nonzero elements on "
                                    f"{source} flush to zero in {analysis.precision.value} "
                                    f"(flush_share {options.flush_share:g})"))
        elif singular := _zero_singular_reader(analysis, value):
            verdicts.append((value, f"value {value.name!r}: {stats.subnormal} nonzero elements on {source} are "
                                    f"subnormal in {analysis.precision.value} (below "
                                    f"{analysis.precision.smallest_normal:.3g}; {stats.small} flush to zero), "
                                    f"and {singular} turns a zero into inf or NaN"))
    return count, verdicts


def _lifted_producer(analysis: Analysis, value: Value) -> str | None:
    """The op and name (``Pow '/Pow_4'``) of the node that computes ``value`` where the range
    check's measurement made it infer (``MEASURED_CLASSES``), so it may run low only as measured."""
    if value.producer is None or not analysis.measured_infer(value.producer[0]):
        return None
    node = analysis.index.nodes[value.producer[0]]
    return f"{node.op_type} {node.label!r}"


def _measured_line(analysis: Analysis, count: int, source: str, over: int) -> str:
    return f"measured {count} values on {source}; {over} do not fit {analysis.precision.value}"


def _touching(analysis: Analysis, value: Value) -> list[int]:
    nodes = [n for n, _ in analysis.slot_readers(value)]
    producer = value.producer
    if producer and producer[0] in analysis.slots and producer[1] in analysis.slots[producer[0]].outputs:
        nodes.append(producer[0])
    return nodes


def _advice(analysis: Analysis, failure: Failure) -> str:
    """What makes a range check run that did not: inputs the model accepts, or, below the
    opsets ONNX Runtime has kernels for, a model that ``onnx.version_converter`` could not upgrade
    (``failure.opset_floor``), upgraded by hand."""
    opset, floor = analysis.index.opsets.get(""), failure.opset_floor
    if opset is not None and floor is not None and opset < floor:
        return (f"ONNX Runtime runs opset {floor} and later, and onnx.version_converter "
                f"could not upgrade this model from opset {opset}: replace the ops it cannot adapt")
    return "Pass inputs the model accepts (--inputs S.npz or --shape NAME:DIMS)"


def _measure(analysis: Analysis, watched: list[Value], sources: dict[ValueKey, ValueKey]) -> Table:
    """The table of the watched values' sources (``sources``: their ``_same_elements_source``
    where it is another value), by source: from the measurement of every value the caller made,
    or where it failed (or was not made), measured now (``ranges.measure``); or why they could not
    be measured."""
    ranges = analysis.ranges
    found = ranges.table() if ranges.table is not None else None
    if found is None:
        assert ranges.measure is not None, "a range check that runs is handed a way to measure"
        found = ranges.measure(analysis.index.model, sorted({sources.get(v.key, v.key) for v in watched}))
    return found


def _described(found: Table) -> list[str]:
    """The report's notes on a measurement: the inputs it ran on, and where it ran."""
    notes = []
    if description := found.description:
        notes.append(f"range check on generated inputs: {description}")
    if why := found.in_process:
        notes.append(f"note: the range check ran in this process ({why}); a crash in ONNX Runtime would have ended it")
    return notes


def _initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    return (t for graph in iter_graphs(model.graph) for t in graph.initializer)


def _same_elements_source(analysis: Analysis, value: Value) -> ValueKey:
    """The value whose measurement stands for ``value``: up the chain of top-level reshapes and
    transposes (``SAME_ELEMENTS``) to the first value something else computes."""
    while value.key[0] == 0 and value.producer is not None:  # (a watched value, and its sources, are computed)
        node = analysis.index.nodes[value.producer[0]]
        if (node.domain, node.op_type) not in SAME_ELEMENTS:  # the index spells the default domain ""
            break
        source = analysis.index.values.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
        if source is None or source.key[0] != 0 or source.producer is None:
            break
        value = source
    return value.key


def _zero_singular_reader(analysis: Analysis, value: Value) -> str | None:
    """The first node that reads ``value`` where a zero gives inf or NaN (``ZERO_SINGULAR_INPUTS``)."""
    for node_id, slot in value.uses:
        if analysis.zero_singular(node_id, slot):
            node = analysis.index.nodes[node_id]
            return f"{node.op_type} {node.label!r}"
    return None


CALIBRATION_DATA = "calibration data"


def _source(options: MeasurementOptions, calibrated: bool) -> str:
    if calibrated:
        return CALIBRATION_DATA
    return "the given inputs" if options.inputs else _GENERATED
