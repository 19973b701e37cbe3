"""Error statistics between a reference output and a mixed-precision one, and tolerances over them.

A tolerance applies one statistic (``metric``) with ``rtol``/``atol``:

- ``elementwise`` (default): every element satisfies |m - r| <= atol + rtol * |r|;
- ``max``: max |m - r| <= atol, or max relative error <= rtol;
- ``mean``: mean |m - r| <= atol, or mean relative error <= rtol;
- ``rel-l2``: ||m - r|| / ||r|| <= rtol;
- ``cosine``: 1 - cosine similarity <= rtol.

Whatever the metric, an output fails when it has NaN or Inf where the reference
does not. Non-float outputs (indices, masks) fail when more than ``rtol`` of their
elements differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from amp_rewrite.errors import UserError

METRICS = ("elementwise", "max", "mean", "rel-l2", "cosine")
TOP_K = 5
_TINY = 1e-30


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 1e-2
    atol: float = 1e-2
    metric: str = "elementwise"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UserError(f"unknown metric {self.metric!r}; choose one of: {', '.join(METRICS)}")
        if not (self.rtol >= 0 and self.atol >= 0):
            raise UserError(f"tolerances must be non-negative numbers, got rtol={self.rtol} atol={self.atol}")


def parse_tolerance(text: str, default: Tolerance) -> tuple[str, Tolerance]:
    """``OUTPUT:RTOL:ATOL`` -> (output name, tolerance with the default's metric)."""
    name, _, rest = text.partition(":")
    parts = rest.split(":")
    try:
        if not name or len(parts) != 2:
            raise ValueError
        return name, Tolerance(float(parts[0]), float(parts[1]), default.metric)
    except ValueError:
        raise UserError(f"bad --tol {text!r}: expected OUTPUT:RTOL:ATOL such as logits:1e-2:1e-3") from None


@dataclass
class Errors:
    """Statistics of one output on one sample."""

    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    rel_l2: float
    cosine: float
    new_nonfinite: int
    elementwise_violations: int
    mismatched: float
    """Non-float outputs: share of elements that differ."""
    top1: float | None = None
    topk: float | None = None
    """Classifier-shaped outputs ([batch, classes]): agreement of the top-1 class and overlap of the top-5."""

    def passes(self, tol: Tolerance) -> bool:
        if self.new_nonfinite:
            return False
        if math.isnan(self.max_abs):  # a non-float output
            return self.mismatched <= tol.rtol
        return {
            "elementwise": lambda: self.elementwise_violations == 0,
            "max": lambda: self.max_abs <= tol.atol or self.max_rel <= tol.rtol,
            "mean": lambda: self.mean_abs <= tol.atol or self.mean_rel <= tol.rtol,
            "rel-l2": lambda: self.rel_l2 <= tol.rtol,
            "cosine": lambda: 1 - self.cosine <= tol.rtol,
        }[tol.metric]()


def errors(reference: np.ndarray, mixed: np.ndarray, tol: Tolerance) -> Errors:
    reference, mixed = np.asarray(reference), np.asarray(mixed)
    if reference.shape != mixed.shape:
        raise UserError(f"output shapes differ: reference {list(reference.shape)}, mixed {list(mixed.shape)}")
    if reference.dtype.kind not in "fc" and np.dtype(reference.dtype).name not in ("bfloat16", "float16"):
        differ = float(np.mean(reference != mixed)) if reference.size else 0.0
        nan = float("nan")
        return Errors(nan, nan, nan, nan, nan, nan, 0, 0, differ)
    r = reference.astype(np.float64)
    m = mixed.astype(np.float64)
    finite = np.isfinite(r)
    new_nonfinite = int(np.count_nonzero(finite & ~np.isfinite(m)))
    both = finite & np.isfinite(m)
    r, m = r[both], m[both]
    diff = np.abs(m - r)
    rel = diff / np.maximum(np.abs(r), _TINY)
    norm = float(np.linalg.norm(r))
    dot = float(np.dot(r, m))
    norms = norm * float(np.linalg.norm(m))
    found = Errors(
        max_abs=float(diff.max()) if diff.size else 0.0,
        mean_abs=float(diff.mean()) if diff.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        mean_rel=float(rel.mean()) if rel.size else 0.0,
        rel_l2=float(np.linalg.norm(m - r)) / norm if norm else float(np.linalg.norm(m - r) > 0),
        cosine=dot / norms if norms else float(np.array_equal(m, r)),
        new_nonfinite=new_nonfinite,
        elementwise_violations=int(np.count_nonzero(diff > tol.atol + tol.rtol * np.abs(r))),
        mismatched=0.0,
    )
    if reference.ndim == 2 and reference.shape[1] >= 2 and reference.size:
        found.top1, found.topk = _agreement(reference.astype(np.float64), mixed.astype(np.float64))
    return found


def _agreement(reference: np.ndarray, mixed: np.ndarray) -> tuple[float, float]:
    k = min(TOP_K, reference.shape[1])
    top1 = float(np.mean(np.argmax(reference, 1) == np.argmax(np.nan_to_num(mixed, nan=-np.inf), 1)))
    ref_k = np.argsort(-reference, 1)[:, :k]
    mix_k = np.argsort(-np.nan_to_num(mixed, nan=-np.inf), 1)[:, :k]
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_k, mix_k)])
    return top1, float(overlap)
