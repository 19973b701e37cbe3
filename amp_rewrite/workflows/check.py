"""``check`` with explanations: a failing check's suspects carry the conversion's reasons."""

from __future__ import annotations

import functools
from typing import Any

import onnx

from amp_rewrite.ir.graph import node_key
from amp_rewrite.numerics import check as numerics
from amp_rewrite.numerics.check import CheckResult
from amp_rewrite.numerics.localize import Suspect
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.pipeline import analyze


@functools.wraps(numerics.check)
def check(original, mixed, **kwargs: Any) -> CheckResult:
    """:func:`amp_rewrite.numerics.check.check`; with ``localize_failures``, each suspect also
    says what the default conversion decided for its node and why."""
    result = numerics.check(original, mixed, **kwargs)
    if result.suspects:
        explain(*numerics.load_model(original), result.suspects)
    return result


def explain(original: onnx.ModelProto, base_dir: str | None, suspects: list[Suspect]) -> list[Suspect]:
    """Attach each suspect's op class and the reason the conversion put it in low precision
    (``base_dir``: where the model's external or borrowed weights lie)."""
    analysis = analyze(original, ConvertOptions(range_check="off"), base_dir)
    decisions = {node_key(analysis.index.nodes[i]): d for i, d in analysis.coloring.decisions.items()}
    for suspect in suspects:
        decision = decisions.get(suspect.node)
        suspect.op_class = f"class {decision.op_class}" if decision else "not a candidate"
        if decision is not None:
            color = decision.color.value if decision.color else "fp32"
            suspect.reason = f"default conversion: {color}, {decision.reason}"
    return suspects
