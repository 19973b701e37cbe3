"""Convert, check, and keep in float32 what localization blames, until the check passes.

The float32 model runs once per sample, with every value instrumented: its
statistics calibrate the first conversion (values that overflow or flush to
zero stay float32) and its top-level values are the reference for localization.
Each round then converts, runs the emulated mixed model once per sample, and
if an output is out of tolerance keeps the nodes ``localize`` blames (those that
introduced NaN/Inf, else the few that grew the error most) in float32. Runs
grow with the number of rounds, not with the size of the model.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field, replace

import onnx

from amp_rewrite.errors import printable_lines
from amp_rewrite.inputs import samples
from amp_rewrite.ir import io
from amp_rewrite.ir.measurements import Thresholds
from amp_rewrite.ir.tensors import SOURCE_TYPE_KEY
from amp_rewrite.numerics.check import (
    DEFAULT_PROVIDER,
    UNOPTIMIZED,
    OutputCheck,
    blame,
    compare_outputs,
    culprits,
    judged_as_deployed,
    run_model,
)
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes.insert_casts import RewriteStats
from amp_rewrite.rewrite.pipeline import rewrite
from amp_rewrite.runtime import expose
from amp_rewrite.workflows.analyze import range_check


@dataclass
class Validation:
    passed: bool
    rounds: int
    runs: int
    sessions: int
    kept_fp32: dict[str, str] = field(default_factory=dict)
    """Nodes that validation moved to float32, with the evidence."""
    outputs: list[OutputCheck] = field(default_factory=list)
    deployed: str = "not run"
    """The last round's run as deployed (``numerics.check.judged_as_deployed``): ``compared``,
    ``did not run: ...``, ``refused: ...``, or ``not run`` (the emulated run failed)."""
    stopped: str = ""
    """Why the rounds ended short of passing where localization had nothing more to keep float32."""

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"validation {verdict} after {self.rounds} round{'s' if self.rounds != 1 else ''}: {self.runs} "
                 f"model runs in {self.sessions} sessions; {len(self.kept_fp32)} nodes moved to float32"]
        lines += [f"  kept float32: {node}: {why}" for node, why in self.kept_fp32.items()]
        lines += [f"  output {o.name}: rel L2 {o.errors.rel_l2:.3g}, max abs {o.errors.max_abs:.3g}"
                  f"{'' if o.passed else ' (out of tolerance)'}{f' ({o.run})' if o.run != UNOPTIMIZED else ''}"
                  for o in self.outputs]
        if self.deployed not in ("compared", "not run"):
            lines.append(f"  as deployed: {self.deployed}")
        if self.stopped:
            lines.append(f"  {self.stopped}")
        return printable_lines(lines)


def convert_validated(proto: onnx.ModelProto, options: ConvertOptions,
                      base_dir: str | None) -> tuple[onnx.ModelProto, Analysis, RewriteStats, Validation]:
    """Rounds of conversion (``rewrite`` of a copy, calibrated by the float32 run) until the check passes."""
    checking, calibration = options.validation, options.measurement.calibrate
    data = samples.resolve(checking.validate, proto)
    if calibration:
        data += samples.resolve(calibration, proto)
    watched = expose.float_values(proto)
    reference = run_model(proto, base_dir, DEFAULT_PROVIDER, data, watch=watched,
                          thresholds=Thresholds.of(checking.precision), what="float32 model")
    expected, measured = reference.results, reference.measured
    top = [key for key in watched if key[0] == 0]
    validation = Validation(False, 0, len(data), 1)
    kept: dict[str, str] = {}
    while True:
        validation.rounds += 1
        round_options = replace(options, keep_fp32_nodes=[*options.keep_fp32_nodes, *map(re.escape, kept)])
        mixed = onnx.ModelProto()
        mixed.CopyFrom(proto)
        with range_check(mixed, round_options, base_dir, measured) as (judged, _):
            analysis, stats = rewrite(mixed, round_options, base_dir, ranges=judged)
        with tempfile.TemporaryDirectory(prefix="amp-rewrite-") as scratch:
            runnable, runnable_dir = _runnable(mixed, base_dir, scratch)
            observed = run_model(runnable, runnable_dir, DEFAULT_PROVIDER, data, emulate=True, watch=top,
                                 what="mixed model").results
            validation.runs += len(data)
            validation.sessions += 1
            validation.outputs = compare_outputs(expected, observed, [o.name for o in mixed.graph.output],
                                                 checking.tolerance, checking.tolerances)
            if all(o.passed for o in validation.outputs):  # the last round: judged as deployed too
                validation.outputs, validation.deployed, runs = judged_as_deployed(
                    validation.outputs, runnable, runnable_dir, DEFAULT_PROVIDER, data, expected, checking.tolerance,
                    checking.tolerances, (proto, base_dir))
                validation.runs += runs
                validation.sessions += runs // len(data)
        validation.passed = all(o.passed for o in validation.outputs)
        if validation.passed or validation.rounds >= checking.max_rounds or validation.deployed != "not run":
            break  # what fails only as deployed, localization on the emulated run cannot blame
        found = blame(validation.outputs, mixed, expected, observed)
        blamed = [s for s in culprits(found.suspects) if s.node not in kept]
        if not blamed:
            validation.stopped = found.diffuse() or "localization blames only nodes already kept float32"
            break
        kept.update((s.node, s.evidence) for s in blamed)
    validation.kept_fp32 = kept
    return mixed, analysis, stats, validation


def _runnable(mixed: onnx.ModelProto, base_dir: str | None, scratch: str) -> tuple[onnx.ModelProto, str | None]:
    """The mixed model as ONNX Runtime can read it: external tensors still in float32 bytes
    (converted only when saved) are written out converted first."""
    pending = any(e.key == SOURCE_TYPE_KEY for t in io.initializers(mixed) for e in t.external_data)
    if not pending:
        return mixed, base_dir
    copy = onnx.ModelProto()
    copy.CopyFrom(mixed)
    path = os.path.join(scratch, "mixed.onnx")
    io.save(copy, path, base_dir)
    return io.load(path), scratch
