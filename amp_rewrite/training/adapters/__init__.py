"""Model adaptations for training, each one module with both halves: ``lower(model)`` turns a form
of the model the step cannot train as it is into one it can (in place), and ``write_back(model,
weights)`` puts trained weights into that form (in place). The step builder lowers with every
adapter of ``ADAPTERS`` in order; the export writes back in reverse order, into the model as given.
Adding an adaptation is adding a module with both functions to ``ADAPTERS``.

``encoders`` lives here too but is no weight adapter: it splits the model's string encoders into a
model of their own, run ahead of the step; the exported model keeps them as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import onnx

from amp_rewrite.training.adapters import attribute_weights, constant_weights, float32_view


class Adapter(Protocol):
    def lower(self, model: onnx.ModelProto) -> object: ...

    def write_back(self, model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None: ...


ADAPTERS: tuple[Adapter, ...] = (constant_weights, attribute_weights, float32_view)
"""In the order the step builder applies them: weights out of Constant nodes, then out of
ai.onnx.ml's attributes (as float initializers), then every float type made float32."""


def lower(model: onnx.ModelProto) -> None:
    """``model`` in the form the step trains (in place): every adapter's ``lower``, in order."""
    for adapter in ADAPTERS:
        adapter.lower(model)


def write_back(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None:
    """Trained ``weights`` into ``model`` (in place): every adapter's ``write_back``, in reverse
    order. ``model`` is the model as given, or any form between it and the lowered one."""
    for adapter in reversed(ADAPTERS):
        adapter.write_back(model, weights)
