"""The training step's planned memory: what it keeps, and the peak of what it computes.

The seed CNN's step (``train_bench``'s model) is built for one batch's extents, its shapes
inferred, and its values walked in graph order: parameters, optimizer state and data stay the
whole step ("kept"); every value a node makes is live from that node to its last reader (an
output of the step: to the end). The peak of the live set is what an allocator with perfect
reuse would need beside the kept tensors, in this order; ONNX Runtime's order and arena
differ, which is what the device measurement (``train_bench``'s device memory) shows against
it (docs/training-speed.md, "Memory"). Runs on any machine: nothing is executed.

    python benchmarks/live_set.py [--batches 32,256,512] [--image-size 256] [--precision float16]
        [--conv-weight-grad direct] [--batchnorm-formulation layer-norm|decomposed] [--top 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_rewrite.ir.liveness import planned  # noqa: E402
from models import builders  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="32,256,512")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--precision", default="float16")
    parser.add_argument("--conv-weight-grad", default="direct")
    parser.add_argument("--batchnorm-formulation", default=None, help="batch_statistics.FORMULATION")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    from amp_rewrite.rewrite.options import ConvertOptions
    from amp_rewrite.training import build
    from amp_rewrite.training.graph import batch_statistics

    if args.batchnorm_formulation:
        batch_statistics.FORMULATION = args.batchnorm_formulation
    print(f"seed CNN step, {args.precision}, conv weight grad {args.conv_weight_grad}, batch statistics "
          f"{batch_statistics.FORMULATION}, images {args.image_size}^2 (graph order, perfect reuse)")
    print("| batch | nodes | kept MiB | live-set peak MiB | at | largest values at the peak (MiB) |")
    print("|---:|---:|---:|---:|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        step = build(builders.seed_cnn(image_size=args.image_size), loss="cross-entropy", output="probabilities",
                     precision=args.precision, batchnorm="train", conv_weight_grad=args.conv_weight_grad,
                     specialize={"image": [batch, 3, args.image_size, args.image_size]},
                     options=ConvertOptions(range_check="off"))  # nothing runs: the policy's colouring
        found = planned(step.model, args.top)
        largest = ", ".join(f"{name} {size / 2**20:.0f}" for name, size in found["largest"] if size >= 2**20)
        print(f"| {batch} | {found['nodes']} | {found['kept'] / 2**20:.0f} | {found['peak'] / 2**20:.0f} | "
              f"{found['at']} | {largest} |" + (f" ({found['unknown']} shapes unknown)" if found["unknown"] else ""))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
