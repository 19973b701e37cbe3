"""Does amp-rewrite's output pay on a GPU, against float32 and the peer converters' outputs?

    python benchmarks/gpu_bench.py [--provider P] [--quick] [--only NAME] [--runs N] [--out DIR]

Cases: onnx's light models with random weights (ResNet-50, DenseNet-121, Inception v1/v2,
VGG-19, SqueezeNet, ShuffleNet) at batch 1 and 32; a BERT-base-sized encoder from models/
(12 layers, hidden 768, 12 heads, sequence 128) at batch 1 and 32; the seed CNN at batch 32
to 512. Each case is one ``amp_rewrite.workflows.bench.bench`` run on the provider (CUDA by
default): float32 with TF32 off (the baseline) and on, amp-rewrite's output (default options)
and the peers' outputs (ONNX Runtime's float16 script and onnxconverter-common, converted as
their users do by benchmarks/peer_convert.py; a peer that is not installed is left out and
said so), side by side with the same inputs, warm-up and runs.

Targets checked: amp-rewrite at least TARGET_SPEEDUP x float32 (TF32 off) for ResNet-50 and
the encoder at batch 32, and at least TARGET_VS_PEER x the fastest peer's speed everywhere.
Then the agreement of ``check``'s CPU emulation with the provider's own low-precision run of
amp-rewrite's output on the same sample: the largest difference per output, in float16 ulps
of the output's largest magnitude.

Full results: DIR/gpu_bench.json and DIR/gpu_bench.md (DIR: --out, else $OUT, else
benchmarks/work/gpu); a short table is printed last. ``--quick`` runs small sizes of a few
cases on any provider, to try the script where there is no GPU.

A GPU is lent for minutes, so the CPU work runs apart from the timing: the models and their
conversions are made by ``--jobs`` processes side by side into ``--work`` (kept there: a
later run reuses them, and ``--prepare-only`` stops after making them), the cases are timed
one after another in priority order (the targets' cases first) until ``--deadline`` seconds
have passed, and the emulation agreement, measured on the batch-1 cases, runs side by side
at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_rewrite import convert  # noqa: E402
from amp_rewrite.inputs import samples  # noqa: E402
from amp_rewrite.numerics.check import run_model  # noqa: E402
from amp_rewrite.workflows.bench import bench, default_options  # noqa: E402
from models import builders  # noqa: E402
from models.light import LIGHT, randomize_weights, with_batch  # noqa: E402

TARGET_SPEEDUP = 1.8
TARGET_SPEEDUP_CASES = ("resnet50 b32", "encoder b32")
TARGET_VS_PEER = 0.95
PEERS = {"ort-float16": ("ort", "onnxruntime.transformers.float16"),
         "onnxconverter-common": ("occ", "onnxconverter_common")}
LIGHT_NAMES = ("resnet50", "densenet121", "inception_v1", "inception_v2", "vgg19", "squeezenet", "shufflenet")


@dataclasses.dataclass
class Case:
    name: str
    build: object
    """() -> (model, shapes of its generated inputs)."""
    emulate: bool = False
    """Whether the emulation agreement is measured on it (the batch-1 cases: the CPU runs it)."""


def cases(quick: bool) -> list[Case]:
    """In the order they are timed: the targets' cases first, then by how much they tell."""
    if quick:
        return [Case("squeezenet b1", _light("squeezenet", 1), emulate=True),
                Case("encoder b2", _encoder(2, blocks=2, width=128, heads=4, seq=32), emulate=True),
                Case("seed_cnn b4", _seed_cnn(4, image_size=64), emulate=True)]
    first = [Case("resnet50 b32", _light("resnet50", 32)), Case("encoder b32", _encoder(32)),
             Case("resnet50 b1", _light("resnet50", 1), emulate=True), Case("encoder b1", _encoder(1), emulate=True)]
    rest = ([Case(f"{n} b32", _light(n, 32)) for n in LIGHT_NAMES if n != "resnet50"]
            + [Case(f"seed_cnn b{b}", _seed_cnn(b)) for b in (32, 128, 512)]
            + [Case(f"{n} b1", _light(n, 1), emulate=True) for n in LIGHT_NAMES if n != "resnet50"])
    return first + rest


def _light(name: str, batch: int):
    def build():
        path = next(p for p in LIGHT if os.path.basename(p) == f"light_{name}.onnx")
        return with_batch(randomize_weights(onnx.load(path)), batch), {}
    return build


def _encoder(batch: int, blocks: int = 12, width: int = 768, heads: int = 12, seq: int = 128):
    return lambda: (builders.transformer(blocks=blocks, width=width, heads=heads, seq=seq),
                    {"hidden_in": (batch, seq, width)})


def _seed_cnn(batch: int, image_size: int = 256):
    return lambda: (builders.seed_cnn(image_size=image_size), {"image": (batch, 3, image_size, image_size)})


def peer_outputs(source: Path, folder: Path) -> tuple[list[Path], list[str]]:
    made, missing = [], []
    for label, (tool, module) in PEERS.items():
        target = folder / f"{label}.onnx"
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_convert.py"), tool, str(source),
                               str(target)], capture_output=True, text=True)
        if done.returncode == 0:
            made.append(target)
        else:
            missing.append(f"{label} ({module}): {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return made, missing


def emulation_ulps(mixed: Path, provider: str, sample: dict) -> dict[str, float]:
    """Per output: max |provider's run - CPU emulation| in float16 ulps of the output's largest magnitude."""
    model = onnx.load(mixed, load_external_data=False)
    native = run_model(model, str(mixed.parent), provider, [sample], what="mixed model (native)").results[0]
    emulated = run_model(model, str(mixed.parent), "CPUExecutionProvider", [sample], emulate=True,
                         what="mixed model (emulated)").results[0]
    ulps = {}
    for name, want in emulated.items():
        want, got = np.asarray(want, np.float64), np.asarray(native[name], np.float64)
        finite = np.isfinite(want) & np.isfinite(got)
        scale = float(np.spacing(np.float16(np.abs(want[finite]).max(initial=0.0))))
        ulps[name] = float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / max(scale, 2.0**-24)
    return ulps


def _folder(work: Path, case: Case) -> Path:
    return work / case.name.replace(" ", "_")


def prepare(case: Case, provider: str, folder: Path) -> dict:
    """The case's float32 model, amp-rewrite's output and the peers' outputs in ``folder``, and
    what timing them needs (made once: kept in ``folder`` for a later run)."""
    made = folder / "prepared.json"
    if made.exists():
        return json.loads(made.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    model, shapes = case.build()
    source = folder / "float32.onnx"
    onnx.save(model, source)
    _, report = convert(str(source), str(folder / "amp-rewrite.onnx"), default_options(provider))
    peers, missing = peer_outputs(source, folder)
    prepared = {"nodes": len(model.graph.node), "conversion": report.summary().splitlines()[0],
                "peers": [p.name for p in peers], "peers_missing": missing,
                "shapes": {name: list(dims) for name, dims in shapes.items()}}
    made.write_text(json.dumps(prepared))
    return prepared


def _named(name: str, quick: bool) -> Case:
    """A case by name, for a pool's process (a case's builder does not pickle)."""
    return next(c for c in cases(quick) if c.name == name)


def _prepare_named(name: str, quick: bool, provider: str, work: str) -> dict:
    """``prepare`` in a pool's process."""
    case = _named(name, quick)
    return prepare(case, provider, _folder(Path(work), case))


def run_case(case: Case, prepared: dict, provider: str, folder: Path, warmup: int, runs: int) -> dict:
    result = bench(str(folder / "float32.onnx"), [str(folder / "amp-rewrite.onnx"),
                                                  *(str(folder / p) for p in prepared["peers"])],
                   provider=provider, shapes=prepared["shapes"], warmup=warmup, runs=runs)
    return {"case": case.name, "nodes": prepared["nodes"], "conversion": prepared["conversion"],
            "peers_missing": prepared["peers_missing"], "bench": dataclasses.asdict(result)}


def _emulation_named(name: str, quick: bool, provider: str, work: str) -> dict[str, float]:
    """``emulation_ulps`` of a prepared case, in a pool's process, on one generated sample."""
    folder = _folder(Path(work), _named(name, quick))
    prepared = json.loads((folder / "prepared.json").read_text())
    model = onnx.load(folder / "float32.onnx", load_external_data=False)
    sample = samples.generate(model, 1, prepared["shapes"])[0]
    return emulation_ulps(folder / "amp-rewrite.onnx", provider, sample)


def summary(results: list[dict]) -> tuple[list[str], list[str]]:
    """The table's rows and the targets' lines."""
    rows, targets = [], []
    for r in results:
        models = {m["label"]: m for m in r["bench"]["models"]}
        base = r["bench"]["models"][0]
        ours = models["amp-rewrite.onnx"]
        peers = [m for label, m in models.items() if label.removesuffix(".onnx") in PEERS]
        best_peer = min(peers, key=lambda m: m["median_ms"]) if peers else None
        vs_peer = best_peer["median_ms"] / ours["median_ms"] if best_peer else None
        tf32 = models.get("float32 (TF32 on)")
        rows.append("| " + " | ".join([
            r["case"], f"{base['median_ms']:.3f}", f"{tf32['median_ms']:.3f}" if tf32 else "-",
            f"{ours['median_ms']:.3f} ({ours['speedup']:.2f}x)",
            *(_cell(models.get(p + ".onnx"), r["bench"]["failed"].get(p + ".onnx")) for p in PEERS),
            f"{vs_peer:.2f}" if vs_peer else "-",
            f"{max(r['emulation_ulps'].values(), default=0.0):.1f}" if "emulation_ulps" in r else "-",
            ours["verdict"].split(";")[0]]) + " |")
        if r["case"] in TARGET_SPEEDUP_CASES:
            met = ours["speedup"] >= TARGET_SPEEDUP
            targets.append(f"{r['case']}: {ours['speedup']:.2f}x over float32 (TF32 off), target {TARGET_SPEEDUP}x: "
                           f"{'met' if met else 'MISSED'}")
        if vs_peer is not None and vs_peer < TARGET_VS_PEER:
            targets.append(f"{r['case']}: {vs_peer:.2f}x the speed of {best_peer['label']}, target {TARGET_VS_PEER}x: "
                           f"MISSED ({ours['verdict']})")
    return rows, targets


def _cell(model: dict | None, failure: str | None) -> str:
    if model:
        return f"{model['median_ms']:.3f} ({model['speedup']:.2f}x)"
    return "does not run: " + failure.split(": ", 2)[-1][:80] if failure else "-"


def main() -> None:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="CUDAExecutionProvider")
    parser.add_argument("--quick", action="store_true", help="small sizes of a few cases, for a CPU")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="cases whose name has NAME")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "work" / "gpu"))
    parser.add_argument("--work", help="where the prepared models are kept (default: OUT/cases)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes preparing side by side")
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument("--deadline", type=float, default=float("inf"),
                        help="seconds after which no further case is timed")
    args = parser.parse_args()
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "cases"
    out.mkdir(parents=True, exist_ok=True)
    chosen = [c for c in cases(args.quick) if not args.only or any(o in c.name for o in args.only)]
    spawn = multiprocessing.get_context("spawn")  # the pool's processes start CUDA of their own
    with ProcessPoolExecutor(max(1, min(args.jobs, len(chosen))), mp_context=spawn) as pool:
        futures = {c.name: pool.submit(_prepare_named, c.name, args.quick, args.provider, str(work)) for c in chosen}
        prepared = {}
        for name, future in futures.items():
            try:
                prepared[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - a case that cannot be prepared is reported, not fatal
                print(f"{name}: not prepared: {type(exc).__name__}: {exc}", flush=True)
    print(f"prepared {len(prepared)} of {len(chosen)} cases in {time.monotonic() - started:.0f} s", flush=True)
    if args.prepare_only:
        return
    results, unrun = [], []
    for case in chosen:
        if case.name not in prepared or time.monotonic() - started > args.deadline:
            unrun.append(case.name)
            continue
        print(f"{case.name} ...", flush=True)
        try:
            results.append(run_case(case, prepared[case.name], args.provider, _folder(work, case), args.warmup,
                                    args.runs))
        except Exception as exc:  # noqa: BLE001 - one case's failure is reported; the others still run
            unrun.append(f"{case.name} (failed: {type(exc).__name__}: {str(exc)[:200]})")
            print(unrun[-1], flush=True)
        (out / "gpu_bench.json").write_text(json.dumps(results, indent=2))
    emulated = [c.name for c in chosen if c.emulate and c.name in prepared]
    with ProcessPoolExecutor(max(1, min(args.jobs, len(emulated))), mp_context=spawn) as pool:
        ulps = {n: pool.submit(_emulation_named, n, args.quick, args.provider, str(work)) for n in emulated}
        agreement = {}
        for name, future in ulps.items():
            try:
                agreement[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - reported in the table instead of a figure
                agreement[name] = {f"failed: {type(exc).__name__}: {str(exc)[:200]}": float("nan")}
    for r in results:
        if r["case"] in agreement:
            r["emulation_ulps"] = agreement[r["case"]]
    (out / "gpu_bench.json").write_text(json.dumps({"cases": results, "emulation_ulps": agreement,
                                                    "not_timed": unrun}, indent=2))
    import onnxruntime as ort

    machine = f"{platform.node()}, {platform.processor() or platform.machine()}, onnxruntime {ort.__version__}"
    head = ["| case | float32 ms (TF32 off) | float32 ms (TF32 on) | amp-rewrite ms | "
            + " | ".join(f"{p} ms" for p in PEERS) + " | amp-rewrite / fastest peer speed | emulation ulps | verdict |",
            "|---" * (7 + len(PEERS)) + "|"]
    rows, targets = summary(results)
    agreement_lines = [f"- {n}: " + ", ".join(f"{o} {u:.1f}" for o, u in a.items()) for n, a in agreement.items()]
    text = "\n".join([f"# GPU benchmark ({args.provider}, {datetime.date.today()}, {machine})", "",
                      "Median latency of one run with I/O binding; speed-up over float32 with TF32 off.", "",
                      *head, *rows, "", *(f"- {t}" for t in targets or ["targets: nothing to report"]),
                      *([f"- not timed (deadline, not prepared or failed): {', '.join(unrun)}"] if unrun else []), "",
                      "Emulation agreement (largest |provider - CPU emulation| per output, in float16 ulps of the "
                      "output's largest magnitude):", *agreement_lines])
    (out / "gpu_bench.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
