"""What a conversion did, for people (``summary``) and machines (``to_json``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Protocol

from amp_rewrite.errors import printable_lines
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.passes.insert_casts import RewriteStats


class Summarized(Protocol):
    """A later stage's outcome (validation) that the report carries and prints."""

    def summary(self) -> str: ...


@dataclass(slots=True)
class NodeDecision:
    node: str
    op_type: str
    op_class: str
    precision: str
    reason: str


@dataclass
class Report:
    precision: str
    provider: str | None
    policy: str
    nodes: int
    candidates: int
    low_nodes: int
    fp32_nodes: int
    by_class: dict[str, dict[str, int]]
    by_op: dict[str, dict[str, int]]
    fp32_reasons: list[NodeDecision]
    casts_inserted: int
    initializers_converted: int
    initializer_copies: int
    constants_converted: int
    constants_kept_fp32: dict[str, str]
    unknown_ops: dict[str, int]
    range_check: str
    bytes_before: int | None = None
    bytes_after: int | None = None
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds by stage: load, analysis, range check, rewrite, save (the parts ``convert`` timed)."""
    notes: list[str] = field(default_factory=list)
    decisions: list[NodeDecision] = field(default_factory=list)
    validation: Summarized | None = None

    def to_json(self) -> str:
        """The report as JSON, a node's decision to a line. Written by json's C encoder, field
        by field: an indented dump of the whole would run in Python, node by node."""
        parts = []
        for name in (f.name for f in fields(self)):
            value = getattr(self, name)
            if name in _NODE_ROWS:
                text = "[" + ",".join(f"\n    {json.dumps(_row(row))}" for row in value) + ("\n  ]" if value else "]")
            else:
                plain = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
                text = json.dumps(plain, indent=2).replace("\n", "\n  ")
            parts.append(f"  {json.dumps(name)}: {text}")
        return "{\n" + ",\n".join(parts) + "\n}"

    def summary(self) -> str:
        lines = [
            f"amp-rewrite: {self.low_nodes} of {self.candidates} float nodes in {self.precision}, "
            f"{self.fp32_nodes} kept float32 ({self.nodes} nodes in all; provider {self.provider or 'any'}, "
            f"policy {self.policy})",
            f"  casts inserted: {self.casts_inserted}; initializers converted: {self.initializers_converted}"
            f" ({self.initializer_copies} kept in both precisions); constants converted: {self.constants_converted}",
        ]
        if self.bytes_before is not None and self.bytes_after is not None:
            lines.append(f"  model size: {_size(self.bytes_before)} -> {_size(self.bytes_after)}")
        lines.append(f"  range check: {self.range_check}")
        if self.by_class:
            parts = [f"{cls} {c.get('low', 0)}/{c.get('low', 0) + c.get('fp32', 0)} low"
                     for cls, c in sorted(self.by_class.items())]
            lines.append("  by class: " + ", ".join(parts))
        reasons = Counter(_reason_kind(d.reason) for d in self.fp32_reasons)
        if reasons:
            lines.append("  float32 because: " + "; ".join(f"{n}x {r}" for r, n in reasons.most_common(6)))
        for name, problem in list(self.constants_kept_fp32.items())[:5]:
            lines.append(f"  constant {name!r} kept float32: {problem}")
        lines.extend(f"  {note}" for note in self.notes)
        if self.validation is not None:
            lines.extend("  " + line for line in self.validation.summary().splitlines())
        breakdown = ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in self.stages.items())
        lines.append(f"  time: {self.seconds:.2f} s" + (f" ({breakdown})" if breakdown else ""))
        return printable_lines(lines)


_NODE_ROWS = ("fp32_reasons", "decisions")


def _row(decision: NodeDecision) -> dict[str, str]:
    return {name: getattr(decision, name) for name in NodeDecision.__slots__}


def _reason_kind(reason: str) -> str:
    """What the summary counts reasons by: the words before a colon near the start, else the
    reason, cut at a word (marked ``...``) past ``REASON_WIDTH`` characters."""
    if ":" in reason[:40]:
        return reason.split(":")[0]
    return reason if len(reason) <= REASON_WIDTH else reason[:REASON_WIDTH].rsplit(" ", 1)[0] + " ..."


REASON_WIDTH = 72
"""Wide enough for "CUDAExecutionProvider has no float16 kernel for Add at opset 6" (cut at 60
characters, the opset went missing)."""


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def _tally(pairs) -> dict[str, dict[str, int]]:
    counts = Counter(pairs)
    table: dict[str, dict[str, int]] = {}
    for (key, color), n in sorted(counts.items()):
        table.setdefault(key, {})[color] = n
    return table


def build_report(analysis: Analysis, stats: RewriteStats | None) -> Report:
    options, index = analysis.options.coloring, analysis.index
    shown = {Color.LOW: Color.LOW.value, Color.FP32: Color.FP32.value, None: Color.FP32.value}
    decisions = []
    for node_id, decision in sorted(analysis.coloring.decisions.items()):
        node = index.nodes[node_id]
        decisions.append(NodeDecision(node.label, node.op_type, decision.op_class, shown[decision.color],
                                      decision.reason))
    by_class = _tally((d.op_class, d.precision) for d in decisions)
    by_op = _tally((d.op_type, d.precision) for d in decisions)
    stats = stats or RewriteStats()
    low = sum(1 for d in decisions if d.precision == Color.LOW.value)
    return Report(
        precision=analysis.precision.value, provider=options.provider, policy=options.policy,
        nodes=len(index.nodes), candidates=len(decisions), low_nodes=low, fp32_nodes=len(decisions) - low,
        by_class=by_class, by_op=by_op,
        fp32_reasons=[d for d in decisions if d.precision == Color.FP32.value],
        casts_inserted=stats.casts, initializers_converted=stats.initializers_converted,
        initializer_copies=stats.initializer_copies, constants_converted=stats.constants_converted,
        constants_kept_fp32=dict(analysis.kept_constants), unknown_ops=dict(analysis.unknown_ops),
        range_check=analysis.range_check, notes=list(analysis.notes), decisions=decisions,
    )
