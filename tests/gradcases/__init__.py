"""Gradient test cases, one module per family of rules; ``CASES`` is their union.

A :class:`Case` is one node: its op, inputs (float arrays are differentiated unless
listed in ``constant``; integer arrays never are), attributes and opset. The
harness in ``tests/gradcheck.py`` builds ``loss = sum_k sum(O(k) * R_k)`` with fixed
random ``R_k`` over the float outputs in ``outputs`` and compares the gradients
``gradient_model`` builds with central finite differences in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    op: str
    inputs: dict[str, np.ndarray | None]
    """Node inputs in order; None is an omitted optional input."""
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    id: str = ""
    constant: tuple[str, ...] = ()
    """Float inputs that are not differentiated (bounds, exponents)."""
    outputs: tuple[int, ...] = (0,)
    """Outputs summed into the loss (all of them must be float)."""
    n_outputs: int | None = None
    """How many outputs the node has (default: max(outputs) + 1)."""
    domain: str = ""
    eps: float = 1e-6
    """Finite-difference step."""
    rtol: float = 1e-5
    atol: float = 1e-7
    ort: bool = True
    """Also run the gradient graph on ONNX Runtime (float32) and compare."""

    @property
    def name(self) -> str:
        return f"{self.op}-{self.id}" if self.id else self.op


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return rng(seed).normal(0, scale, shape).astype(np.float64)


def away_from_zero(*shape: int, seed: int = 0, low: float = 0.2) -> np.ndarray:
    """Random values with magnitude at least ``low`` (kinks at 0 stay out of the finite differences)."""
    x = rng(seed).uniform(low, 1.5, shape) * rng(seed + 1).choice([-1.0, 1.0], shape)
    return x.astype(np.float64)


def positive(*shape: int, seed: int = 0, low: float = 0.5, high: float = 2.0) -> np.ndarray:
    return rng(seed).uniform(low, high, shape).astype(np.float64)


def ints(values, dtype=np.int64) -> np.ndarray:
    return np.asarray(values, dtype=dtype)


def _collect() -> list[Case]:
    import importlib
    import pkgutil

    cases: list[Case] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        cases.extend(importlib.import_module(f"{__name__}.{module}").CASES)
    return cases


CASES: list[Case] = _collect()
