"""Mixed-precision training of ONNX models on ONNX Runtime: gradients, standard losses, loss
scaling, optimizers, and the training step as one graph."""

from amp_rewrite.autodiff import gradient_model
from amp_rewrite.training.graph.losses import LOSSES, attach_loss
from amp_rewrite.training.graph.optimizers import SGD, AdamW
from amp_rewrite.training.graph.scaling import LossScale
from amp_rewrite.training.spec import StepSpec
from amp_rewrite.training.step import TrainingStep, build

__all__ = ["LOSSES", "SGD", "AdamW", "LossScale", "StepSpec", "TrainingStep", "attach_loss", "build",
           "gradient_model"]
