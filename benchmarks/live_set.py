"""The training step's planned memory: what it keeps, and the peak of what it computes.

The seed CNN's step (``train_bench``'s model) is built for one batch's extents, its shapes
inferred, and its values walked in graph order: parameters, optimizer state and data stay the
whole step ("kept"); every value a node makes is live from that node to its last reader (an
output of the step: to the end). The peak of the live set is what an allocator with perfect
reuse would need beside the kept tensors, in this order; ONNX Runtime's order and arena
differ, which is what the device measurement (``train_bench``'s device memory) shows against
it (TRAINING-SPEED.md, "Memory"). Runs on any machine: nothing is executed.

    python benchmarks/live_set.py [--batches 32,256,512] [--image-size 256] [--precision float16]
        [--conv-weight-grad direct] [--batchnorm-formulation layer-norm|decomposed] [--top 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx
from onnx import helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_rewrite.ir.sizes import ValueSizes  # noqa: E402
from amp_rewrite.ir.types import typed_index  # noqa: E402
from models import builders  # noqa: E402


def planned(model: onnx.ModelProto, top: int) -> dict:
    """Kept bytes, the live set's peak (bytes, the node where it is reached) and its largest
    values, of ``model``'s top-level graph in its order."""
    index = typed_index(model)
    sizes = ValueSizes(index)
    graph = model.graph
    unknown: list[str] = []

    def nbytes(name: str) -> int:
        value = index.values.get((0, name))
        if value is None or value.elem_type == 0:
            unknown.append(name)
            return 0
        shape = sizes.shape(value)
        if shape is None or any(not isinstance(d, int) for d in shape):
            unknown.append(name)
        count = sizes.elements(value)
        return count * helper.tensor_dtype_to_np_dtype(value.elem_type).itemsize

    kept = sum(nbytes(i.name) for i in graph.input) + sum(nbytes(t.name) for t in graph.initializer)
    outputs = {o.name for o in graph.output}
    last: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            last[name] = position
    born: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.output:
            if name:
                born[name] = position
    size = {name: nbytes(name) for name in born}
    ends = {name: len(graph.node) if name in outputs else last.get(name, position) for name, position in born.items()}
    deaths: dict[int, list[str]] = {}
    for name, end in ends.items():
        deaths.setdefault(end, []).append(name)
    live: set[str] = set()
    current = peak = peak_at = 0
    peak_values: list[str] = []
    for position, node in enumerate(graph.node):
        for name in node.output:
            if name:
                live.add(name)
                current += size[name]
        if current > peak:
            peak, peak_at, peak_values = current, position, sorted(live, key=lambda n: -size[n])[:top]
        for name in deaths.get(position, []):
            live.discard(name)
            current -= size[name]
    node = graph.node[peak_at] if graph.node else None
    return {"kept": kept, "peak": peak, "at": f"{node.op_type} {node.name}" if node else "",
            "largest": [(name, size[name]) for name in peak_values], "nodes": len(graph.node),
            "unknown": len(set(unknown))}


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
    from amp_rewrite.training import batch_statistics, build

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
