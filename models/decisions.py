"""Every conversion decision on the bundled models and the external suites, as a snapshot to
compare across versions of amp-rewrite (``benchmarks/decisions.py`` is its command line).

A snapshot holds, for each model (the bundled samples, onnx's light models as shipped and
with random weights, every float case of the ONNX backend node suite, onnx's model test
directories with data), each node's precision and reason, the casts inserted and the range
check's line, from ``convert`` with its defaults; ``compare`` names the models whose
decisions differ, precisions first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx

from amp_rewrite import UserError, convert
from models import builders, light
from models.node_suite import float_cases, model_dir_cases


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


def snapshot() -> dict[str, dict]:
    """``decisions`` of every model of ``models``, by name."""
    return {name: decisions(model) for name, model in models()}


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
