"""make bench: conversion time and peak memory of amp-rewrite against the peer converters.

Each conversion is a whole process (start-up, load, convert, save), timed by the
wall clock. Peak memory is measured two ways: the largest resident set of any one process
of the conversion (GNU time, /usr/bin/time), and the peak over time of the proportional set
sizes summed over the process tree (PSS, sampled from /proc/PID/smaps_rollup every
``SAMPLE_SECONDS``): a page that forked processes share is counted once in the sum, where each
of their resident sets counts it whole. Each conversion runs twice: once sampled for the PSS,
then timed with nothing watching it (``measure``). For every output: Cast nodes inserted and
the share of matrix FLOPs (MatMul, Gemm, Conv) left in low precision. Results go to
benchmarks/RESULTS.md.

    python benchmarks/run.py [--sizes 1000,5000,20000,50000] [--big-gb 2.2] [--skip-big]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import results  # noqa: E402
from models import builders  # noqa: E402

WORK = ROOT / "benchmarks" / "work"
NODES: dict[str, int] = {}
"""Node count of each benchmark model, by its label."""
MEMORY_SLACK = 200 * 2**20
"""The memory target: peak at most 1.5x the model's size plus this."""
SAMPLE_SECONDS = 0.02
"""How often the process tree's PSS is summed."""
NODES_PER_BLOCK = 35
BINDINGS = {"batch": 1, "seq": 128}
AMP = [sys.executable, "-m", "amp_rewrite", "convert", "--quiet"]
TOOLS = {
    "amp-rewrite": AMP,
    "amp-rewrite (no range check)": [*AMP, "--range-check", "off"],
    "amp-rewrite all-low": [*AMP, "--range-check", "off", "--policy", "all-low"],
    "onnxconverter-common": [sys.executable, str(ROOT / "benchmarks" / "peer_convert.py"), "occ"],
    "ort float16": [sys.executable, str(ROOT / "benchmarks" / "peer_convert.py"), "ort"],
}


@dataclass
class Run:
    seconds: float
    peak_bytes: int
    """The largest resident set of one process (GNU time's %M)."""
    ok: bool
    pss_bytes: int = 0
    """The peak over time of the summed PSS of the conversion's processes."""
    casts: int | None = None
    low_flop_share: float | None = None
    error: str = ""
    stages: dict[str, float] | None = None
    """amp-rewrite's own breakdown (load, analysis, range check, rewrite, save), from its report."""


def measure(command: list[str], timeout: float) -> Run:
    """Wall time, peak RSS and peak summed PSS of a conversion, from two runs: the PSS sampler's
    reads of /proc take CPU from what it watches (on two cores, at 48.6k nodes, 0.7 s of 3.6 from
    amp-rewrite, whose range check runs a child beside it, and 0.3-0.4 s of 3.3-3.6 from ONNX
    Runtime's script), so the time and the peak RSS are those of a second run that nothing
    watches (its output and report are the ones analysed), the peak PSS that of the first."""
    sampled = _run(command, timeout, sample=True)
    if not sampled.ok:
        return sampled
    timed = _run(command, timeout, sample=False)
    timed.pss_bytes = sampled.pss_bytes
    return timed


def _run(command: list[str], timeout: float, sample: bool) -> Run:
    """One run of ``command``: wall time, peak RSS, and (``sample``) the peak summed PSS. GNU time
    starts it from a small process: a child forked straight from this one would inherit this
    process's RSS as its peak."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report, tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        timer = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", report.name, *command],
                                 stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
        pss = 0
        try:
            while sample and timer.poll() is None:
                if time.perf_counter() - started > timeout:
                    raise subprocess.TimeoutExpired(command, timeout)
                pss = max(pss, sum(_pss(pid) for pid in _descendants(timer.pid)))
                time.sleep(SAMPLE_SECONDS)
            timer.wait(max(timeout - (time.perf_counter() - started), 0))
        except subprocess.TimeoutExpired:
            os.killpg(timer.pid, signal.SIGKILL)  # the converter and its children too
            timer.wait()
            return Run(timeout, 0, False, error=f"timed out after {timeout:.0f} s")
        seconds = time.perf_counter() - started
        peak_kib = int(report.read().strip().splitlines()[-1])
        errors.seek(0)
        error = errors.read().decode(errors="replace").strip().splitlines()
    ok = timer.returncode == 0
    return Run(seconds, peak_kib * 1024, ok, pss, error="" if ok else (error[-1] if error else "failed"))


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (GNU time's child, and that one's children, forked or not)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone since it was listed
            continue
        for thread in threads:
            try:
                children = [int(c) for c in Path(f"/proc/{parent}/task/{thread}/children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _pss(pid: int) -> int:
    """Bytes of the process's proportional set size (0 once it is gone)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")), 0)


def analyse_output(source: Path, output: Path, run: Run) -> None:
    """Casts inserted and the low-precision share of matrix FLOPs in the output."""
    before = onnx.load(str(source), load_external_data=False)
    after = onnx.load(str(output), load_external_data=False)
    run.casts = sum(n.op_type == "Cast" for n in after.graph.node) - sum(n.op_type == "Cast" for n in before.graph.node)
    inferred = onnx.shape_inference.infer_shapes(after)
    infos = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.input,
                                                 *inferred.graph.output)}
    for t in inferred.graph.initializer:
        infos[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)).tensor_type
    low = total = 0.0
    for node in inferred.graph.node:
        flops = _matrix_flops(node, infos)
        if flops:
            total += flops
            if infos[node.output[0]].elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
                low += flops
    run.low_flop_share = low / total if total else None


def _dims(tensor_type) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else BINDINGS.get(d.dim_param, 1) for d in tensor_type.shape.dim]


def _matrix_flops(node: onnx.NodeProto, infos) -> float:
    if node.op_type not in ("MatMul", "Gemm", "Conv") or node.output[0] not in infos:
        return 0.0
    out = _dims(infos[node.output[0]])
    if node.op_type == "Conv":
        weight = _dims(infos[node.input[1]])
        return 2.0 * math.prod(out) * math.prod(weight[1:])
    a = _dims(infos[node.input[0]])
    transposed = node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute)
    k = a[-2] if transposed else a[-1]
    return 2.0 * math.prod(out) * k


def build_models(sizes: list[int]) -> list[tuple[str, Path, int]]:
    WORK.mkdir(parents=True, exist_ok=True)
    models = []
    for target in sizes:
        blocks = max(1, round(target / NODES_PER_BLOCK))
        for variant, kwargs in (("plain", {}), ("mask+outputs", dict(with_mask=True, expose_blocks=True))):
            path = WORK / f"transformer_{target}_{variant.replace('+', '_')}.onnx"
            if not path.exists():
                onnx.save(builders.transformer(blocks=blocks, width=32, **kwargs), path)
            nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
            models.append((f"{nodes} nodes, {variant}", path, path.stat().st_size))
            NODES[models[-1][0]] = nodes
    return models


def build_big(gigabytes: float) -> tuple[str, Path, int]:
    path = WORK / "transformer_big.onnx"
    data = Path(str(path) + ".data")
    if not path.exists() or not data.exists():
        builders.large_transformer(path, int(gigabytes * 2**30))
    size = path.stat().st_size + data.stat().st_size
    return (f"{size / 2**30:.2f} GB, external data", path, size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,5000,20000,50000")
    parser.add_argument("--big-gb", type=float, default=2.2)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    models = build_models([int(s) for s in args.sizes.split(",")])
    if not args.skip_big:
        models.append(build_big(args.big_gb))
    rows = []
    for label, path, size in models:
        for tool, command in TOOLS.items():
            output = WORK / f"out_{path.stem}_{tool.split()[0]}_{len(rows)}.onnx"
            report = WORK / f"report_{len(rows)}.json"
            ours = ["-o", str(output), "--report", str(report)] if tool.startswith("amp") else [str(output)]
            run = measure([*command, str(path), *ours], args.timeout)
            if run.ok:
                analyse_output(path, output, run)
                if report.exists():
                    run.stages = json.loads(report.read_text()).get("stages")
            for leftover in (output, Path(str(output) + ".data"), report):
                leftover.unlink(missing_ok=True)
            rows.append((label, size, tool, run))
            print(f"{label:34} {tool:30} {run.seconds:8.2f} s {run.peak_bytes / 2**20:8.0f} MiB RSS "
                  f"{run.pss_bytes / 2**20:8.0f} MiB PSS "
                  f"casts={run.casts} low-flops={run.low_flop_share} {run.error}", flush=True)
    write_results(rows)


def write_results(rows) -> None:
    head = [
        results.TITLE,
        "",
        f"{results.machine()}, onnx {onnx.__version__}. Produced by `make bench` (benchmarks/run.py); every "
        "figure is one run.",
        "",
        "Time is the whole process (start-up, load, convert, save), in a run that nothing watches but GNU "
        "time; the PSS sampler below takes CPU from what it watches, so the peak PSS comes from a run of "
        "its own, just before. Memory, two ways: *peak RSS* is GNU "
        "time's maximum resident set, the largest of any one process of the conversion (amp-rewrite's range "
        "check runs ONNX Runtime in forked child processes, and a child's resident set counts the pages it "
        "still shares with its parent, so this overstates what the machine holds); *peak PSS* is the peak "
        "over time of the proportional set sizes summed over the conversion's processes (sampled every "
        f"{SAMPLE_SECONDS * 1000:.0f} ms from /proc/PID/smaps_rollup), which counts a shared page once in "
        "all: the memory the conversion takes from the machine. For one process the two are about equal.",
        "Low FLOPs: share of MatMul/Gemm/Conv work whose output is float16 (batch 1, sequence 128).",
        "",
        "| model | tool | seconds | peak RSS MiB | peak PSS MiB | peak RSS / model size | casts | low FLOPs | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, size, tool, run in rows:
        share = "" if run.low_flop_share is None else f"{run.low_flop_share:.1%}"
        head.append(f"| {label} | {tool} | {run.seconds:.2f} | {run.peak_bytes / 2**20:.0f} | "
                    f"{run.pss_bytes / 2**20:.0f} | "
                    f"{run.peak_bytes / size:.2f} | {'' if run.casts is None else run.casts} | {share} | "
                    f"{run.error} |")
    ratios = ["Speed: the faster peer's seconds over amp-rewrite's (above 1: amp-rewrite is faster); "
              "seconds per 1k nodes for linearity; memory: peak RSS and peak PSS over the target 1.5x model "
              "size + 200 MB (at most 1 meets it).", "",
              "| model | amp-rewrite | no range check | s / 1k nodes | s / 1k nodes, no check | "
              "RSS / target | PSS / target | RSS / target, no check | PSS / target, no check |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    breakdown = ["Seconds by stage, from amp-rewrite's report (`stages`); the rest of the wall time is "
                 "Python's start-up, imports and the report. The range check measures in a child process "
                 "that starts once the model is loaded, beside the analysis, the rewrite and the save: its "
                 "column is what the conversion spent on it besides (choosing the values to judge, waiting "
                 "for the measurement, judging).", "",
                 "| model | tool | load | analysis | range check | rewrite | save | wall |",
                 "|---|---|---:|---:|---:|---:|---:|---:|"]
    by_model: dict[str, dict[str, Run]] = {}
    sizes: dict[str, int] = {}
    for label, size, tool, run in rows:
        by_model.setdefault(label, {})[tool] = run
        sizes[label] = size
        if run.stages:
            cells = " | ".join(f"{run.stages.get(k, 0.0):.2f}" for k in ("load", "analysis", "range check",
                                                                          "rewrite", "save"))
            breakdown.append(f"| {label} | {tool} | {cells} | {run.seconds:.2f} |")
    for label, runs in by_model.items():
        peers = [r.seconds for t, r in runs.items() if not t.startswith("amp") and r.ok]
        on, off = runs["amp-rewrite"], runs["amp-rewrite (no range check)"]
        target = 1.5 * sizes[label] + MEMORY_SLACK
        speed = [f"{min(peers) / r.seconds:.2f}x" if peers else "" for r in (on, off)]
        per_k = [f"{r.seconds / NODES[label] * 1000:.3f}" if label in NODES else "" for r in (on, off)]
        memory = [f"{b / target:.2f}" for r in (on, off) for b in (r.peak_bytes, r.pss_bytes)]
        ratios.append(f"| {label} | {' | '.join(speed + per_k + memory)} |")
    results.write(head, {"Speed ratios (faster peer / amp-rewrite)": ratios, "Stage breakdown": breakdown})
    print("wrote benchmarks/RESULTS.md")

if __name__ == "__main__":
    main()
