"""The gradient rules, one module per family; importing this package registers them all."""

from amp_rewrite.autodiff.rules import (  # noqa: F401
    control,
    conv,
    elementwise,
    linear,
    movement,
    norm,
    pad,
    quantize,
    reduce,
    resize,
)
