"""A coloring: the precision chosen for every candidate node, with its reason.

A coloring is a value: the analysis passes build it, tests and ``inspect``
read it, and only the cast-insertion pass turns it into graph edits.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass


class Color(str, enum.Enum):
    LOW = "low"
    FP32 = "fp32"


class Priority(enum.IntEnum):
    """Who fixed a color; a higher priority is never overridden by a lower one."""

    FREE = 0
    POLICY = 1
    SAFETY = 2
    USER = 3


@dataclass(slots=True)
class Decision:
    op_class: str
    color: Color | None = None
    reason: str = ""
    priority: Priority = Priority.FREE

    @property
    def free(self) -> bool:
        return self.priority is Priority.FREE


class Coloring:
    """Decisions keyed by node id, for the candidate nodes only. A reason is kept as one string
    for all the nodes that give the same (interned): most repeat (``allow: matrix product ...``
    for every MatMul), and a string per node would hold one copy of each for every node.
    ``changes`` counts the decisions added and changed, so a pass can say whether it changed any."""

    def __init__(self) -> None:
        self.decisions: dict[int, Decision] = {}
        self.changes = 0

    def add(self, node_id: int, op_class: str) -> None:
        self.decisions[node_id] = Decision(op_class)
        self.changes += 1

    def fix(self, node_id: int, color: Color, reason: str, priority: Priority) -> bool:
        """Fix a node's color unless a decision of higher priority already holds."""
        decision = self.decisions[node_id]
        if decision.priority > priority or (decision.priority == priority and decision.color is not None):
            return False
        decision.color, decision.reason, decision.priority = color, sys.intern(reason), priority
        self.changes += 1
        return True

    def choose(self, node_id: int, color: Color, reason: str) -> None:
        """Record the color chosen for a free node."""
        decision = self.decisions[node_id]
        if decision.color is not color or decision.reason != reason:
            self.changes += 1
        decision.color, decision.reason = color, sys.intern(reason)

    def color(self, node_id: int) -> Color | None:
        decision = self.decisions.get(node_id)
        return decision.color if decision else None

    def free_nodes(self) -> list[int]:
        return [n for n, d in self.decisions.items() if d.free]
