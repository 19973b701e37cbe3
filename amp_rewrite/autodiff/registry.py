"""Gradient rules as data: one entry per (domain, op, opset range).

Vocabulary (after ONNX Runtime's gradient builder), used by every rule:

- ``I(i)``: the node's i-th input; ``O(i)``: its i-th output (forward values, kept
  and read by the backward pass, never recomputed);
- ``GO(i)``: the gradient of the loss with respect to ``O(i)``, or None when
  nothing flows back into that output (a rule treats it as zero);
- a rule returns ``GI``: ``{input index: gradient}`` for the inputs it
  differentiates, each with its input's shape and element type. It asks
  ``ctx.wants(i)`` and builds nothing for an input that needs no gradient.

Which inputs are differentiable follows from the ONNX schema (inputs bound to a
float type parameter), minus the ``constant`` inputs a rule declares (a
Clip's bounds, a Pow's exponent). Rules build with ``ctx.b`` (a
:class:`~amp_rewrite.ir.builder.GraphBuilder`) and never name an element type:
constants are made like an operand, so one rule serves float32, float16 and
bfloat16. A lookup that finds nothing raises one :class:`UserError` naming the
op, its domain, opset and node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from amp_rewrite.errors import UserError

GradientMap = Mapping[int, "str | None"]


@dataclass(frozen=True)
class Rule:
    op: str
    domain: str
    since: int
    until: int | None
    build: Callable[..., GradientMap]
    constant: frozenset[int] = field(default_factory=frozenset)
    """Float inputs that carry no gradient (bounds, exponents, statistics)."""
    zero: bool = False
    """The op's float outputs are piecewise constant in its inputs: no gradient flows."""
    straight_through: bool = False
    """The op's integer outputs stand for real numbers (QuantizeLinear's): gradients flow through
    them as through floats, the rounding taken as the identity (a straight-through estimator);
    ``GO`` and the ``GI`` of such an input are then float, typed like the values they meet."""

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


_RULES: dict[tuple[str, str], list[Rule]] = {}


def register(*ops: str, domain: str = "", since: int = 1, until: int | None = None,
             constant: tuple[int, ...] = (), straight_through: bool = False) -> Callable:
    """Decorator: ``build(ctx) -> GI`` is the gradient rule of ``ops`` over an opset range."""

    def add(build: Callable[..., GradientMap]) -> Callable[..., GradientMap]:
        for op in ops:
            _add(Rule(op, domain, since, until, build, frozenset(constant), straight_through=straight_through))
        return build

    return add


def no_gradient(*ops: str, domain: str = "") -> None:
    """Ops with float outputs that are piecewise constant (Floor, Sign, random draws): no gradient flows."""
    for op in ops:
        _add(Rule(op, domain, 1, None, lambda ctx: {}, zero=True))


def _add(rule: Rule) -> None:
    entries = _RULES.setdefault((rule.domain, rule.op), [])
    for other in entries:
        if rule.since <= (other.until or 10**6) and other.since <= (rule.until or 10**6):
            raise ValueError(f"two gradient rules for {rule.domain or 'ai.onnx'}::{rule.op} overlap")
    entries.append(rule)


def lookup(domain: str, op: str, opset: int) -> Rule | None:
    return next((r for r in _RULES.get((domain, op), ()) if r.covers(opset)), None)


def rules() -> dict[tuple[str, str], list[Rule]]:
    """Every registered rule, by (domain, op)."""
    return {key: list(entries) for key, entries in _RULES.items()}


def missing_rule_error(missing: list[tuple[str, str, int, str]]) -> UserError:
    """One error for the ops without a rule: (domain, op, opset, node label) of each."""
    domain, op, opset, node = missing[0]
    others = sorted({m[1] for m in missing[1:]} - {op})
    also = f"; also without one: {', '.join(others)}" if others else ""
    return UserError(f"no gradient rule for {op} (domain {domain or 'ai.onnx'}, opset {opset}) at node {node!r}, "
                     f"which lies between the parameters and the loss{also}")
