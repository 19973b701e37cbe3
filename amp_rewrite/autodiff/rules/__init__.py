"""The gradient rules, one module per family; importing this package registers them all."""

from amp_rewrite.autodiff.rules import control, conv, elementwise, linear, movement, norm, reduce  # noqa: F401
