"""Conversion time of two versions of amp-rewrite, side by side: ``amp-rewrite convert`` (whole
process, default options) from each version's source tree, run alternately on the same models so
that a busy machine slows both alike; the median of ``--repeats`` runs each, and whether the two
wrote the same bytes. A restructuring is judged by the ratio, not by the seconds.

    git worktree add /tmp/before <commit>; git worktree add /tmp/after HEAD
    python benchmarks/ab_convert.py /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from models import builders  # noqa: E402

MODELS = ((100, True), (400, True), (1000, False), (1000, True))
"""(transformer blocks, mask and exposed block outputs) of the models timed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the source tree of one version")
    parser.add_argument("after", type=Path, help="the source tree of the other")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = []
        for blocks, mask in MODELS:
            path = work / f"t{blocks}_{int(mask)}.onnx"
            onnx.save(builders.transformer(blocks=blocks, width=32, with_mask=mask, expose_blocks=mask), path)
            models.append((path, mask, len(onnx.load(str(path)).graph.node)))
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for path, _mask, _nodes in models:
                for name, tree in trees.items():
                    started = time.perf_counter()
                    done = subprocess.run([sys.executable, "-m", "amp_rewrite", "convert", str(path), "-o",
                                           str(work / f"{path.stem}.{name}.onnx"), "--quiet"], cwd=tree,
                                          capture_output=True, text=True)
                    if done.returncode:
                        sys.exit(f"{name} failed on {path.name}: {done.stderr.strip()[-300:]}")
                    times.setdefault((path.name, name), []).append(time.perf_counter() - started)
        print("| model | before s | after s | ratio | same output bytes |\n|---|---:|---:|---:|---|")
        for path, mask, nodes in models:
            before, after = (statistics.median(times[path.name, name]) for name in trees)
            same = (work / f"{path.stem}.before.onnx").read_bytes() == (work / f"{path.stem}.after.onnx").read_bytes()
            print(f"| {nodes} nodes, {'mask+outputs' if mask else 'plain'} | {before:.2f} | {after:.2f} | "
                  f"{after / before:.2f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
