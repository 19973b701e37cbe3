"""``bench``: does mixed precision pay for a model on a provider, and where does the time go?

``bench`` times the float32 model and each mixed-precision model (``convert``'s output with
the given options when none is given) on the same samples with ``runtime.timing`` (I/O
binding, warm-up, median and spread); on CUDA the float32 model runs with TF32 off, the
baseline of every speed-up, and on. From each model's profile it sums the time per op type
and precision and, for the mixed models, lists:

- the slowest float32 nodes, each with the reason the coloring kept it there (the default
  analysis of the original, and the range check's record in the mixed model);
- the nodes the model holds in low precision that the provider ran in float32 (it has no
  low-precision kernel: ONNX Runtime inserted casts around them);
- the low-precision matrix products and convolutions whose weight dimensions are not
  multiples of TENSOR_CORE_MULTIPLE, which keeps them off Tensor Cores.

The verdict: a mixed model pays when it is at least PAYS times as fast as float32 and nine
of its runs in ten beat float32's median (else the timing is inconclusive); otherwise the
cause that accounts for the most time per run is named.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Container, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import onnx

from amp_rewrite.errors import UserError, printable_lines
from amp_rewrite.inputs import samples
from amp_rewrite.ir import io
from amp_rewrite.ir.builder import LOW_TYPES
from amp_rewrite.ir.graph import node_key
from amp_rewrite.ir.types import typed_index
from amp_rewrite.numerics.check import load_model
from amp_rewrite.policy.kernels import PROVIDERS
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.records import recorded_fp32
from amp_rewrite.runtime.timing import ASYNCHRONOUS, NodeTime, Timed, Timing, default_provider, time_models
from amp_rewrite.workflows.analyze import analyze
from amp_rewrite.workflows.convert import convert

PAYS = 1.1
"""Speed-up over float32 from which mixed precision pays: below it, gains are within run-to-run noise."""
TOP_NODES = 10
TOP_OPS = 8
TENSOR_CORE_MULTIPLE = 8
TENSOR_CORE_DIMS = {"MatMul": (1, (-2, -1)), "FusedMatMul": (1, (-2, -1)), "Gemm": (1, (0, 1)),
                    "FusedGemm": (1, (0, 1)), "Conv": (1, (0, 1)), "FusedConv": (1, (0, 1)),
                    "ConvTranspose": (1, (0, 1))}
"""Ops that Tensor Cores run, by the input holding the weights and its axes (the reduced and
output dimensions, or channels) that must be multiples of TENSOR_CORE_MULTIPLE."""
LOW_KINDS = ("float16", "bfloat16")
ORT_RENAMES = (re.compile(r"^InsertedPrecisionFreeCast_"), re.compile(r"_nchwc$"), re.compile(r"/[A-Za-z]+Fusion/?$"))
"""How ONNX Runtime's optimizer renames the nodes it rewrites (fallback casts, NCHWc layout, fusions):
taken off a profiled name, in turn, to find the model's node."""
FLOAT32_BASELINES = {
    "CUDAExecutionProvider": (("float32 (TF32 off)", {"use_tf32": "0"}), ("float32 (TF32 on)", {"use_tf32": "1"})),
}
"""The float32 runs per provider (label, provider options); the first is the baseline."""
PLAIN_BASELINE: tuple[tuple[str, dict[str, str]], ...] = (("float32", {}),)


@dataclass
class OpTime:
    op_type: str
    kind: str
    nodes: int
    ms: float


@dataclass
class SlowNode:
    node: str
    op_type: str
    ms: float
    reason: str


@dataclass
class OffTensorCores:
    node: str
    op_type: str
    dims: list[int]
    ms: float


@dataclass
class ModelBench:
    """One model's timing (milliseconds per run) and, for a mixed model, where its time goes."""

    label: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs_per_second: float
    speedup: float
    """The float32 baseline's median over this model's."""
    device_memory_mib: float | None
    time_by_kind: dict[str, float]
    by_op: list[OpTime] = field(default_factory=list)
    float32_nodes: list[SlowNode] = field(default_factory=list)
    fallbacks: dict[str, int] = field(default_factory=dict)
    """Op types the model holds in low precision that the provider ran in float32: node counts."""
    off_tensor_cores: list[OffTensorCores] = field(default_factory=list)
    verdict: str = ""


@dataclass
class BenchResult:
    provider: str
    binding: str
    samples: int
    warmup: int
    runs: int
    profile_runs: int
    profile_note: str
    models: list[ModelBench]
    verdict: str
    conversion: str = ""
    """The conversion's summary line when ``bench`` converted the model itself."""
    failed: dict[str, str] = field(default_factory=dict)
    """Mixed models that ONNX Runtime could not run, and why."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def table(self) -> str:
        head = ("model", "median ms", "p10 ms", "p90 ms", "runs/s", "speed-up", "device MiB")
        rows = [(m.label, f"{m.median_ms:.3f}", f"{m.p10_ms:.3f}", f"{m.p90_ms:.3f}", f"{m.runs_per_second:.1f}",
                 f"{m.speedup:.2f}x", "-" if m.device_memory_mib is None else f"{m.device_memory_mib:.0f}")
                for m in self.models]
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        lines = [f"amp-rewrite bench on {self.provider}: {self.samples} sample{'s' if self.samples != 1 else ''}, "
                 f"{self.warmup} warm-up and {self.runs} timed runs per model; {self.binding}"]
        if self.conversion:
            lines.append(f"converted with the default options: {self.conversion}")
        lines += ["  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in (head, *rows)]
        lines += [f"  {label}: FAILED: {why}" for label, why in self.failed.items()]
        for model in self.models:
            lines += _where_the_time_goes(model, self.profile_runs)
        if self.profile_note:
            lines.append(f"note: {self.profile_note}")
        lines.append(f"verdict: {self.verdict}")
        return printable_lines(lines)


def bench(model, mixed: Sequence = (), provider: str | None = None, inputs: Sequence = (), random: int | None = None,
          shapes: Mapping[str, Sequence[int]] | None = None, warmup: int = 10, runs: int = 100,
          profile_runs: int = 10, seed: int = 0, options: ConvertOptions | None = None) -> BenchResult:
    """Time ``model`` (the float32 original: a path or an ``onnx.ModelProto``) and each of
    ``mixed`` (paths or protos; ``convert``'s output with ``options`` when empty, by default
    the default options for ``provider`` where its kernel table is known) on
    ``provider`` (CUDA where a GPU is there, else the CPU provider) over ``inputs`` (.npz paths
    or dicts of arrays) and/or ``random`` generated samples (one when no inputs are given)."""
    for name, count, least in (("warmup", warmup, 0), ("runs", runs, 1), ("profile_runs", profile_runs, 0)):
        if count < least:
            raise UserError(f"{name} must be at least {least}, got {count}")
    provider = provider or default_provider()
    options = options or default_options(provider)
    original, original_dir = load_model(model)
    given = samples.resolve(inputs, original)
    generated = samples.to_add(original, given, random, shapes, seed)  # the first set the float32 model runs on
    conversion = ""
    with tempfile.TemporaryDirectory(prefix="amp-rewrite-bench-") as folder:
        if mixed:
            candidates = [(_label(m, i), *load_model(m)) for i, m in enumerate(mixed)]
        else:
            converted, report = _convert(model, folder, options)
            conversion = report.summary().splitlines()[0].removeprefix("amp-rewrite: ")
            candidates = [("amp-rewrite", *load_model(converted))]

        def timed(label: str, proto: onnx.ModelProto, base_dir: str | None, provider_options=None) -> Timed:
            return Timed(label, proto, base_dir, [samples.checked(sample, proto) for sample in data], provider_options)

        first_refusal = refused = None
        for attempt in generated:
            if not attempt.worth_after(refused):
                continue
            data = given + attempt.samples
            baselines = [timed(label, original, original_dir, opts)
                         for label, opts in FLOAT32_BASELINES.get(provider, PLAIN_BASELINE)]
            timings = time_models([*baselines, *(timed(*c) for c in candidates)], provider, warmup, runs,
                                  profile_runs)
            refused = next((t for t in timings[:len(baselines)] if isinstance(t, str)), None)
            if not refused:
                break
            first_refusal = first_refusal or refused
        else:
            raise UserError(f"ONNX Runtime cannot run the float32 model: {first_refusal}")
        reasons = _reasons(original, original_dir, options, "" if conversion else "amp-rewrite would keep it float32: ")
        measured = [t for t in timings[:len(baselines)] if isinstance(t, Timing)]  # every one: none was refused
        reference = measured[0]
        rows = [_row(entry.label, timing, reference) for entry, timing in zip(baselines, measured)]
        failed = {}
        for (label, proto, _), timing in zip(candidates, timings[len(baselines):]):
            if isinstance(timing, str):  # a mixed model ONNX Runtime refuses (a peer's invalid output)
                failed[label] = timing
                continue
            row = _row(label, timing, reference)
            _explain(row, timing.nodes, _Mixed.of(proto), reference.nodes, reasons, provider)
            rows.append(row)
    first = rows[len(baselines)] if len(rows) > len(baselines) else None
    note = ("node times come from ONNX Runtime's profiler, which on an asynchronous provider times each node's "
            "launch on the host, not its kernel: read the shares as indicative" if provider in ASYNCHRONOUS else "")
    return BenchResult(provider, reference.binding, len(data), warmup, runs, profile_runs, note, rows,
                       f"{first.label}: {first.verdict}" if first else "no mixed model ran", conversion, failed)


def default_options(provider: str) -> ConvertOptions:
    """The default conversion for ``provider``: its kernel table where one is known, else the default's."""
    return ConvertOptions(provider=provider if provider in PROVIDERS else ConvertOptions.provider)


def _label(model, position: int) -> str:
    return os.path.basename(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else f"mixed #{position + 1}"


def _convert(model, folder: str, options: ConvertOptions):
    if isinstance(model, (str, os.PathLike)):
        return convert(model, os.path.join(folder, "mixed.onnx"), options)
    return convert(model, options=options)


def _row(label: str, timing: Timing, reference: Timing) -> ModelBench:
    kinds: dict[str, float] = defaultdict(float)
    for node in timing.nodes:
        kinds[node.kind] += node.ms
    memory = None if timing.device_memory_bytes is None else timing.device_memory_bytes / 2**20
    return ModelBench(label, timing.percentile(50), timing.percentile(10), timing.percentile(90),
                      timing.runs_per_second, reference.percentile(50) / timing.percentile(50), memory,
                      dict(sorted(kinds.items(), key=lambda item: -item[1])))


def _reasons(original: onnx.ModelProto, base_dir: str | None, options: ConvertOptions, prefix: str) -> dict[str, str]:
    """Why the analysis with ``options`` keeps each float32 candidate there, by ``node_key``
    (``prefix`` first: for a model that another run or tool made, it is amp-rewrite's view;
    ``base_dir``: where its external or borrowed weights lie)."""
    analysis = analyze(original, dataclasses.replace(options, range_check="off"), base_dir)
    decisions = analysis.coloring.decisions.items()
    return {node_key(analysis.index.nodes[i]): prefix + (d.reason if d.reason.startswith(f"{d.op_class}:")
                                                         else f"{d.op_class}: {d.reason}")
            for i, d in decisions if d.color is not Color.LOW}


@dataclass
class _Mixed:
    """What ``_explain`` reads off a mixed model: its low precision, the top-level nodes that
    read or write a low-precision value, each node's inputs and the static shapes known
    (initializers, declared values), all by ``node_key``/value name; the range check's record."""

    low: str
    low_nodes: set[str]
    inputs: dict[str, list[str]]
    producers: dict[str, str]
    shapes: dict[str, list[int]]
    recorded: dict[str, str]

    @classmethod
    def of(cls, mixed: onnx.ModelProto) -> _Mixed:
        index = typed_index(mixed)
        values = index.values
        low = "bfloat16" if any(v.elem_type == onnx.TensorProto.BFLOAT16 for v in index.all_values()) else "float16"
        low_nodes = {node_key(n) for n in index.nodes if n.graph == 0 and any(
            key is not None and values[key].elem_type in LOW_TYPES for key in (*n.inputs, *n.outputs))}
        top = [n for n in index.nodes if n.graph == 0]
        inputs = {node_key(n): list(n.proto.input) for n in top}
        producers = {name: node_key(n) for n in top for name in n.proto.output}
        shapes = {t.name: list(t.dims) for t in io.initializers(mixed)}
        for info in (*mixed.graph.input, *mixed.graph.value_info):
            dims = info.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                shapes.setdefault(info.name, [d.dim_value for d in dims])
        recorded = recorded_fp32(mixed)
        return cls(low, low_nodes, inputs, producers, shapes, recorded)

    def input_shape(self, node: NodeTime, position: int) -> list[int] | None:
        """The node's input's shape as the profile saw it, else as the model declares it."""
        names = self.inputs.get(node.name)
        if names is None or len(names) == len(node.input_shapes):  # the profile leaves out prepacked weights
            return node.input_shapes[position] if position < len(node.input_shapes) else None
        return self.shapes.get(names[position]) if position < len(names) else None


def _explain(row: ModelBench, nodes: list[NodeTime], mixed: _Mixed, baseline: list[NodeTime],
             reasons: Mapping[str, str], provider: str) -> None:
    """Fill in where a mixed model's time goes, and its verdict."""
    counts = Counter((n.op_type, n.kind) for n in nodes)
    per_op: dict[tuple[str, str], float] = defaultdict(float)
    for node in nodes:
        per_op[node.op_type, node.kind] += node.ms
    row.by_op = [OpTime(op, kind, counts[op, kind], ms)
                 for (op, kind), ms in sorted(per_op.items(), key=lambda item: -item[1])]
    origin = {n.name: model_node(n.name, mixed.inputs, mixed.producers) for n in nodes}
    fallen = {n.name for n in nodes if origin[n.name] in mixed.low_nodes
              and (n.kind == "float32" or n.provider not in ("", provider))}
    row.fallbacks = dict(Counter(n.op_type for n in nodes if n.name in fallen).most_common())
    slow = sorted((n for n in nodes if n.kind == "float32"), key=lambda n: -n.ms)[:TOP_NODES]
    row.float32_nodes = [SlowNode(n.name, n.op_type, n.ms,
                                  _reason(n.name, origin[n.name], fallen, mixed, reasons, provider)) for n in slow]
    row.off_tensor_cores = [OffTensorCores(n.name, n.op_type, dims, n.ms) for n in nodes
                            if n.kind in LOW_KINDS and n.name not in fallen
                            and (dims := off_tensor_cores(n, mixed.input_shape))]
    row.verdict = verdict(row, nodes, baseline, fallen, provider, mixed.low,
                          {name for name, node in origin.items() if node is None})


def model_node(name: str, nodes: Container[str], producers: Mapping[str, str]) -> str | None:
    """The model's node (one of ``nodes``) that a profiled node name stands for, or None.
    ONNX Runtime names some nodes it makes after a value (an inserted cast after the value it
    casts): such a name stands for the value's producer."""
    for rename in (None, *ORT_RENAMES):
        name = rename.sub("", name) if rename else name
        if name in nodes:
            return name
        if name in producers:
            return producers[name]
    return None


def _reason(name: str, origin: str | None, fallen: set[str], mixed: _Mixed, reasons: Mapping[str, str],
            provider: str) -> str:
    shown = "" if origin == name else f"ONNX Runtime's rewrite of {origin!r}: "
    if origin is None:
        return "not a node of the model: ONNX Runtime's optimizer made it"
    if name in fallen:
        return f"{shown}{mixed.low} in the model, but {provider} has no {mixed.low} kernel for it: it ran in float32"
    if origin in mixed.recorded:
        return f"{shown}range check: {mixed.recorded[origin]}"
    return shown + reasons.get(origin, "not a candidate of the coloring")


def off_tensor_cores(node: NodeTime, input_shape) -> list[int] | None:
    """The weight dimensions that keep a matrix product or convolution off Tensor Cores
    (not multiples of TENSOR_CORE_MULTIPLE), or None when there are none or no shape is known.
    ``input_shape(node, position)`` gives an input's shape."""
    rule = TENSOR_CORE_DIMS.get(node.op_type)
    shape = input_shape(node, rule[0]) if rule else None
    if rule is None or not shape:
        return None
    dims = [shape[axis] for axis in rule[1] if -len(shape) <= axis < len(shape)]
    return dims if any(d % TENSOR_CORE_MULTIPLE for d in dims) else None


def verdict(row: ModelBench, nodes: list[NodeTime], baseline: list[NodeTime], fallen: set[str], provider: str,
            low: str, made: Container[str] = ()) -> str:
    """"pays" with the speed-up (when nine runs in ten beat float32's median; else "inconclusive"),
    or "does not pay" with the cause that costs the most time per run.
    ``fallen`` names the low-precision nodes that ran in float32, ``made`` those ONNX Runtime made."""
    total = sum(n.ms for n in nodes) or 1.0
    low_ms = sum(n.ms for n in nodes if n.kind in LOW_KINDS)
    baseline_median = row.median_ms * row.speedup
    if row.speedup >= PAYS and row.p90_ms >= baseline_median:
        return (f"inconclusive: {row.speedup:.2f}x float32's speed on {provider}, but a tenth of the runs or more "
                f"were no faster than float32's median ({row.p90_ms:.3g} ms against {baseline_median:.3g} ms): "
                "time again on an idle machine, or with more runs")
    if row.speedup >= PAYS:
        return (f"pays: {row.speedup:.2f}x float32's speed on {provider}; {low_ms / total:.0%} of the profiled "
                f"time is in {low} kernels")
    head = f"does not pay: {row.speedup:.2f}x float32's speed on {provider} (it pays from {PAYS:g}x); main reason: "
    if not low_ms and not fallen:
        return head + f"nothing ran in {low}: the model has no {low} node that {provider} runs"
    causes = _causes(row, nodes, baseline, fallen, provider, low, made, total)
    return head + max(causes, key=lambda cause: cause[0])[1]


def _causes(row: ModelBench, nodes: list[NodeTime], baseline: list[NodeTime], fallen: set[str], provider: str,
            low: str, made: Container[str], total: float) -> list[tuple[float, str]]:
    """Candidate causes of a slow mixed model: (milliseconds per run it accounts for, what to say)."""
    def ms(chosen) -> float:
        return sum(n.ms for n in chosen)

    inserted = [n for n in nodes if n.kind == "inserted cast"]
    casts = [n for n in nodes if n.kind == "cast"]
    float32 = [n for n in nodes if n.kind == "float32" and n.name not in fallen]
    low_nodes = {n.name: n.ms for n in nodes if n.kind in LOW_KINDS and n.name not in fallen}
    in_baseline = {n.name for n in baseline}
    off = {o.node for o in row.off_tensor_cores}
    same_in_float32 = ms(n for n in baseline if n.name in low_nodes)
    low_ms = sum(ms for name, ms in low_nodes.items() if name in in_baseline)
    fallback_ms = ms(inserted) + ms(n for n in nodes if n.name in fallen)
    top_ops = Counter[str]()
    for node in float32:
        top_ops[node.op_type] += node.ms  # type: ignore[assignment]  # (milliseconds: typeshed's Counter counts ints)
    return [
        (fallback_ms, f"{provider} has no {low} kernel for {', '.join(row.fallbacks) or 'some nodes'}: ONNX Runtime "
                      f"ran {len(fallen)} of the model's {low} nodes in float32 or on another provider"
                      + (f" and inserted {len(inserted)} casts" if inserted else "")
                      + f" ({fallback_ms:.3g} ms per run, {fallback_ms / total:.0%} of the profiled time)"),
        (ms(casts), f"the model's {len(casts)} casts take {ms(casts):.3g} ms per run ({ms(casts) / total:.0%})"),
        (ms(float32), f"float32 nodes take {ms(float32) / total:.0%} of the profiled time (most in "
                      f"{', '.join(op for op, _ in top_ops.most_common(3))}; "
                      f"{ms(n for n in float32 if n.name in made) / (ms(float32) or 1):.0%} of it in nodes that "
                      "ONNX Runtime's optimizer made)"),
        (low_ms - same_in_float32, f"its {low} kernels are no faster than its float32 ones here ({low_ms:.3g} ms per "
                                   f"run against {same_in_float32:.3g} ms for the same nodes in float32)"),
        (ms(n for n in nodes if n.name in off),
         f"{len(row.off_tensor_cores)} matrix products or convolutions have weight dimensions that are not multiples "
         f"of {TENSOR_CORE_MULTIPLE}, which keeps them off Tensor Cores"),
    ]


def _where_the_time_goes(model: ModelBench, profile_runs: int) -> list[str]:
    if not model.by_op:
        return []
    total = sum(model.time_by_kind.values()) or 1.0
    lines = [f"where the time goes in {model.label} (ms per run over {profile_runs} profiled runs): "
             + ", ".join(f"{kind} {ms:.3g} ({ms / total:.0%})" for kind, ms in model.time_by_kind.items())]
    lines.append("  by op: " + "; ".join(f"{o.op_type} {o.kind} x{o.nodes} {o.ms:.3g}" for o in model.by_op[:TOP_OPS]))
    if model.fallbacks:
        lines.append("  no low-precision kernel, ran in float32: "
                     + ", ".join(f"{op} x{n}" for op, n in model.fallbacks.items()))
    if model.float32_nodes:
        lines.append("  slowest float32 nodes:")
        lines += [f"    {n.op_type} {n.node!r} {n.ms:.3g} ms: {n.reason}" for n in model.float32_nodes]
    if model.off_tensor_cores:
        lines.append(f"  off Tensor Cores (weight dimensions not multiples of {TENSOR_CORE_MULTIPLE}):")
        lines += [f"    {o.op_type} {o.node!r} {o.dims} {o.ms:.3g} ms" for o in model.off_tensor_cores[:TOP_NODES]]
    lines.append(f"  {model.verdict}")
    return lines
