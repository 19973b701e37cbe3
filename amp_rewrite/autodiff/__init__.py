"""Reverse-mode autodiff over ONNX graphs, emitting standard ONNX ops only (imports ``ir`` only)."""

from amp_rewrite.autodiff.gradient import MIN_OPSET, Backprop, add_backward, gradient_model, gradient_proto

__all__ = ["MIN_OPSET", "Backprop", "add_backward", "gradient_model", "gradient_proto"]
