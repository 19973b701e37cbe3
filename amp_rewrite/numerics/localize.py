"""Localize a numerics failure: which low-precision nodes made the mixed model drift.

Given every top-level value of one run of the float32 model and of the mixed
model (emulated or native) on the same sample, each node's error growth is the
error of its outputs less the error of its inputs. A node that runs in low
precision and grows the error is a suspect itself. A float32 node computes
exactly what the reference computes, so error it grows (cancellation, or a Log
of a value that flushed to zero) is amplified input damage: it is charged to the
low-precision nodes that produced its inputs. A node that turns values that
flushed to zero into NaN or Inf (a Log of underflowed probabilities) charges the
low-precision producers of the flushed values first. Suspects that introduce NaN or Inf
come first, earliest first; the rest are ranked by error growth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from amp_rewrite.ir.builder import LOW_TYPES
from amp_rewrite.ir.graph import ModelIndex, Node, Value, node_key
from amp_rewrite.ir.types import typed_index

MIN_GROWTH = 1e-3
"""Relative-L2 error growth below this is rounding noise, not a suspect."""


@dataclass
class Suspect:
    node: str
    op_type: str
    nonfinite: bool
    growth: float
    evidence: str
    order: int
    op_class: str = ""
    reason: str = ""
    """Why the conversion put the node in low precision (filled in by ``check.explain``)."""


@dataclass(frozen=True)
class _Damage:
    nonfinite: float
    rel_l2: float
    flushed: float = 0.0
    """Share of elements that are zero where the reference is not."""


def localize(mixed: onnx.ModelProto, reference: Mapping[str, np.ndarray],
             observed: Mapping[str, np.ndarray], limit: int = 10, min_growth: float = MIN_GROWTH) -> list[Suspect]:
    """Rank the low-precision nodes of ``mixed`` that made ``observed`` drift from ``reference``
    (both: top-level values by name); a node that grows the error by ``min_growth`` or less is no suspect."""
    index = typed_index(mixed)
    damage = _Damager(index, reference, observed)
    suspects: dict[int, Suspect] = {}
    for node in index.nodes:
        if node.graph != 0 or node.op_type == "Cast":
            continue
        out = damage.worst(node.outputs)
        if out is None:
            continue
        inp = damage.worst(node.inputs) or _Damage(0.0, 0.0)
        nonfinite = out.nonfinite > 0 and inp.nonfinite == 0
        growth = out.rel_l2 - inp.rel_l2 if np.isfinite(out.rel_l2) else float("inf")
        if not nonfinite and not growth > min_growth:
            continue
        what = "introduced NaN/Inf" if nonfinite else f"grew the relative error by {growth:.3g}"
        if nonfinite and inp.flushed > 0:  # a Log or Div of values that underflowed to zero upstream
            for producer in _low_producers(index, node):
                _blame(suspects, producer, True, growth, f"its output flushed to zero in low precision, and "
                       f"{node.op_type} {node_key(node)!r} turned that into NaN/Inf")
        if _is_low(index, node):
            _blame(suspects, node, nonfinite, growth, f"{what} computing in low precision")
            continue
        for producer in _low_producers(index, node):
            _blame(suspects, producer, nonfinite, growth,
                   f"its output, stored in low precision, reached {node.op_type} {node_key(node)!r} "
                   f"(float32), which {what}")
    ranked = sorted(suspects.values(), key=lambda s: (not s.nonfinite, s.order if s.nonfinite else -s.growth))
    return ranked[:limit]


def _blame(suspects: dict[int, Suspect], node: Node, nonfinite: bool, growth: float, evidence: str) -> None:
    known = suspects.get(node.id)
    if known is None:
        suspects[node.id] = Suspect(node_key(node), node.op_type, nonfinite, growth, evidence, node.position)
    elif (nonfinite, growth) > (known.nonfinite, known.growth):
        known.nonfinite, known.growth, known.evidence = nonfinite, growth, evidence


class _Damager:
    """Damage of mixed-model values, found by the reference value each one stands for."""

    def __init__(self, index: ModelIndex, reference: Mapping, observed: Mapping) -> None:
        self.index, self.reference, self.observed = index, reference, observed
        self.cache: dict = {}

    def worst(self, keys) -> _Damage | None:
        found = [d for k in keys if k is not None and (d := self.of(self.index.values[k])) is not None]
        if not found:
            return None
        worst = max(found, key=lambda d: (d.nonfinite, d.rel_l2))
        return _Damage(worst.nonfinite, worst.rel_l2, max(d.flushed for d in found))

    def of(self, value: Value) -> _Damage | None:
        if value.key not in self.cache:
            name = self._reference_name(value)
            self.cache[value.key] = _damage(self.reference[name], self.observed[name]) if name else None
        return self.cache[value.key]

    def _reference_name(self, value: Value, depth: int = 0) -> str | None:
        """The value itself, or for a cast, what it casts; or the value a lone Cast reader makes of it."""
        if value.key[0] != 0 or depth > 4:
            return None
        if value.name in self.reference and value.name in self.observed:
            return value.name
        producer = self.index.producer_node(value)
        if producer is not None and producer.op_type == "Cast" and producer.inputs[0]:
            return self._reference_name(self.index.values[producer.inputs[0]], depth + 1)
        if len(value.uses) == 1 and self.index.nodes[value.uses[0][0]].op_type == "Cast":
            reader = self.index.nodes[value.uses[0][0]]
            return self._reference_name(self.index.value(reader.outputs[0]), depth + 1)
        return None


def _damage(reference: np.ndarray, observed: np.ndarray) -> _Damage | None:
    reference, observed = np.asarray(reference), np.asarray(observed)
    if reference.shape != observed.shape or reference.dtype.kind != "f" or not reference.size:
        return None
    r, m = reference.astype(np.float64), observed.astype(np.float64)
    finite = np.isfinite(r)
    broken = finite & ~np.isfinite(m)
    both = finite & ~broken
    norm = np.linalg.norm(r[both])
    error = np.linalg.norm(m[both] - r[both])
    flushed = float(np.mean((m == 0) & (r != 0)))
    return _Damage(float(np.mean(broken)), float(error / norm) if norm else float(error > 0), flushed)


def _is_low(index: ModelIndex, node: Node) -> bool:
    return any(k is not None and index.values[k].elem_type in LOW_TYPES for k in (*node.outputs, *node.inputs))


def _low_producers(index: ModelIndex, node: Node) -> list[Node]:
    """Low-precision nodes whose outputs reach ``node``'s inputs, through Casts."""
    found = []
    for key in node.inputs:
        value = index.values[key] if key is not None else None
        while value is not None:
            producer = index.producer_node(value)
            if producer is None:
                break
            if producer.op_type == "Cast" and producer.inputs[0]:
                value = index.values[producer.inputs[0]]
                continue
            if _is_low(index, producer):
                found.append(producer)
            break
    return found
