"""The floor of a float16 converter written in Python, against the faster peer's time.

    python benchmarks/floor.py [--sizes 20000,50000] [--runs 3]

Any converter that keeps graph-level guarantees has to start Python, import onnx, load the
model, infer its value types (here onnx's C++ shape inference over the graph without its
weights' bytes), look at every node once and write the result. This script times exactly
that, as a whole process, and sets it beside the ONNX Runtime float16 script (the faster
peer of ``make bench``) on the benchmark transformers: where the floor alone is more than a
third of the peer's time, "3x faster than the peer" cannot be met by a Python converter,
whatever it does between load and save. amp-rewrite is timed the same way beside them.
Writes the "Floor" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import compileall
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results, run  # noqa: E402

FLOOR = """
import sys
import onnx
model = onnx.load(sys.argv[1])
graph_only = onnx.ModelProto()
graph_only.CopyFrom(model)
for tensor in graph_only.graph.initializer:
    tensor.ClearField("raw_data")
inferred = onnx.shape_inference.infer_shapes(graph_only)
ops = {}
for node in model.graph.node:
    ops[node.op_type] = ops.get(node.op_type, 0) + len(node.input)
with open(sys.argv[2], "wb") as out:
    out.write(model.SerializeToString())
"""


def seconds(command: list[str], runs: int) -> float:
    """The least wall time of ``runs`` runs of ``command``: a floor is a lower bound."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    # amp-rewrite byte-compiled, as the peers' installed packages are (where PYTHONDONTWRITEBYTECODE
    # is set, each run would otherwise compile its modules from source: about 0.1 s)
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "amp_rewrite", quiet=1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="20000,50000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = ["Least of "
            f"{args.runs} runs each, whole processes. *Floor*: start Python, import onnx, load, onnx shape "
            "inference over the graph without the weights' bytes, one loop over the nodes, serialize and "
            "write (benchmarks/floor.py). *Peer*: the ONNX Runtime float16 script "
            "(benchmarks/peer_convert.py ort). The issue's target with the range check off is 3x the "
            "peer's speed, a budget of a third of its time. *amp-rewrite*: `amp-rewrite convert`, with the "
            "range check (the default) and with `--range-check off`, timed the same way.", "",
            "| model | floor s | peer s | budget (peer / 3) s | floor / budget | amp-rewrite s | "
            "no range check s | peer / amp-rewrite | peer / no range check |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "out.onnx")
        for label, path, _ in run.build_models([int(s) for s in args.sizes.split(",")]):
            floor = seconds([sys.executable, "-c", FLOOR, str(path), out], args.runs)
            peer = seconds([sys.executable, str(Path(__file__).with_name("peer_convert.py")), "ort",
                            str(path), out], args.runs)
            ours = [seconds([str(Path(sys.executable).with_name("amp-rewrite")), "convert", str(path), "-o", out,
                             *extra], args.runs) for extra in ([], ["--range-check", "off"])]
            rows.append(f"| {label} | {floor:.2f} | {peer:.2f} | {peer / 3:.2f} | {floor / (peer / 3):.2f} | "
                        f"{ours[0]:.2f} | {ours[1]:.2f} | {peer / ours[0]:.2f}x | {peer / ours[1]:.2f}x |")
            print(rows[-1], flush=True)
    results.write(sections={"Floor": [f"{results.machine()}.", "", *rows]})
    print("wrote benchmarks/RESULTS.md")


if __name__ == "__main__":
    main()
