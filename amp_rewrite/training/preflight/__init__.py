"""Checks made before a step is built, each refusing in one line what no step could train: a loss
that reaches no weight (the op that stops the gradient named), probabilities past float32's
resolution."""
