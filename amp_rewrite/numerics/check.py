"""``check``: does the mixed-precision model still compute what the float32 model computes?

Both models run on the same samples; each output is compared with its tolerance
(see ``compare``). Where the chosen provider has no low-precision kernels (the
CPU provider computes float16 nodes in float32), the mixed model is run through
``emulate`` so that its storage rounding, overflow and underflow show, and, as
deployed, once more as ONNX Runtime runs it by default (its graph optimizations on:
a fusion can change the numerics of a low-precision graph); each output is judged
by the worse of the two runs. On failure, ``localize`` ranks the nodes that made the
error grow.
"""

from __future__ import annotations

import json
import os
import shlex
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import onnx

from amp_rewrite.errors import UserError, printable, printable_lines
from amp_rewrite.inputs import samples
from amp_rewrite.inputs.samples import Sample
from amp_rewrite.ir import io
from amp_rewrite.ir.builder import LOW_TYPES
from amp_rewrite.ir.measurements import Thresholds
from amp_rewrite.ir.types import typed_index
from amp_rewrite.numerics.compare import Errors, Tolerance, errors
from amp_rewrite.numerics.localize import MIN_GROWTH, Suspect, localize
from amp_rewrite.runtime import expose, instrument
from amp_rewrite.runtime.emulate import LOW_PRECISION_PROVIDERS, emulated
from amp_rewrite.runtime.isolate import NativeFailure, isolated

DEFAULT_PROVIDER = "CPUExecutionProvider"


UNOPTIMIZED = "unoptimized"


@dataclass
class OutputCheck:
    name: str
    passed: bool
    tolerance: Tolerance
    sample: int
    """The sample shown: the first that fails, else the one with the largest relative L2 error."""
    errors: Errors
    run: str = UNOPTIMIZED
    """The run these figures come from: the mixed model's run with ONNX Runtime's graph
    optimizations off (emulated unless the provider runs float16 natively), ``as deployed``
    (DEPLOYED), or ``both deployed`` (BOTH_DEPLOYED)."""


DEPLOYED = "as deployed"
BOTH_DEPLOYED = "both deployed"
"""The run of an output that fails as deployed against the float32 model's unoptimized run and
passes against its run as deployed (``judged_as_deployed``)."""
NO_KERNEL = "Could not find an implementation for"
"""ONNX Runtime's refusal of an op that the provider has no kernel for at that type: the mixed model
may still deploy on its target provider (CUDA runs bfloat16 MatMul; the CPU provider does not)."""
DEPLOYED_OPTIMIZATION = "all"
"""ONNX Runtime's default graph optimization level: what a deployed session runs."""


@dataclass
class CheckResult:
    """Truthy when every output is within tolerance on every sample."""

    passed: bool
    mode: str
    emulated: bool
    samples: int
    outputs: list[OutputCheck]
    suspects: list[Suspect] = field(default_factory=list)
    fix: str | None = None
    """Flags that keep the suspects in float32, for ``amp-rewrite convert``."""
    unlocalized: str | None = None
    """Where localization ran and no node is to blame, why (``Blame.diffuse``)."""
    generated: str = ""
    """The extents the generated samples gave the inputs' dimension names (``samples.attempts``)."""
    runs: int = 0
    seconds: float = 0.0
    deployed: str = "off"
    """The run as deployed (``judged_as_deployed``): ``compared``, ``did not run: ...``,
    ``refused: ...``, or ``off``."""
    tolerance: str = ""
    """The default tolerance, and whether it is the mixed model's precision's (``Tolerance.describe``)."""
    notes: list[str] = field(default_factory=list)
    """What the check did to run the models (``instrument.ir_version_note``)."""

    def __bool__(self) -> bool:
        return self.passed

    @property
    def failed_outputs(self) -> list[str]:
        return [o.name for o in self.outputs if not o.passed]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=float)

    def table(self) -> str:
        both = self.deployed == "compared"
        head = ("output", "metric", "max abs", "mean abs", "max rel", "rel L2", "cosine", "new nan/inf", "top-1",
                *(("worse run",) if both else ()), "result")
        rows = [(o.name, o.tolerance.metric, *(_num(getattr(o.errors, k)) for k in
                                               ("max_abs", "mean_abs", "max_rel", "rel_l2", "cosine")),
                 str(o.errors.new_nonfinite), _num(o.errors.top1), *((o.run,) if both else ()),
                 "ok" if o.passed else f"FAIL (sample {o.sample})") for o in self.outputs]
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        lines = [f"amp-rewrite check: {'passed' if self.passed else 'FAILED'} ({self.mode}{self._deployed_text()}; "
                 f"{self.samples} sample{'s' if self.samples != 1 else ''}, {self.runs} model runs, "
                 f"{self.seconds:.1f} s)"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in (head, *rows)]
        if self.tolerance:
            lines.append(f"tolerance: {self.tolerance}")
        if self.generated:
            lines.append(f"generated inputs: {self.generated}")
        lines += [f"note: {note}" for note in self.notes]
        if not self.passed and all(o.passed or o.run == DEPLOYED for o in self.outputs) and both:
            lines.append("fails only as deployed: ONNX Runtime's graph optimizations (a fusion) change the "
                         "low-precision graph's numerics; the unoptimized graph's run passes")
        if any(o.run == BOTH_DEPLOYED for o in self.outputs):
            lines.append(f"{BOTH_DEPLOYED}: ONNX Runtime's graph optimizations change the float32 model's own "
                         "numerics (a quantized model's units fused into integer kernels); as deployed, those "
                         "outputs are compared with the float32 model as deployed")
        if self.suspects:
            lines.append("localization: nodes where the error first grows, most likely culprit first")
            lines += [f"  {i}. {s.op_type} {s.node!r}: {s.evidence}\n     ({s.op_class}; {s.reason or 'no decision'})"
                      for i, s in enumerate(self.suspects, 1)]
        if self.fix:
            lines.append(f"to keep them in float32: {self.fix}")
        if self.unlocalized:
            lines.append(self.unlocalized)
        return printable_lines(lines)

    def _deployed_text(self) -> str:
        if self.deployed == "off":
            return ""
        if self.deployed != "compared":
            return f"; as deployed: {self.deployed}"
        return ", and as deployed (ONNX Runtime's default graph optimizations)"

    def to_junit(self) -> str:
        suite = ET.Element("testsuite", name="amp-rewrite check", tests=str(len(self.outputs)),
                           failures=str(len(self.failed_outputs)), time=f"{self.seconds:.3f}")
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="mode", value=self.mode)
        for output in self.outputs:
            case = ET.SubElement(suite, "testcase", classname="amp_rewrite.check", name=printable(output.name))
            if not output.passed:
                failure = ET.SubElement(case, "failure", message=printable(_failure_message(output)))
                failure.text = json.dumps(asdict(output.errors), default=float)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True)


@dataclass
class Runs:
    """What ``run_model`` brings back: each sample's outputs (exposed values included), and
    the statistics of the watched values over all samples when thresholds were given."""

    results: list[dict[str, np.ndarray]]
    measured: dict = field(default_factory=dict)


def run_model(model: onnx.ModelProto, base_dir: str | None, provider: str, data: Sequence[Sample],
              emulate: bool = False, watch: Sequence = (), thresholds: Thresholds | None = None,
              what: str = "model", optimize: str = "none") -> Runs:
    """Run ``model`` (emulated: with low-precision storage rounding) on every sample in one
    session (with ONNX Runtime's graph optimizations at ``optimize``, none by default), in a
    child process (``isolate``): a crash of ONNX Runtime is one clear error."""
    data = [samples.checked(sample, model) for sample in data]

    def work(progress) -> Runs:
        runnable = emulated(model) if emulate else model
        exposed = expose.expose(runnable, watch, thresholds)
        with instrument.refusals(f"the {what}", provider):
            progress(f"creating the {what}'s session on {provider}")
            session = instrument.session(exposed.model, base_dir, provider, optimize=optimize)
            progress(f"running the {what} on {provider}")
            results = [instrument.run(session, sample) for sample in data]
        measured = (expose.merge(expose.measure(exposed, r, thresholds) for r in results)
                    if thresholds else {})
        return Runs(results, measured)

    return isolated(work, f"onnxruntime ({what})")


def check(original, mixed, inputs: Sequence = (), random: int | None = None,
          shapes: Mapping[str, Sequence[int]] | None = None, tolerance: Tolerance | None = None,
          tolerances: Mapping[str, Tolerance] | None = None, provider: str = DEFAULT_PROVIDER,
          emulate: bool | None = None, localize_failures: bool = False, seed: int = 0,
          deployed: bool = True) -> CheckResult:
    """Compare ``mixed`` with ``original`` (paths or ModelProtos) on ``inputs`` (.npz paths or
    dicts of arrays) and/or ``random`` generated samples (one when no inputs are given).
    ``emulate`` None emulates unless ``provider`` runs float16 natively. ``deployed``: also run
    the mixed model as ONNX Runtime runs it by default (graph optimizations on), natively."""
    started = time.perf_counter()
    original, original_dir = load_model(original)
    mixed, mixed_dir = load_model(mixed)
    given = samples.resolve(inputs, original)
    emulate = provider not in LOW_PRECISION_PROVIDERS if emulate is None else emulate
    watch = expose.float_values(original, top_level=True) if localize_failures else ()

    def reference(generated: list[Sample]) -> tuple[list[Sample], list[dict]]:
        data = given + generated
        return data, run_model(original, original_dir, provider, data, watch=watch, what="float32 model").results

    generated, (data, expected) = samples.first_that_runs(samples.to_add(original, given, random, shapes, seed),
                                                          reference)
    observed = run_model(mixed, mixed_dir, provider, data, emulate, [(0, name) for _, name in watch],
                         what="mixed model").results
    names = [o.name for o in mixed.graph.output]
    low = low_precision(mixed) or "float16"
    tolerance = tolerance or Tolerance()
    tolerances = tolerances or {}
    said = "; ".join([tolerance.describe(low), *(f"{name}: {t.describe(low)}" for name, t in tolerances.items())])
    tolerances = {name: t.resolved(low) for name, t in tolerances.items()}
    outputs = compare_outputs(expected, observed, names, tolerance.resolved(low), tolerances)
    result = CheckResult(all(o.passed for o in outputs), _mode(mixed, provider, emulate), emulate, len(data),
                         outputs, runs=2 * len(data), generated=generated, tolerance=said,
                         notes=[f"{which}: {note}" for which, m in (("float32 model", original), ("mixed model", mixed))
                                if (note := instrument.ir_version_note(m))])
    if deployed:
        result.outputs, result.deployed, runs = judged_as_deployed(
            outputs, mixed, mixed_dir, provider, data, expected, tolerance.resolved(low), tolerances,
            (original, original_dir))
        result.runs += runs
        result.passed = all(o.passed for o in result.outputs)
    if not result.passed and localize_failures and not all(o.passed for o in outputs):
        found = blame(outputs, mixed, expected, observed)
        result.suspects, result.unlocalized = found.suspects, found.diffuse()
        result.fix = fix_flags(result.suspects)
    result.seconds = time.perf_counter() - started
    return result


def judged_as_deployed(outputs: list[OutputCheck], mixed: onnx.ModelProto, base_dir: str | None, provider: str,
                       data: Sequence[Sample], expected: list[dict], tolerance: Tolerance,
                       tolerances: Mapping[str, Tolerance],
                       original: tuple[onnx.ModelProto, str | None]) -> tuple[list[OutputCheck], str, int]:
    """``outputs`` (judged on the unoptimized run) judged again by the worse of that run and one of
    ``mixed`` as deployed (ONNX Runtime's default graph optimizations), what became of that
    run, and the model runs made here. What became of it: ``compared``; ``did not run: ...``
    where ONNX Runtime crashed (then ``outputs`` stand: its CPU provider crashes on some float16
    graphs that CUDA runs) or has no kernel for an op at its type (NO_KERNEL); or ``refused: ...`` where
    ONNX Runtime refuses the model once its optimizations have rewritten it (then every output
    fails: the model cannot be deployed at those settings). Where an output fails as deployed,
    the ``original`` float32 model (and its folder) runs as deployed too, and an output that
    passes against that run passes (BOTH_DEPLOYED): the optimizations changed the float32
    model's numerics as much (ONNX Runtime fuses a quantized model's DequantizeLinear -> MatMul ->
    QuantizeLinear into an integer QLinearMatMul), which is the deployment's doing, not the conversion's."""
    try:
        as_deployed = run_model(mixed, base_dir, provider, data, what="mixed model as deployed",
                                optimize=DEPLOYED_OPTIMIZATION).results
    except NativeFailure as exc:
        return outputs, f"did not run: {exc}", 0
    except Exception as exc:  # ONNX Runtime's error, whatever its class: the finding is that it refused
        said = instrument.first_line(exc)
        if NO_KERNEL in said:  # a bfloat16 MatMul on the CPU provider: the provider's lack, not the model's
            return outputs, f"did not run: {provider} has no kernel for one of its ops ({said})", 0
        refused = f"refused: ONNX Runtime at its default optimizations: {said}"
        return [replace(o, passed=False, run=DEPLOYED) for o in outputs], refused, 0
    names, runs = [o.name for o in outputs], len(data)
    judged = [replace(d, run=DEPLOYED) for d in compare_outputs(expected, as_deployed, names, tolerance, tolerances)]
    if not all(d.passed for d in judged):
        try:
            reference = run_model(*original, provider, data, what="float32 model as deployed",
                                  optimize=DEPLOYED_OPTIMIZATION).results
            runs += len(data)
        except Exception:  # the float32 model does not deploy either: the figures against its own run stand
            reference = None
        if reference is not None:
            again = compare_outputs(reference, as_deployed, names, tolerance, tolerances)
            judged = [replace(a, run=BOTH_DEPLOYED) if not d.passed and a.passed else d for d, a in zip(judged, again)]
    return [_worse(e, d) for e, d in zip(outputs, judged)], "compared", runs


def _worse(unoptimized: OutputCheck, deployed: OutputCheck) -> OutputCheck:
    """The run that judges an output: a failing one, else one judged against the float32 model as
    deployed (BOTH_DEPLOYED: the report says why), else the larger relative L2 error."""
    if unoptimized.passed != deployed.passed:
        return deployed if unoptimized.passed else unoptimized
    if deployed.run == BOTH_DEPLOYED:
        return deployed
    return deployed if deployed.errors.rel_l2 > unoptimized.errors.rel_l2 else unoptimized


def compare_outputs(expected: list[dict], observed: list[dict], names: list[str], default: Tolerance,
                    tolerances: Mapping[str, Tolerance]) -> list[OutputCheck]:
    unknown = sorted(set(tolerances) - set(names))
    if unknown:
        raise UserError(f"--tol names {', '.join(unknown)}, not among the outputs ({', '.join(names)})")
    checks = []
    for name in names:
        if name not in expected[0]:
            raise UserError(f"the mixed model's output {name!r} is not an output of the original model")
        tol = tolerances.get(name, default)
        found = [errors(e[name], o[name], tol) for e, o in zip(expected, observed)]
        failing = [i for i, f in enumerate(found) if not f.passes(tol)]
        shown = failing[0] if failing else int(np.nanargmax([f.rel_l2 for f in found])) \
            if not all(np.isnan(f.rel_l2) for f in found) else 0
        checks.append(OutputCheck(name, not failing, tol, shown, found[shown]))
    return checks


@dataclass
class Blame:
    """What localization found on the first failing sample: its ``suspects`` (nodes that grew the
    relative error by more than ``threshold``, or introduced NaN/Inf) and, where there are none,
    the node that grew it most (``largest``, below the threshold)."""

    suspects: list[Suspect]
    threshold: float
    largest: Suspect | None = None

    def diffuse(self) -> str | None:
        """Where no node is to blame, why keeping nodes float32 will not help, in one line."""
        if self.suspects:
            return None
        most = f" (the most: {self.largest.op_type} {self.largest.node!r}, {self.largest.growth:.3g})" \
            if self.largest else ""
        return (f"localization: no node grows the relative error by more than {self.threshold:.3g}{most}: the "
                "error builds up in small steps across the model, as rounding every stored value to the low "
                "precision does, and keeping a few nodes float32 will not remove it; an aggregate metric "
                "(--metric rel-l2 or cosine) or a looser tolerance is the test for such a model")


def blame(outputs: list[OutputCheck], mixed: onnx.ModelProto, expected: list[dict],
          observed: list[dict]) -> Blame:
    """``localize`` on the first sample an output fails on. A node is a suspect where it grows
    the relative error by ``MIN_GROWTH``, or by half the least relative error of the outputs
    failing there where that is less: an output that fails on a few elements (values near zero,
    elementwise) has its culprits below the noise of a model whose error is large."""
    failing = [o for o in outputs if not o.passed]
    worst = failing[0].sample
    errors = [o.errors.rel_l2 / 2 for o in failing if o.sample == worst and o.errors.rel_l2 > 0]
    threshold = min([MIN_GROWTH, *errors])
    ranked = localize(mixed, expected[worst], observed[worst], min_growth=0.0)
    suspects = [s for s in ranked if s.nonfinite or s.growth > threshold]
    return Blame(suspects, threshold, None if suspects or not ranked else ranked[0])


def fix_flags(suspects: list[Suspect]) -> str | None:
    chosen = culprits(suspects)
    return " ".join(f"--keep-fp32-node {shlex.quote(s.node)}" for s in chosen) or None


def culprits(suspects: list[Suspect]) -> list[Suspect]:
    """The suspects worth keeping float32 now: those that introduced NaN/Inf, else the top few."""
    broken = [s for s in suspects if s.nonfinite]
    if broken:
        return broken
    if not suspects:
        return []
    top = suspects[0].growth
    return [s for s in suspects[:3] if s.growth >= top / 4]


BORROW_BYTES = 1 << 16
"""A large model file's float weights of at least this size stay in it (``io.load``'s borrowing):
the check holds both models, and the sessions in its children read them from the file. Smaller
ones are loaded: ONNX Runtime opens the file once per external tensor, which thousands of
small weights would make the cost of the check's sessions."""


def load_model(model) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        return io.load(model, borrow=BORROW_BYTES), os.path.dirname(os.path.abspath(model))
    raise UserError(f"cannot check a {type(model).__name__}: pass a path or an onnx.ModelProto")


def low_precision(mixed: onnx.ModelProto) -> str | None:
    """The low precision the mixed model holds values in ("float16", "bfloat16"), None where none."""
    types = {v.elem_type for v in typed_index(mixed).all_values()} | {t.data_type for t in io.initializers(mixed)}
    if not types & LOW_TYPES:
        return None
    return "bfloat16" if onnx.TensorProto.BFLOAT16 in types else "float16"


def _mode(mixed: onnx.ModelProto, provider: str, emulate: bool) -> str:
    low = low_precision(mixed) or "no low-precision values"
    return f"emulated {low} on {provider}" if emulate else f"native on {provider}"


def _num(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3g}"


def _failure_message(output: OutputCheck) -> str:
    e, tol = output.errors, output.tolerance
    if e.new_nonfinite:
        return f"{e.new_nonfinite} NaN/Inf values that the float32 model does not have ({output.run})"
    return (f"{tol.metric} beyond rtol={tol.rtol:g} atol={tol.atol:g}: max abs {e.max_abs:.3g}, "
            f"max rel {e.max_rel:.3g}, rel L2 {e.rel_l2:.3g}, cosine {e.cosine:.6f} ({output.run})")
