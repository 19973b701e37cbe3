"""The dimension rules by op type: ``@rule("Reshape", ...)`` makes a function the rule of those ops.

A rule, ``rule(solver, node)``, reads what it can off one node of the default domain (its
inputs' shapes as inferred or derived, its constants and attributes) and tells the solver
(``counting.Solver``) what that implies: shapes it derived, dimensions that agree, counts,
least and greatest extents. The driver runs the rule of every node, in every graph, in each
round until a round learns nothing new: a rule only adds to what is known (the first binding
found wins), and sees the same node again in each round. An op whose inputs broadcast
numpy-style, as its schema says (Add, Mul, Where, ...), takes the rule registered with
``broadcasting=True`` where it has none of its own. One op has one rule: a second is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from onnx import defs

from amp_rewrite.ir.graph import Node

if TYPE_CHECKING:
    from amp_rewrite.inputs.dims.counting import Solver

Rule = Callable[["Solver", Node], None]

_RULES: dict[str, Rule] = {}
_BROADCASTING: list[Rule] = []
"""The rule of the ops whose inputs broadcast (``broadcasting_ops``) and that have none of their own."""


def rule(*op_types: str, broadcasting: bool = False) -> Callable[[Rule], Rule]:
    """Decorator: the function is the dimension rule of ``op_types`` (and, with ``broadcasting``,
    of every op whose inputs broadcast that has no rule of its own)."""

    def add(function: Rule) -> Rule:
        for op_type in op_types:
            if op_type in _RULES:
                raise ValueError(f"two dimension rules for {op_type}")
            _RULES[op_type] = function
        if broadcasting:
            if _BROADCASTING:
                raise ValueError("two dimension rules for the ops whose inputs broadcast")
            _BROADCASTING.append(function)
        return function

    return add


def lookup(op_type: str) -> Rule | None:
    """The rule of ``op_type``: its own, else the broadcasting ops' where its inputs broadcast, else None."""
    own = _RULES.get(op_type)
    if own is None and _BROADCASTING and op_type in broadcasting_ops():
        return _BROADCASTING[0]
    return own


@functools.cache
def broadcasting_ops() -> frozenset[str]:
    """Ops whose inputs broadcast numpy-style, as their ONNX schemas say (Add, Mul, Where, ...);
    read when first asked for: reading every schema costs more than importing onnx does."""
    return frozenset(s.name for s in defs.get_all_schemas()
                     if s.domain == "" and "multidirectional" in (s.doc or "").lower())
