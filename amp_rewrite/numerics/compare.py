"""Error statistics between a reference output and a mixed-precision one, and tolerances over them.

A tolerance applies one statistic (``metric``) with ``rtol``/``atol``:

- ``elementwise`` (default): every element satisfies |m - r| <= atol + rtol * |r|;
- ``max``: max |m - r| <= atol, or max relative error <= rtol;
- ``mean``: mean |m - r| <= atol, or mean relative error <= rtol;
- ``rel-l2``: ||m - r|| / ||r|| <= rtol;
- ``cosine``: 1 - cosine similarity <= rtol.

Whatever the metric, an output fails when it has NaN or Inf where the reference
does not. Non-float outputs (indices, masks) fail when more than ``rtol`` of their
elements differ. A sequence or map output (a scikit-learn classifier's ZipMap returns a
list of {class: probability} dicts) is compared as the array of its values (``values``).
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
    """``rtol``/``atol`` None: the default of the precision the mixed model runs in
    (``resolved``: PRECISION_DEFAULTS)."""

    rtol: float | None = None
    atol: float | None = None
    metric: str = "elementwise"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UserError(f"unknown metric {self.metric!r}; choose one of: {', '.join(METRICS)}")
        if not all(t is None or t >= 0 for t in (self.rtol, self.atol)):
            raise UserError(f"tolerances must be non-negative numbers, got rtol={self.rtol} atol={self.atol}")

    def resolved(self, precision: str) -> Tolerance:
        """This tolerance with the default of ``precision`` ("float16", "bfloat16") where it has none."""
        default = PRECISION_DEFAULTS.get(precision, PRECISION_DEFAULTS["float16"])
        return Tolerance(default if self.rtol is None else self.rtol, default if self.atol is None else self.atol,
                         self.metric)

    def describe(self, precision: str) -> str:
        """The tolerance as the report says it: its figures, and whether they are the precision's default."""
        resolved = self.resolved(precision)
        defaulted = [name for name in ("rtol", "atol") if getattr(self, name) is None]
        origin = f" ({' and '.join(defaulted)}: {precision}'s default)" if defaulted else ""
        return f"{resolved.metric}, rtol={resolved.rtol:g} atol={resolved.atol:g}{origin}"


PRECISION_DEFAULTS = {"float16": 1e-2, "bfloat16": 8e-2}
"""The default rtol and atol by low precision: bfloat16 keeps 8 bits of mantissa against float16's
11, so its rounding error, and what an honest conversion drifts by, is 8 times float16's."""


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
        rtol, atol = tol.rtol, tol.atol
        assert rtol is not None and atol is not None, "a tolerance resolved for the precision"
        if math.isnan(self.max_abs):  # a non-float output
            return self.mismatched <= rtol
        return {
            "elementwise": lambda: self.elementwise_violations == 0,
            "max": lambda: self.max_abs <= atol or self.max_rel <= rtol,
            "mean": lambda: self.mean_abs <= atol or self.mean_rel <= rtol,
            "rel-l2": lambda: self.rel_l2 <= rtol,
            "cosine": lambda: 1 - self.cosine <= rtol,
        }[tol.metric]()


def errors(reference, mixed, tol: Tolerance) -> Errors:
    """The statistics of ``mixed`` against ``reference``: tensors, or sequences and maps as
    ONNX Runtime returns them (lists and dicts)."""
    (reference, layout), (mixed, mixed_layout) = values(reference), values(mixed)
    if layout != mixed_layout:
        raise UserError(f"output shapes differ: reference {_shown(layout)}, mixed {_shown(mixed_layout)}")
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


def values(output) -> tuple[np.ndarray, object]:
    """An output as one array, and its layout (equal layouts: the arrays' elements correspond).
    A tensor is itself (its layout: its shape); a map is its values in key order; a sequence
    is its items' values, stacked where the items' layouts agree (a sequence of maps with the
    same keys is [items, keys], classifier-shaped), else flattened one after another."""
    if isinstance(output, dict):
        keys = sorted(output, key=repr)
        parts = [values(output[key]) for key in keys]
        return _joined([array for array, _ in parts]), ("map", tuple(keys), tuple(layout for _, layout in parts))
    if isinstance(output, (list, tuple)):
        parts = [values(item) for item in output]
        return _joined([array for array, _ in parts]), ("sequence", tuple(layout for _, layout in parts))
    array = np.asarray(output)
    return array, array.shape


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    if not arrays:
        return np.zeros(0)
    if all(a.shape == arrays[0].shape for a in arrays):
        return np.stack(arrays)
    return np.concatenate([a.ravel() for a in arrays])


def _shown(layout) -> str:
    """A layout in the words of an error: a tensor's shape, else what the sequence or map holds."""
    if not isinstance(layout, tuple) or not layout or not isinstance(layout[0], str):
        return str(list(layout))
    if layout[0] == "map":
        return f"a map with keys {list(layout[1])[:8]}"
    return f"a sequence of {len(layout[1])}"


def _agreement(reference: np.ndarray, mixed: np.ndarray) -> tuple[float, float]:
    k = min(TOP_K, reference.shape[1])
    top1 = float(np.mean(np.argmax(reference, 1) == np.argmax(np.nan_to_num(mixed, nan=-np.inf), 1)))
    ref_k = np.argsort(-reference, 1)[:, :k]
    mix_k = np.argsort(-np.nan_to_num(mixed, nan=-np.inf), 1)[:, :k]
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_k, mix_k)])
    return top1, float(overlap)
