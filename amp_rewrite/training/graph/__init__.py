"""The step graph's pieces: losses, train-mode rewrites, the formulas' constants, loss scaling,
optimizers, gradient accumulation, flat optimizer state, and their assembly after the backward."""
