"""make bench: milliseconds per training step, float32 vs mixed, for the seed CNN (BACKGROUND.md).

The seed experiment's table: the seed CNN on 256x256x3 images, 10 classes, AdamW, sparse
cross-entropy, batches 32 to 512. Each (batch, precision) runs in its own process:
build the step, ``--warmup`` steps, then ``--steps`` timed steps (wall clock around
``Trainer.step``, the batch already on the device, as PyTorch's is). Memory is the process's maximum resident set
(host) and, on CUDA, the device memory the process holds after the timed steps (NVML: the
device's memory in use less what was in use before the process started its work; ONNX
Runtime's arena and PyTorch's caching allocator both keep what they took, so this is their
peak, the CUDA context included).
On a machine with CUDA (onnxruntime-gpu) the steps run on the CUDA provider, and the same
network in PyTorch (autocast + GradScaler) is timed beside it when torch with CUDA is
installed. Without a GPU the figures are the CPU provider's, labelled as such: ONNX
Runtime's CPU provider has few float16 kernels, so they show the graph's cost, not the
speed-up Tensor Cores give. Writes the "Training steps" section of RESULTS.md.

    python benchmarks/train_bench.py [--batches 32,64,128,256,512] [--image-size 256] [--steps N]
        [--warmup N] [--out FILE]

``--out`` also writes the section to FILE (for a machine whose RESULTS.md does not come back).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_rewrite.runtime.timing import device_memory  # noqa: E402
from benchmarks import results  # noqa: E402
from models import builders  # noqa: E402

SECTIONS = {"CUDAExecutionProvider": "Training steps on a GPU (seed CNN)", "CPUExecutionProvider":
            "Training steps (seed CNN)"}
"""A machine without a GPU rewrites the CPU section and leaves the GPU one as measured."""
CPU_BATCHES = "32,64"
"""On the CPU, larger batches of 256x256 images take minutes per step."""
STEPS = {"CUDAExecutionProvider": (2, 10), "CPUExecutionProvider": (1, 3)}
"""Warm-up and timed steps by default, per provider."""
CHILD_TIMEOUT = 300
"""Seconds one configuration may take before it is reported as timed out."""


def provider() -> str:
    """CUDA when a session really gets it (onnxruntime-gpu lists it even without CUDA libraries)."""
    from onnx import TensorProto, helper

    from amp_rewrite import UserError
    from amp_rewrite.runtime import instrument

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    try:
        instrument.session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                           provider="CUDAExecutionProvider")
    except UserError:
        return "CPUExecutionProvider"
    return "CUDAExecutionProvider"


def _device_mib(before: int | None) -> float | None:
    now = device_memory("cuda", 0)
    return None if now is None or before is None else (now - before) / 2**20


def one(batch: int, precision: str, image_size: int, warmup: int, steps: int, batchnorm: str, where: str,
        provider_options: dict[str, str], conv_weight_grad: str = "direct", graph_mode: str = "auto",
        flat_state: str = "off") -> dict:
    """One configuration's step time; ``conv_weight_grad``, ``graph_mode`` and ``flat_state`` as ``train``
    takes them (graph mode: the step built for the batch's extents, on by default on CUDA)."""
    from amp_rewrite.runtime.step_session import MODES, fixed_extents
    from amp_rewrite.training import build
    from amp_rewrite.training.runner.trainer import Trainer

    before = device_memory("cuda", 0)
    model = builders.seed_cnn(image_size=image_size)
    graphs = fixed_extents(MODES[graph_mode], where)
    step = build(model, loss="cross-entropy", output="probabilities", optimizer="adamw",
                 precision=precision, batchnorm=batchnorm, conv_weight_grad=conv_weight_grad, flat_state=flat_state,
                 specialize={"image": [batch, 3, image_size, image_size]} if graphs else None)
    # Native float16 on CUDA; on the CPU the mixed step runs as the provider runs it (not emulated).
    trainer = Trainer(step, provider=where, lr=1e-3, emulate=False, provider_options=provider_options,
                      graph_mode=graphs)
    rng = np.random.default_rng(0)
    data = trainer.device_batch({"image": rng.normal(0, 1, (batch, 3, image_size, image_size)).astype(np.float32),
                                 "labels": rng.integers(0, 10, batch).astype(np.int64)})
    for _ in range(warmup):
        trainer.step(data)
    started = time.perf_counter()
    skipped = sum(trainer.step(data).skipped for _ in range(steps))
    seconds = (time.perf_counter() - started) / steps
    return {"ms": 1000 * seconds, "skipped": skipped, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            / 1024, "device_mib": _device_mib(before), "provider": where, "graph_mode": trainer.graph_mode}


def torch_one(batch: int, precision: str, image_size: int, warmup: int, steps: int) -> dict | None:
    """The same network in PyTorch (autocast + GradScaler for mixed), on CUDA only."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    before = device_memory("cuda", 0)
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU(), nn.BatchNorm2d(64, eps=1e-3),
        nn.Conv2d(64, 128, 11, stride=2, padding=5), nn.ReLU(), nn.BatchNorm2d(128, eps=1e-3),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).cuda()
    torch.backends.cudnn.benchmark = True
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "float16")
    x = torch.randn(batch, 3, image_size, image_size, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=precision == "float16"):
            loss = nn.functional.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return {"ms": 1000 * (time.perf_counter() - started) / steps, "device_mib": _device_mib(before),
            "allocated_mib": torch.cuda.max_memory_allocated() / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--steps", type=int, help="timed steps (default: 10 on CUDA, 3 on the CPU)")
    parser.add_argument("--warmup", type=int, help="steps before the timed ones (default: 2 on CUDA, 1 on the CPU)")
    parser.add_argument("--out", type=Path, help="also write the section to this file")
    parser.add_argument("--batchnorm", choices=["train", "freeze"], default="train",
                        help="freeze: the ONNX steps keep BatchNormalization's running statistics (a diagnosis of "
                             "what batch statistics cost; PyTorch still trains them); not written to RESULTS.md")
    parser.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the ONNX steps' execution provider (a diagnosis: not written to RESULTS.md)")
    parser.add_argument("--conv-weight-grad", default="direct", help="train's option of that name (a diagnosis "
                        "unless direct: not written)")
    parser.add_argument("--graph-mode", choices=["auto", "on", "off"], default="auto",
                        help="train's option of that name (a diagnosis unless auto: not written)")
    parser.add_argument("--flat-state", choices=["off", "on"], default="off",
                        help="train's option of that name (a diagnosis unless off: not written)")
    parser.add_argument("--precisions", default="float32,float16", help="of the steps (a subset: not written)")
    parser.add_argument("--backends", default="onnx,torch", help="onnx, torch (a subset: not written)")
    parser.add_argument("--one", nargs=2, metavar=("BATCH", "PRECISION"), help=argparse.SUPPRESS)
    parser.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    provider_options = dict(option.split("=", 1) for option in args.provider_option)
    if args.one:  # a child: the parent passes its warm-up and step counts; PyTorch needs no provider probe
        batch, precision = int(args.one[0]), args.one[1]
        print(json.dumps(torch_one(batch, precision, args.image_size, args.warmup, args.steps) if args.torch else
                         one(batch, precision, args.image_size, args.warmup, args.steps, args.batchnorm, provider(),
                             provider_options, args.conv_weight_grad, args.graph_mode, args.flat_state)))
        return
    where = provider()
    warmup, steps = args.warmup or STEPS[where][0], args.steps or STEPS[where][1]
    batches = args.batches or ("32,64,128,256,512" if where == "CUDAExecutionProvider" else CPU_BATCHES)
    label = "GPU (ONNX Runtime CUDA)" if where == "CUDAExecutionProvider" else \
        "CPU ONLY (ONNX Runtime CPU provider; no GPU on this machine)"
    lines = [f"{results.machine()}. {label}.", "",
             f"`python benchmarks/train_bench.py` (part of `make bench`): the seed CNN on {args.image_size}x"
             f"{args.image_size}x3 images, AdamW, cross-entropy; milliseconds per step, mean of {steps} steps "
             f"after {warmup} warm-up steps, each configuration in its own process; mixed = float16 with dynamic "
             "loss scaling. Host MiB is the process's peak resident set; device MiB (CUDA) is the device memory "
             "the process holds after its steps (NVML), the CUDA context included. float32 runs with each "
             "framework's default: TF32 convolutions (ONNX Runtime's use_tf32, PyTorch's cudnn.allow_tf32); "
             "cuDNN picks its algorithms by measuring in both (ONNX Runtime's exhaustive search, PyTorch's "
             "cudnn.benchmark).", ""]
    if where != "CUDAExecutionProvider":
        lines += ["These are CPU figures: ONNX Runtime's CPU provider has few float16 kernels and computes most "
                  "float16 nodes in float32 with casts around them, so 'mixed' measures the graph's overhead there, "
                  "not Tensor Core speed. The targets (mixed >= 1.5x float32 at batch 256, within 1.25x of PyTorch "
                  "AMP) need a GPU; PyTorch is timed only on CUDA.", ""]
    lines += ["| batch | float32 ms | mixed ms | mixed speed-up | float32 host / device MiB | mixed host / device MiB "
              "| skipped | PyTorch float32 ms | PyTorch AMP ms | PyTorch AMP device MiB | mixed / PyTorch AMP time |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = {}
    for batch in (int(b) for b in batches.split(",")):
        row = {}
        for precision in args.precisions.split(","):
            for backend in args.backends.split(","):
                command = [sys.executable, __file__, "--one", str(batch), precision, "--image-size",
                           str(args.image_size), "--warmup", str(warmup), "--steps", str(steps),
                           "--batchnorm", args.batchnorm, *(f"--provider-option={o}" for o in args.provider_option),
                           "--conv-weight-grad", args.conv_weight_grad, "--graph-mode", args.graph_mode,
                           "--flat-state", args.flat_state,
                           *(["--torch"] if backend == "torch" else [])]
                row[backend, precision] = results.child(command, timeout=CHILD_TIMEOUT)
        fp32, mixed, amp = (row.get(key) for key in (("onnx", "float32"), ("onnx", "float16"), ("torch", "float16")))

        def ms(r):
            return f"{r['ms']:.1f}" if r and "ms" in r else ("-" if not r else r.get("error", "-")[:60])

        def mib(r):
            host = f"{r['peak_mib']:.0f}" if r and "peak_mib" in r else "-"
            return f"{host} / {r['device_mib']:.0f}" if r and r.get("device_mib") is not None else host

        def ratio(slow, fast):
            return f"{slow['ms'] / fast['ms']:.2f}x" if slow and fast and "ms" in slow and "ms" in fast else "-"

        amp_mib = f"{amp['device_mib']:.0f}" if amp and amp.get("device_mib") is not None else "-"
        rows[batch] = (f"| {batch} | {ms(fp32)} | {ms(mixed)} | {ratio(fp32, mixed)} | {mib(fp32)} | {mib(mixed)} | "
                       f"{(mixed or {}).get('skipped', '-')} | {ms(row.get(('torch', 'float32')))} | {ms(amp)} | "
                       f"{amp_mib} | {ratio(mixed, amp)} |")
        print(rows[batch], flush=True)
    lines += [rows[b] for b in sorted(rows)]
    defaults = all(getattr(args, key) == parser.get_default(key) for key in
                   ("batchnorm", "precisions", "backends", "conv_weight_grad", "graph_mode", "flat_state"))
    if defaults and not provider_options:
        results.write(sections={SECTIONS[where]: lines})
    if args.out:
        args.out.write_text("\n".join([f"## {SECTIONS[where]}", "", *lines]) + "\n")


if __name__ == "__main__":
    main()
