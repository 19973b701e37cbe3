"""make bench: gradient graph build time and size for the 1k-50k node transformers.

Each (size, variant) runs in its own process: the model is built, a scalar loss
(the sum of the output) attached, optionally converted to mixed precision, and
``gradient_proto`` timed alone (perf_counter around the call); peak memory is the
process's maximum resident set. Writes the "Gradients" section of RESULTS.md.

    python benchmarks/grad_bench.py [--sizes 1000,5000,20000,50000]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import onnx
from onnx import helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import results  # noqa: E402
from models import builders  # noqa: E402

NODES_PER_BLOCK = 35
SECTION = "Gradients"


def one(size: int, mixed: bool) -> dict:
    import amp_rewrite
    from amp_rewrite.autodiff import gradient_proto

    model = builders.transformer(blocks=max(1, round(size / NODES_PER_BLOCK)), width=32)
    out = model.graph.output[0].name
    model.graph.node.append(helper.make_node("ReduceSum", [out], ["loss"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    if mixed:
        model, _ = amp_rewrite.convert(model, range_check="off")
    forward = len(model.graph.node)
    started = time.perf_counter()
    grad = gradient_proto(model, "loss")
    seconds = time.perf_counter() - started
    return {"forward": forward, "total": len(grad.graph.node), "seconds": seconds,
            "grads": len(grad.graph.output) - 2,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,5000,20000,50000")
    parser.add_argument("--one", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1] == "mixed")))
        return
    lines = [results.machine() + f", onnx {onnx.__version__}.", "",
             "`python benchmarks/grad_bench.py` (part of `make bench`): `gradient_proto` on the benchmark "
             "transformers with `loss = sum(output)`, every float weight differentiated; seconds are the call "
             "alone (one run, in its own process), peak memory the process's (model build included).", "",
             "| forward nodes | variant | gradient graph nodes | ratio to forward | weights | seconds | "
             "us per forward node | peak MiB |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for size in (int(s) for s in args.sizes.split(",")):
        for variant in ("float32", "mixed"):
            r = results.child([sys.executable, __file__, "--one", str(size), variant])
            if "error" in r:
                lines.append(f"| {size} (target) | {variant} | failed: {r['error'][:80]} | | | | | |")
                continue
            lines.append(f"| {r['forward']} | {variant} | {r['total']} | {r['total'] / r['forward']:.2f} | "
                         f"{r['grads']} | {r['seconds']:.2f} | {1e6 * r['seconds'] / r['forward']:.0f} | "
                         f"{r['peak_mib']:.0f} |")
            print(lines[-1], flush=True)
    results.write(sections={SECTION: lines})


if __name__ == "__main__":
    main()
