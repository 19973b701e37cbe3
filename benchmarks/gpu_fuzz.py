"""The fuzz test's NaN/Inf property on a real GPU: converted random graphs run in float16 on
ONNX Runtime's CUDA provider gain no NaN or Inf where float32 has finite values.

``tests/test_fuzz.py`` checks this property with float16 storage emulated on the CPU (``check``'s
emulation). Real CUDA kernels may differ: float16 arithmetic inside a kernel, ONNX Runtime's
fusions at its default optimization level, Sigmoid computed by the device. Two steps:

    python benchmarks/gpu_fuzz.py prepare --examples 600 --out benchmarks/work/gpu_fuzz   # here (CPU)
    python benchmarks/gpu_fuzz.py run --cases benchmarks/work/gpu_fuzz --out $OUT/gpu_fuzz.json  # on the GPU

``prepare`` draws derandomized examples from ``tests/fuzzgraphs.examples`` (as ``make test`` does,
under another seed), converts each with its own feeds as the range check's inputs (as the fuzz
test does), and keeps those where the range check ran: the float32 model, the converted one, the
one converted with ``--range-check off`` (to show what the check prevents) and the feeds, in
one compressed .npz per case, with the emulated run's new non-finite count. ``run`` runs the
models on ``--provider`` (default CUDA, at ONNX Runtime's default optimizations; TF32 off)
and counts the output elements finite in float32 and not in each converted model; it prints
one line per case where the checked conversion gains any, and a summary.
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
MIXED = ("mixed", "unchecked")
"""The converted models of each case: with the range check (on the case's feeds), and without it."""


def prepare(examples: int, out: Path) -> None:
    import onnx
    from hypothesis import HealthCheck, Phase, given, settings

    from amp_rewrite import convert
    from amp_rewrite.runtime.emulate import emulated
    from tests.fuzzgraphs import examples as drawn
    from tests.test_fuzz import range_check_ran, run

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


def run_cases(cases: Path, provider: str, out: Path | None) -> None:
    import onnxruntime as ort

    def session(model: bytes):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        provider_options = {"use_tf32": "0"} if provider == "CUDAExecutionProvider" else {}
        return ort.InferenceSession(model, options, providers=[(provider, provider_options)])

    started = time.perf_counter()
    rows, failed = [], []
    for path in sorted(cases.glob("case_*.npz")):
        with np.load(path) as case:
            feeds = {key[len("feed_"):]: case[key] for key in case.files if key.startswith("feed_")}
            models = {kind: case[kind].tobytes() for kind in ("fp32", *MIXED)}
            emulated_new = int(case["emulated_new"])
        try:
            sessions = {kind: session(model) for kind, model in models.items()}
            if provider not in sessions["mixed"].get_providers():
                raise RuntimeError(f"{provider} did not start: {sessions['mixed'].get_providers()}")
            results = {kind: s.run(None, feeds) for kind, s in sessions.items()}
        except Exception as exc:  # a model the provider refuses is a finding too
            failed.append({"case": path.name, "error": str(exc).splitlines()[0][:300]})
            print(f"{path.name}: failed: {failed[-1]['error']}", flush=True)
            continue
        row = {"case": path.name, "emulated": emulated_new, "elements": int(sum(w.size for w in results["fp32"]))}
        for kind in MIXED:
            row[kind] = sum(int((np.isfinite(w) & ~np.isfinite(np.asarray(g, np.float32))).sum())
                            for w, g in zip(results["fp32"], results[kind]))
        rows.append(row)
        if row["mixed"] or emulated_new:
            print(f"{path.name}: {row['mixed']} new non-finite elements on {provider}, {emulated_new} emulated",
                  flush=True)
    summary = {"provider": provider, "onnxruntime": ort.__version__, "cases": len(rows) + len(failed),
               "ran": len(rows), "failed": len(failed),
               **{f"with_new_nonfinite_{kind}": sum(1 for r in rows if r[kind]) for kind in (*MIXED, "emulated")},
               "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    if out is not None:
        out.write_text(json.dumps({"summary": summary, "cases": rows, "failed": failed}, indent=1))


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
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.examples, args.out)
    else:
        run_cases(args.cases, args.provider, args.out)


if __name__ == "__main__":
    main()
