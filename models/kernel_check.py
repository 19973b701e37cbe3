"""A provider's kernel table against the installed ONNX Runtime (issue 10;
``benchmarks/kernel_check.py`` is its command line).

The coloring keeps a node float32 when ``kernel_table(provider).supports(...)`` says the
provider has no float16/bfloat16 kernel for it. This check asks the runtime instead: each
single-node case of the ONNX backend node tests (ONNX domain, float32 data) is converted to
the low type with ``policy="all-low", provider=None`` (every float32 input, output,
initializer and attribute tensor the schema lets change), and a session on the provider
loads it with graph optimizations off (the node stays as the table sees it) and saves the
optimized model. The provider ran the node without a low-precision kernel ("fallback")
when that model has ``InsertedPrecisionFreeCast_*`` nodes, when the profile places the node
on another provider or shows it with no low-precision input, or when the session cannot be
created for want of an implementation (bfloat16 gets no inserted casts: the session fails).
Every case is first run in float32 on the provider; where that fails the case tells nothing
about precision ("unclear"). A low session that fails otherwise is "fails".

The table's answer uses the parameters the coloring would pass (``Analysis.slots``), so a
disagreement is a node the coloring puts in low precision that the provider runs through
casts, or one it keeps float32 although the provider has the kernel.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

import amp_rewrite
from amp_rewrite.ir.precision import Precision
from amp_rewrite.policy.kernels import kernel_table
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.isolate import isolated
from amp_rewrite.runtime.timing import INSERTED_CAST, KERNEL_SUFFIX

NODE = "kernel_check_node"
"""The name the checked node gets, so the optimized model and the profile can be read by it."""
LOW, FALLBACK, FAILS, UNCLEAR = "low", "fallback", "fails", "unclear"
"""What the runtime showed: the node ran in the low type on the provider; it ran without a
low-precision kernel; the low model failed otherwise; the float32 model fails too."""
NO_KERNEL = "Could not find an implementation"
"""ONNX Runtime's error when no provider registers a kernel for a node's types."""
LOW_TYPES = {"float16", "bfloat16"}
"""Element type names in ONNX Runtime's profile that count as low precision."""


@dataclass
class Finding:
    """One case: what the table says for its node and what the runtime showed."""

    case: str
    op: str
    opset: int
    params: list[str]
    table: bool
    runtime: str
    seen: str

    @property
    def agrees(self) -> bool | None:
        """None where the runtime showed no kernel verdict: the float32 model fails too, or the low
        one fails where the table says low (a low model that fails where the table keeps the node
        float32, as for a kernel refusing an attribute, agrees)."""
        if self.runtime == UNCLEAR or (self.runtime == FAILS and self.table):
            return None
        return self.table == (self.runtime == LOW)


@dataclass
class Prepared:
    """A case ready to run: the float32 model, its low version, and feeds for both."""

    case: str
    op: str
    opset: int
    params: list[str]
    table: bool
    model: onnx.ModelProto
    low: onnx.ModelProto
    feeds: dict
    low_feeds: dict


@dataclass
class Check:
    provider: str
    precision: str
    onnxruntime: str
    table_source: str
    findings: list[Finding] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    """Cases left out, by reason (no float32 parameter that admits the low type, ...)."""

    @property
    def disagreements(self) -> list[Finding]:
        return [f for f in self.findings if f.agrees is False]

    @property
    def failing(self) -> list[Finding]:
        """Low models that fail where the table says low: no kernel verdict."""
        return [f for f in self.findings if f.runtime == FAILS and f.agrees is None]

    def counts(self) -> dict[str, int]:
        """Cases by (table says, runtime shows)."""
        tally = Counter(f"table {'low' if f.table else 'float32'} / runtime {f.runtime}" for f in self.findings)
        return dict(sorted(tally.items()))

    def summary(self) -> str:
        agree = sum(f.agrees is True for f in self.findings)
        unclear = sum(f.runtime == UNCLEAR for f in self.findings)
        failing = self.failing
        wrong = sorted({f.op for f in self.disagreements})
        ops = len({f.op for f in self.findings})
        return (f"kernel check {self.provider} {self.precision} (onnxruntime {self.onnxruntime}, {self.table_source}): "
                f"{len(self.findings)} cases of {ops} ops; {agree} agree, {len(self.disagreements)} disagree"
                f"{' (' + ', '.join(wrong) + ')' if wrong else ''}; {len(failing)} low models fail otherwise"
                f"{' (' + ', '.join(sorted({f.op for f in failing})) + ')' if failing else ''}, "
                f"{unclear} unclear (float32 fails too), {sum(self.skipped.values())} cases skipped")


def single_node_cases(ops: Iterable[str] | None = None) -> Iterator:
    """ONNX backend node test cases of one ONNX-domain node with float32 data (``ops``: these op types only)."""
    wanted = set(ops) if ops else None
    for case in _testcases():
        graph = case.model.graph
        if len(graph.node) != 1 or graph.node[0].domain not in ("", "ai.onnx"):
            continue
        if wanted is not None and graph.node[0].op_type not in wanted:
            continue
        if any(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in (*graph.input, *graph.output)):
            yield case


@functools.cache
def _testcases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect_testcases(None)


def prepare(case, provider: str, precision: Precision) -> Prepared | str:
    """The case ready to run, or why it is skipped. The table is asked with the parameters the
    coloring would ask it with (``Analysis.slots``); the node must end up in the low type."""
    model = _within_runtime(case.model)
    if model is None:
        return "the node is not valid at the newest opset ONNX Runtime loads"
    model.graph.node[0].name = NODE
    options = amp_rewrite.ConvertOptions(precision=precision, provider=None, policy="all-low",
                                         keep_io_types=False, range_check="off")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            analysis = amp_rewrite.analyze(model, options)
            low, report = amp_rewrite.convert(model, options=options)
        except amp_rewrite.UserError as exc:
            return f"convert refuses: {str(exc)[:80]}"
    slots = analysis.slots.get(0)
    if slots is None:
        return f"no float32 type parameter admits {precision.value}"
    decision = next(d for d in report.decisions if d.node == NODE)
    if decision.precision != amp_rewrite.Color.LOW.value:
        return "the node stays float32 in the all-low conversion"
    node = analysis.index.nodes[0]
    opset = analysis.index.opset(node)
    kernels = kernel_table(provider)
    table = (kernels.supports(node.domain, node.op_type, opset, precision.value, slots.params)
             and not kernels.refuses(node.proto, precision.value))
    inputs = [_array(a) for a in case.data_sets[0][0]]
    feeds = {i.name: a for i, a in zip(model.graph.input, inputs)}
    with np.errstate(over="ignore"):
        low_feeds = {i.name: _retyped(a, i.type.tensor_type.elem_type) for i, a in zip(low.graph.input, inputs)}
    return Prepared(case.name, node.op_type, opset, sorted(slots.params), table, model, low, feeds, low_feeds)


def _within_runtime(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of the single-node ``model`` that the installed ONNX Runtime loads: its IR
    version and ONNX opset lowered to the newest the runtime takes (None where the node is not
    valid at that opset). The node suite's newest cases use opsets past ONNX Runtime's; the
    kernel question for such an op is asked at the newest version the runtime knows."""
    max_ir, max_opset = _runtime_limits()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = min(copy.ir_version, max_ir)
    lowered = False
    for opset in copy.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > max_opset:
            opset.version, lowered = max_opset, True
    if lowered:
        try:
            onnx.checker.check_model(copy, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
            return None
    return copy


@functools.cache
def _runtime_limits() -> tuple[int, int]:
    """The newest IR version and ONNX opset the installed ONNX Runtime loads (a probe of Identity models)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4

    def loads(ir_version: int, opset: int) -> bool:
        value = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                                       [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        model.ir_version = ir_version
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:
            return False
        return True

    ir_version = next(v for v in range(onnx.IR_VERSION, 3, -1) if loads(v, 13))
    opset = next(v for v in range(onnx.defs.onnx_opset_version(), 13, -1) if loads(ir_version, v))
    return ir_version, opset


def _array(value):
    """A case's input as ONNX Runtime takes it (numpy scalars and TensorProtos as arrays)."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _retyped(array, elem_type: int):
    if elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) and isinstance(array, np.ndarray):
        return array.astype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    return array


def observe(case: Prepared, provider: str, folder: str) -> Finding:
    """Run the case's float32 and low models on ``provider`` and say what its node ran with."""

    def found(runtime: str, seen: str) -> Finding:
        return Finding(case.case, case.op, case.opset, case.params, case.table, runtime, seen)

    try:
        session, _ = _session(case.model, provider, folder, "float32")
        _run(session, case.feeds)
    except Exception as exc:
        return found(UNCLEAR, f"the float32 model fails too: {_said(exc)}")
    ran = _checked_nodes(_profiled(session))
    if any(where != provider for where, _ in ran.values()):
        return found(UNCLEAR, f"the float32 node runs on {_where(ran)} too")
    try:
        session, optimized = _session(case.low, provider, folder, "low")
    except Exception as exc:
        text = _said(exc)
        return found(FALLBACK if NO_KERNEL in text else FAILS, f"session fails: {text}")
    inserted = [n.name for n in optimized.graph.node if n.name.startswith(INSERTED_CAST)]
    if inserted:
        return found(FALLBACK, f"ONNX Runtime inserted {', '.join(inserted)}")
    try:
        _run(session, case.low_feeds)
    except Exception as exc:
        return found(FAILS, f"run fails: {_said(exc)}")
    ran = _checked_nodes(_profiled(session))
    expanded = "" if NODE in ran else "ONNX Runtime expanded the node's function body; "
    if any(where != provider for where, _ in ran.values()):
        return found(FALLBACK, f"{expanded}the node ran on {_where(ran)}")
    types = {t for _, node_types in ran.values() for t in node_types}
    if not types & LOW_TYPES:
        return found(FALLBACK, f"{expanded}the node ran with {', '.join(sorted(types)) or 'no typed'} data")
    return found(LOW, f"{expanded}ran on {provider} with {', '.join(sorted(types))} data, no inserted cast")


def _session(model: onnx.ModelProto, provider: str, folder: str, label: str):
    """A session with graph optimizations off (the node stays as the table sees it), the
    optimized model saved (ONNX Runtime's inserted casts are in it) and the profiler on."""
    optimized = os.path.join(folder, f"{label}.optimized.onnx")
    session = instrument.session(model, provider=provider, profile_prefix=os.path.join(folder, f"{label}.profile"),
                                 save_optimized=optimized)
    return session, onnx.load(optimized)


def _run(session, feeds: dict) -> None:
    """One run. Tensors go in as OrtValues: ONNX Runtime's Python binding takes and returns
    bfloat16 only so (sequences and optionals, which run() takes, come from float16 cases)."""
    import onnxruntime as ort

    if not all(isinstance(a, np.ndarray) for a in feeds.values()):
        session.run(None, feeds)
        return
    values = {name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), TensorProto.BFLOAT16)
              if a.dtype.name == "bfloat16" else ort.OrtValue.ortvalue_from_numpy(a) for name, a in feeds.items()}
    session.run_with_ort_values([o.name for o in session.get_outputs()], values)


def _profiled(session) -> dict[str, tuple[str, set[str]]]:
    """Each node in the profile: the provider it ran on and its inputs' and outputs' element types."""
    placed = {}
    with open(session.end_profiling()) as events:
        for event in json.load(events):
            if event.get("cat") == "Node" and event.get("name", "").endswith(KERNEL_SUFFIX):
                args = event.get("args", {})
                types = {t for key in ("input_type_shape", "output_type_shape")
                         for entry in args.get(key, []) for t in entry}
                placed[event["name"].removesuffix(KERNEL_SUFFIX)] = args.get("provider", ""), types
    return placed


def _checked_nodes(placed: dict[str, tuple[str, set[str]]]) -> dict[str, tuple[str, set[str]]]:
    """The checked node's profile entry, or every node's where ONNX Runtime expanded its function body."""
    return {NODE: placed[NODE]} if NODE in placed else placed


def _where(placed: dict[str, tuple[str, set[str]]]) -> str:
    return ", ".join(sorted({where for where, _ in placed.values()}))


def _said(exc: BaseException) -> str:
    """An error as a finding's evidence: its first line, at most 300 characters."""
    return instrument.first_line(exc)


def check(provider: str, precision: Precision | str = Precision.FLOAT16, ops: Iterable[str] | None = None,
          isolate: bool = True, shard: tuple[int, int] = (0, 1)) -> Check:
    """Every single-node case (of ``ops``) on ``provider``: the table's answer against the runtime's.
    The cases of one op type run in a forked child when ``isolate``. ``shard`` (k, n) keeps the
    k-th of every n op types (in name order), so n processes can share the work."""
    import onnxruntime as ort

    precision = Precision(precision)
    instrument.require_provider(provider)
    table = kernel_table(provider)
    result = Check(provider, precision.value, ort.__version__, table.source)
    by_op: dict[str, list[Prepared]] = {}
    for case in single_node_cases(ops):
        prepared = prepare(case, provider, precision)
        if isinstance(prepared, str):
            result.skipped[prepared] += 1
        else:
            by_op.setdefault(prepared.op, []).append(prepared)
    for op, cases in sorted(by_op.items())[shard[0]::shard[1]]:

        def work(progress, cases=cases) -> list[Finding]:
            found = []
            with tempfile.TemporaryDirectory(prefix="kernel-check-") as folder:
                for case in cases:
                    progress(case.case)
                    found.append(observe(case, provider, folder))
            return found

        try:
            result.findings += isolated(work, f"onnxruntime ({op})") if isolate else work(lambda text: None)
        except amp_rewrite.UserError as exc:  # a crash or hang in the child: every case of the op fails
            result.findings += [Finding(c.case, c.op, c.opset, c.params, c.table, FAILS, _said(exc))
                                for c in cases]
    return result


def markdown(result: Check) -> str:
    """The disagreements (grouped by op, opset, parameters and verdicts, with the first case as
    evidence), the counts, and the failures."""
    lines = [f"# Kernel check: {result.provider}, {result.precision}", "",
             f"onnxruntime {result.onnxruntime}; table: {result.table_source}.", "",
             "## Disagreements", ""]
    lines += _grouped(result.disagreements) or ["none"]
    lines += ["", "## Counts", "", "| table says / runtime shows | cases |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in result.counts().items()]
    lines += ["", "## Low models that fail (not a kernel verdict)", ""]
    lines += _grouped(result.failing) or ["none"]
    lines += ["", "## Skipped cases", ""] + [f"- {n}: {why}" for why, n in result.skipped.most_common()]
    return "\n".join(lines) + "\n"


def _grouped(findings: list[Finding]) -> list[str]:
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.op, f.opset, tuple(f.params), f.table, f.runtime), []).append(f)
    if not groups:
        return []
    lines = ["| op | opset | params | table says | runtime shows | evidence |", "|---|---|---|---|---|---|"]
    for (op, opset, params, table, runtime), group in sorted(groups.items()):
        more = f" (and {len(group) - 1} more cases)" if len(group) > 1 else ""
        evidence = f"{group[0].case}: {group[0].seen}{more}".replace("|", "/")
        lines.append(f"| {op} | {opset} | {','.join(params)} | {'low kernel' if table else 'no low kernel'} "
                     f"| {runtime} | {evidence} |")
    return lines


def write(result: Check, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"kernel_check-{result.provider.removesuffix('ExecutionProvider').lower()}-{result.precision}"
    data = {"provider": result.provider, "precision": result.precision, "onnxruntime": result.onnxruntime,
            "table": result.table_source, "summary": result.summary(), "counts": result.counts(),
            "skipped": dict(result.skipped.most_common()),
            "disagreements": [asdict(f) for f in result.disagreements],
            "findings": [asdict(f) for f in result.findings]}
    paths = out / f"{stem}.json", out / f"{stem}.md"
    paths[0].write_text(json.dumps(data, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    return paths
