"""Mixed-precision training of ONNX models: gradients now; losses, loss scaling, optimizers and
the trainer build on them."""

from amp_rewrite.autodiff import gradient_model

__all__ = ["gradient_model"]
