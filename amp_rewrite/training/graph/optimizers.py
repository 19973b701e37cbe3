"""Optimizer updates as graph nodes, in float32, with PyTorch's semantics.

The learning rate and weight decay are graph inputs (a schedule needs no rebuild);
the other hyper-parameters are constants of the built graph. Each optimizer names
its per-parameter state (zeros at the start) and builds ``(new_param, new_state)``
from the parameter, its unscaled float32 gradient, its state and the step count
(a float32 scalar holding the number of the step being taken, 1 for the first).
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder

DEFAULT_LR = {"adamw": 1e-5, "sgd": 1e-3}
"""The command line's default learning rate by optimizer: a rate that fine-tunes a pretrained model
without wrecking it in the first steps: AdamW's first updates move every weight by about the
rate, whatever its gradient (at 1e-4 a pretrained encoder's loss rose in one step; at 1e-5 it
trained)."""


@dataclass(frozen=True)
class Hyper:
    """The names of the step graph's scalar float32 inputs the update reads."""

    lr: str
    weight_decay: str
    step: str


@dataclass(frozen=True)
class SGD:
    """``torch.optim.SGD``: weight decay added to the gradient, momentum buffer ``m*buf + g``
    (zero at the start, so the first step's buffer is the gradient), ``p - lr*buf``."""

    momentum: float = 0.9
    nesterov: bool = False
    name = "sgd"

    @property
    def states(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def update(self, b: GraphBuilder, param: str, grad: str, state: list[str], h: Hyper) -> tuple[str, list[str]]:
        g = b.op("Add", grad, b.op("Mul", param, h.weight_decay))
        if not self.momentum:
            return b.op("Sub", param, b.op("Mul", g, h.lr)), []
        buffer = b.op("Add", b.op("Mul", state[0], b.const(self.momentum, like=param)), g)
        direction = b.op("Add", g, b.op("Mul", buffer, b.const(self.momentum, like=param))) if self.nesterov \
            else buffer
        return b.op("Sub", param, b.op("Mul", direction, h.lr)), [buffer]


@dataclass(frozen=True)
class AdamW:
    """``torch.optim.AdamW``: decoupled decay ``p*(1 - lr*wd)``, moments with bias correction,
    ``p - lr * m_hat / (sqrt(v_hat) + eps)``."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    name = "adamw"

    @property
    def states(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def update(self, b: GraphBuilder, param: str, grad: str, state: list[str], h: Hyper) -> tuple[str, list[str]]:
        one = b.const(1.0, like=param)
        decayed = b.op("Mul", param, b.op("Sub", one, b.op("Mul", h.lr, h.weight_decay)))
        m = b.op("Add", b.op("Mul", state[0], b.const(self.beta1, like=param)),
                 b.op("Mul", grad, b.const(1 - self.beta1, like=param)))
        v = b.op("Add", b.op("Mul", state[1], b.const(self.beta2, like=param)),
                 b.op("Mul", b.op("Mul", grad, grad), b.const(1 - self.beta2, like=param)))
        correction1 = b.op("Sub", one, b.op("Pow", b.const(self.beta1, like=param), h.step))
        correction2 = b.op("Sub", one, b.op("Pow", b.const(self.beta2, like=param), h.step))
        denominator = b.op("Add", b.op("Sqrt", b.op("Div", v, correction2)), b.const(self.eps, like=param))
        step_size = b.op("Div", h.lr, correction1)
        return b.op("Sub", decayed, b.op("Mul", step_size, b.op("Div", m, denominator))), [m, v]


OPTIMIZERS = {"sgd": SGD, "adamw": AdamW}


def optimizer(spec: str | SGD | AdamW) -> SGD | AdamW:
    if isinstance(spec, (SGD, AdamW)):
        return spec
    if spec not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {spec!r}; choose one of: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[spec]()


def clipped_by_global_norm(b: GraphBuilder, grads: list[str], squares: list[str], max_norm: float) -> list[str]:
    """The float32 gradients scaled by ``min(1, max_norm / (norm + 1e-6))``, their global L2 norm
    taken over all of them together (``torch.nn.utils.clip_grad_norm_``): the square root of the
    sum of ``squares``, each parameter's sum of its squared gradient (``flat_state.Group.square_sums``),
    added in order. After unscaling: an inf or NaN gradient (a skipped step) makes the factor 0 or
    NaN, and the step keeps its old values anyway."""
    norm = b.op("Sqrt", squares[0] if len(squares) == 1 else b.op("Sum", *squares))
    factor = b.op("Min", b.const(1.0, like=norm),
                  b.op("Div", b.const(float(max_norm), like=norm), b.op("Add", norm, b.const(1e-6, like=norm))))
    return [b.op("Mul", g, factor) for g in grads]
