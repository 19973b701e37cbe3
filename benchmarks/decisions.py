"""Every conversion decision on the bundled models and the external suites, to compare two
versions of amp-rewrite ("the decisions are unchanged or better"):

    python benchmarks/decisions.py --out before.json      (on one commit)
    python benchmarks/decisions.py --out after.json       (on another)
    python benchmarks/decisions.py --compare before.json after.json

A snapshot holds, for each model (the bundled samples, onnx's light models as shipped and
with random weights, every float case of the ONNX backend node suite, onnx's model test
directories with data), each node's
precision and reason, the casts inserted and the range check's line, from ``convert`` with
its defaults. ``--compare`` prints the models whose decisions differ (precisions first) and
exits 1 when any do.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from amp_rewrite import UserError, convert  # noqa: E402
from models import builders, light  # noqa: E402
from tests.node_suite import float_cases, model_dir_cases  # noqa: E402


def models() -> Iterator[tuple[str, onnx.ModelProto]]:
    for name, build in builders.SAMPLES.items():
        yield f"sample/{name}", build()
    for fragile in (builders.fragile_layer_norm, builders.fragile_log_softmax, builders.cancellation):
        yield f"sample/{fragile.__name__}", fragile()[0]
    for path in light.LIGHT:
        model = onnx.load(path)
        yield f"light/{Path(path).stem}", model
        yield f"light-random/{Path(path).stem}", light.randomize_weights(model)
    for case in float_cases():
        yield f"node/{case.name}", case.model
    for case in model_dir_cases():
        yield f"model-dir/{case.name}", case.model


def decisions(model: onnx.ModelProto) -> dict:
    try:
        _, report = convert(model)
    except UserError as exc:
        return {"error": str(exc)}
    return {"precision": {d.node: d.precision for d in report.decisions},
            "reason": {d.node: d.reason for d in report.decisions},
            "casts": report.casts_inserted, "range_check": report.range_check}


def compare(before: dict, after: dict) -> list[str]:
    """One line per model whose decisions differ, those whose precisions differ first."""
    lines: list[tuple[int, str]] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None or new is None:
            lines.append((0, f"{name}: only in {'after' if old is None else 'before'}"))
            continue
        changed = [key for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]
        flipped = sorted(node for node in old.get("precision", {})
                         if old["precision"][node] != new.get("precision", {}).get(node))
        detail = f"precision of {', '.join(flipped[:5])}{' ...' if len(flipped) > 5 else ''}" if flipped else ""
        lines.append((0 if flipped or "error" in changed else 1, f"{name}: {', '.join(changed)} {detail}".rstrip()))
    return [line for _, line in sorted(lines)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        lines = compare(before, after)
        print("\n".join(lines) or "no differences", f"({len(before)} models before, {len(after)} after)", sep="\n")
        return 1 if lines else 0
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    snapshot = {name: decisions(model) for name, model in models()}
    args.out.write_text(json.dumps(snapshot, indent=0, sort_keys=True))
    print(f"wrote the decisions on {len(snapshot)} models to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
