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
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_rewrite import convert  # noqa: E402
from amp_rewrite.numerics.check import run_model  # noqa: E402
from amp_rewrite.runtime import samples  # noqa: E402
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


def cases(quick: bool) -> list[Case]:
    if quick:
        light = [n for n in LIGHT_NAMES if n == "squeezenet"]
        return ([Case(f"{n} b1", _light(n, 1)) for n in light]
                + [Case("encoder b2", _encoder(2, blocks=2, width=128, heads=4, seq=32)),
                   Case("seed_cnn b4", _seed_cnn(4, image_size=64))])
    return ([Case(f"{n} b{b}", _light(n, b)) for n in LIGHT_NAMES for b in (1, 32)]
            + [Case(f"encoder b{b}", _encoder(b)) for b in (1, 32)]
            + [Case(f"seed_cnn b{b}", _seed_cnn(b)) for b in (32, 128, 512)])


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


def run_case(case: Case, provider: str, folder: Path, warmup: int, runs: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    model, shapes = case.build()
    source = folder / "float32.onnx"
    onnx.save(model, source)
    ours = folder / "amp-rewrite.onnx"
    _, report = convert(str(source), str(ours), default_options(provider))
    peers, missing = peer_outputs(source, folder)
    result = bench(str(source), [str(ours), *map(str, peers)], provider=provider, shapes=shapes, warmup=warmup,
                   runs=runs)
    sample = samples.generate(model, 1, shapes)[0]
    return {"case": case.name, "nodes": len(model.graph.node), "conversion": report.summary().splitlines()[0],
            "peers_missing": missing, "bench": dataclasses.asdict(result),
            "emulation_ulps": emulation_ulps(ours, provider, sample)}


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
            f"{max(r['emulation_ulps'].values(), default=0.0):.1f}", ours["verdict"].split(";")[0]]) + " |")
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="CUDAExecutionProvider")
    parser.add_argument("--quick", action="store_true", help="small sizes of a few cases, for a CPU")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="cases whose name has NAME")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "work" / "gpu"))
    args = parser.parse_args()
    out = Path(args.out)
    chosen = [c for c in cases(args.quick) if not args.only or any(o in c.name for o in args.only)]
    results = []
    for case in chosen:
        print(f"{case.name} ...", flush=True)
        results.append(run_case(case, args.provider, out / "cases" / case.name.replace(" ", "_"), args.warmup,
                                args.runs))
        (out / "gpu_bench.json").write_text(json.dumps(results, indent=2))
    import onnxruntime as ort

    machine = f"{platform.node()}, {platform.processor() or platform.machine()}, onnxruntime {ort.__version__}"
    head = ["| case | float32 ms (TF32 off) | float32 ms (TF32 on) | amp-rewrite ms | "
            + " | ".join(f"{p} ms" for p in PEERS) + " | amp-rewrite / fastest peer speed | emulation ulps | verdict |",
            "|---" * (7 + len(PEERS)) + "|"]
    rows, targets = summary(results)
    text = "\n".join([f"# GPU benchmark ({args.provider}, {datetime.date.today()}, {machine})", "",
                      "Median latency of one run with I/O binding; speed-up over float32 with TF32 off.", "",
                      *head, *rows, "", *(f"- {t}" for t in targets or ["targets: nothing to report"])])
    (out / "gpu_bench.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
