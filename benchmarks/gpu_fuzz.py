"""The fuzz test's NaN/Inf property on a real GPU: converted random graphs run in float16 on
ONNX Runtime's CUDA provider gain no NaN or Inf where float32 has finite values.

``tests/test_fuzz.py`` checks this property with float16 storage emulated on the CPU (``check``'s
emulation). Real CUDA kernels may differ: float16 arithmetic inside a kernel, ONNX Runtime's
fusions at its default optimization level, Sigmoid computed by the device. Two steps:

    python benchmarks/gpu_fuzz.py prepare --examples 600 --out benchmarks/work/gpu_fuzz   # here (CPU)
    python benchmarks/gpu_fuzz.py run --cases benchmarks/work/gpu_fuzz --out $OUT/gpu_fuzz.json  # on the GPU

``prepare`` draws derandomized examples from ``models/fuzzgraphs.examples`` (as ``make test`` does,
under another seed), converts each with its own feeds as the range check's inputs (as the fuzz
test does), and keeps those where the range check ran: the float32 model, the converted one, the
one converted with ``--range-check off`` (to show what the check prevents) and the feeds, in
one compressed .npz per case, with the emulated run's new non-finite count. ``run`` runs the
models on ``--provider`` (default CUDA, at ONNX Runtime's default optimizations; TF32 off)
and counts the output elements finite in float32 and not in each converted model, and each
one's relative L2 error against float32 there; it prints one line per case where a converted
model gains any or fails (every case's with ``--each``), and a summary. ``torch_exports.py
cases`` writes real exporters' models in the same form (with the ORT float16 script's output).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CASE_SECONDS = 300
"""How long one case's models may take to load and run, before it counts as hung."""


def prepare(examples: int, out: Path) -> None:
    import onnx
    from hypothesis import HealthCheck, Phase, given, settings

    from amp_rewrite import convert
    from amp_rewrite.runtime.emulate import emulated
    from models.fuzz import range_check_ran, run
    from models.fuzzgraphs import examples as drawn

    out.mkdir(parents=True, exist_ok=True)
    kept = skipped = 0

    @settings(derandomize=True, max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(drawn())
    def each(example) -> None:
        nonlocal kept, skipped
        expected = run(example.model, example.feeds)
        converted, report = convert(example.model, inputs=[example.feeds])
        if not range_check_ran(report):
            skipped += 1
            return
        observed = run(emulated(converted), example.feeds)
        emulated_new = sum(int((np.isfinite(w) & ~np.isfinite(g)).sum()) for w, g in zip(expected, observed))
        unchecked, _ = convert(example.model, range_check="off")
        models = {"fp32": example.model, "mixed": converted, "unchecked": unchecked}
        np.savez_compressed(out / f"case_{kept:04d}.npz", emulated_new=np.int64(emulated_new),
                            **{kind: np.frombuffer(m.SerializeToString(), np.uint8) for kind, m in models.items()},
                            **{f"feed_{name}": array for name, array in example.feeds.items()})
        kept += 1

    each()
    print(f"kept {kept} cases where the range check ran ({skipped} skipped), onnx {onnx.__version__}, in {out}")


def _session(model: bytes, provider: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    provider_options = {"use_tf32": "0"} if provider == "CUDAExecutionProvider" else {}
    made = ort.InferenceSession(model, options, providers=[(provider, provider_options)])
    if provider not in made.get_providers():
        raise RuntimeError(f"{provider} did not start: {made.get_providers()}")
    return made


def _outputs(model: bytes, feeds: dict, provider: str) -> list[np.ndarray]:
    return [np.asarray(w) for w in _session(model, provider).run(None, feeds)]


def _measured(models: dict[str, bytes], feeds: dict, provider: str, wants: list | None = None) -> dict:
    """Per model: its new non-finite output elements and the relative L2 error of its worst output
    against ``wants`` (by default float32's outputs, run first), or why it did not run."""
    results = {}
    if wants is None:
        try:
            wants = _outputs(models["fp32"], feeds, provider)
        except Exception as exc:  # float32 itself does not run there: nothing to compare with
            return {"fp32": {"failed": str(exc).splitlines()[0][:300]}}
    for kind, model in models.items():
        if kind == "fp32":
            continue
        try:
            gots = [got.astype(np.float32) for got in _outputs(model, feeds, provider)]
        except Exception as exc:  # a model the provider refuses is a finding too
            results[kind] = {"failed": str(exc).splitlines()[0][:300]}
            continue
        results[kind] = {
            "new_nonfinite": sum(int((np.isfinite(w) & ~np.isfinite(g)).sum()) for w, g in zip(wants, gots)),
            "rel_l2": max((float(np.linalg.norm(np.nan_to_num(g - w)) / max(float(np.linalg.norm(w)), 1e-30))
                           for w, g in zip(wants, gots) if np.issubdtype(w.dtype, np.floating)), default=0.0)}
    return {"elements": int(sum(w.size for w in wants)), **results}


def _case(path: Path) -> tuple[dict, dict[str, bytes], dict]:
    """A case file's row head (its name, the emulated count of fuzz cases), models and feeds."""
    with np.load(path) as case:
        feeds = {key[len("feed_"):]: case[key] for key in case.files if key.startswith("feed_")}
        models = {key: case[key].tobytes() for key in case.files if not key.startswith("feed_")
                  and key != "emulated_new"}
        head = {"case": path.stem, **({"emulated": int(case["emulated_new"])} if "emulated_new" in case else {})}
    return head, models, feeds


def _run_from(paths: list[Path], provider: str, rows: Path) -> None:
    """Each case in turn, in this one process; a line of JSON per case appended to ``rows``."""
    with rows.open("a") as out:
        for path in paths:
            head, models, feeds = _case(path)
            out.write(json.dumps({**head, **_measured(models, feeds, provider)}) + "\n")
            out.flush()


def _each_alone(path: Path, provider: str) -> dict:
    """The case whose models crashed the process: each model in a child of its own, to say which."""
    from amp_rewrite.runtime.isolate import NativeFailure, isolated

    head, models, feeds = _case(path)
    try:
        wants = isolated(lambda progress: _outputs(models["fp32"], feeds, provider), path.stem, timeout=CASE_SECONDS)
    except NativeFailure as exc:
        return {**head, "fp32": {"failed": f"crashed: {exc}"}}
    row = {**head, "elements": int(sum(w.size for w in wants))}
    for kind in models.keys() - {"fp32"}:
        try:
            row.update(isolated(lambda progress, kind=kind: _measured({kind: models[kind]}, feeds, provider, wants),
                                f"{path.stem} {kind}", timeout=CASE_SECONDS))
        except NativeFailure as exc:
            row[kind] = {"failed": f"crashed: {exc}"}
    return row


def run_cases(cases: Path, provider: str, out: Path | None, each: bool = False) -> None:
    """Each case's models on ``provider``. A case holds ``fp32`` and any converted models (``mixed``,
    ``unchecked``, ``peer``: every array not a ``feed_`` or ``emulated_new``). Per converted model:
    whether the provider loads and runs it, the output elements finite in float32 and not in it,
    and the relative L2 error of its worst output against float32 on the same provider.
    The cases run one after another in a child process; where ONNX Runtime crashes it (its CPU
    provider segfaults on some float16 graphs), that case's models run each alone to say which
    crashed, and a new child goes on from the next case."""
    import tempfile

    import onnxruntime as ort

    from amp_rewrite.runtime.isolate import NativeFailure, isolated

    started = time.perf_counter()
    paths = sorted(cases.glob("case_*.npz"))
    with tempfile.TemporaryDirectory() as folder:
        lines = Path(folder) / "rows.jsonl"
        lines.touch()
        done = 0
        while done < len(paths):
            try:
                isolated(lambda progress, rest=paths[done:]: _run_from(rest, provider, lines), "cases", timeout=None)
                break
            except NativeFailure:
                done = len(lines.read_text().splitlines())
                with lines.open("a") as appended:
                    appended.write(json.dumps(_each_alone(paths[done], provider)) + "\n")
                done += 1
        rows = [json.loads(line) for line in lines.read_text().splitlines()]
    for row in rows:
        results = [value for value in row.values() if isinstance(value, dict)]
        if each or row.get("emulated") or any("failed" in v or v["new_nonfinite"] for v in results):
            print(json.dumps(row), flush=True)
    kinds = sorted({key for row in rows for key, value in row.items() if isinstance(value, dict)} - {"fp32"})
    summary = {"provider": provider, "onnxruntime": ort.__version__, "cases": len(rows),
               "float32_failed": sum(1 for row in rows if "fp32" in row),
               **{kind: {"failed": sum(1 for row in rows if "failed" in row.get(kind, {})),
                         "with_new_nonfinite": sum(1 for row in rows if row.get(kind, {}).get("new_nonfinite")),
                         "worst_rel_l2": max((row[kind]["rel_l2"] for row in rows if "rel_l2" in row.get(kind, {})),
                                             default=None)} for kind in kinds},
               "with_new_nonfinite_emulated": sum(1 for row in rows if row.get("emulated")),
               "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    if out is not None:
        out.write_text(json.dumps({"summary": summary, "cases": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    made = steps.add_parser("prepare")
    made.add_argument("--examples", type=int, default=600)
    made.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "work" / "gpu_fuzz")
    ran = steps.add_parser("run")
    ran.add_argument("--cases", type=Path, default=ROOT / "benchmarks" / "work" / "gpu_fuzz")
    ran.add_argument("--provider", default="CUDAExecutionProvider")
    ran.add_argument("--out", type=Path)
    ran.add_argument("--each", action="store_true", help="print every case's line, not only the findings")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.examples, args.out)
    else:
        run_cases(args.cases, args.provider, args.out, args.each)


if __name__ == "__main__":
    main()
