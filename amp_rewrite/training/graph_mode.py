"""Graph mode: the training step bound once, at fixed addresses, so that ONNX Runtime's CUDA
provider can capture it as CUDA graphs and replay each step in one launch.

A CUDA graph replays the kernels it captured on the addresses they had, so every input and
output of the step must stay where it was (ONNX Runtime's conditions for ``enable_cuda_graph``:
static shapes, every value bound on the device, captured after regular warm-up runs).
``FixedBinding`` binds the step so: each data input gets a buffer of the step's fixed extents,
filled in place each step; the learning rate and weight decay are device scalars updated in
place; the loss and the skipped flag go to device outputs read back after the run (the model's
own outputs, which nothing reads, stay unbound: ONNX Runtime places them as intermediate values,
from its arena, the same in every replay). The carried
values alternate between the trainer's two buffer sets (the step reads one and writes the
other), so there are two bindings, one per parity, captured as two graphs (run option
``gpu_graph_id`` 0 and 1). On another provider the same binding runs without graphs: it is how
the mode is tested on the CPU, bit for bit against the ordinary binding.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.errors import UserError
from amp_rewrite.runtime import instrument
from amp_rewrite.training import float32_view
from amp_rewrite.training.step import Carried, StepSpec

CUDA = "CUDAExecutionProvider"
GRAPH_OPTIONS = {"enable_cuda_graph": "1"}
"""The CUDA provider's options that turn CUDA graphs on."""
GRAPH_ID = "gpu_graph_id"
"""The run option that names the graph a run captures or replays (ONNX Runtime's key)."""
WARMUP_RUNS = 6
"""Runs within which a failure is ONNX Runtime refusing the graphs (the trainer goes on without
them): each graph is captured after two regular runs of its own id at most, and two ids alternate."""




def fixed_extents(graph_mode: bool | None, provider: str) -> bool:
    """Whether graph mode wants a step built for fixed extents: asked for (True), or by default
    (None) on CUDA."""
    return bool(graph_mode) or graph_mode is None and provider == CUDA


def wanted(graph_mode: bool | None, provider: str, spec: StepSpec) -> bool:
    """Whether a trainer binds its step at fixed addresses: as ``graph_mode`` says, or where it is
    None, on CUDA for a step of fixed extents (``StepSpec.extents``: a specialized step). A UserError
    where it is asked for a step of any extents: a fixed buffer holds one shape."""
    if graph_mode is None:
        return fixed_extents(None, provider) and spec.extents is not None
    if graph_mode and spec.extents is None:
        raise UserError("graph mode needs a step of fixed extents, and this one takes batches of any size: build it "
                        "with build(specialize={input: extents}), or train without graph mode")
    return graph_mode


def note_refused(exc: BaseException) -> None:
    """The one line that says the trainer goes on without CUDA graphs."""
    print(f"amp-rewrite: note: CUDA graphs refused by ONNX Runtime ({instrument.first_line(exc)}); training "
          f"without them", file=sys.stderr)


def bind_carried(binding, carried: Sequence[Carried], reads: Mapping[str, Any], writes: Mapping[str, Any]) -> None:
    """Each carried value read from ``reads`` and its next value written into ``writes`` (OrtValues
    keyed by the carried input's name)."""
    for item in carried:
        binding.bind_ortvalue_input(item.input, reads[item.input])
        binding.bind_ortvalue_output(item.output, writes[item.input])


class FixedBinding:
    """The step's two bindings (one per buffer set read), every value in them at a fixed address.

    ``model``: the step the ``session`` runs. ``sets``: the trainer's two carried buffer sets,
    whose OrtValues keep their places (a checkpoint is loaded into them in place). ``allocate``:
    an array -> its OrtValue on the step's device. ``graphs``: run as CUDA graphs (the session was
    opened with ``GRAPH_OPTIONS``), ``gpu_graph_id`` 0 for a step that reads ``sets[0]``, 1 for
    ``sets[1]``."""

    def __init__(self, model: onnx.ModelProto, session, spec: StepSpec, sets: Sequence[dict], allocate,
                 graphs: bool) -> None:
        import onnxruntime as ort

        self.session, self.spec, self.sets, self.allocate, self.graphs = session, spec, sets, allocate, graphs
        self.scalars = {name: allocate(np.zeros((), np.float32)) for name in (spec.lr, spec.weight_decay)}
        outputs = {o.name: o.shape for o in session.get_outputs()}
        self.loss = allocate(np.zeros(_static(outputs[spec.loss]), np.float32))
        self.skipped = allocate(np.zeros(_static(outputs[spec.skipped]), np.bool_))
        types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
        extents = spec.extents or {}
        first = {name: np.zeros(extents[name], types[name]) for name in spec.data if name in extents}
        self.data: dict[str, Any] = {name: allocate(array) for name, array in first.items()}
        """Each data input's buffer, of the step's extents (of the first batch's, for an input it has none for)."""
        self.kinds = {name: _kind(array) for name, array in first.items()}
        """Each buffer's element type and shape, in words (``_kind``)."""
        self.bindings: list = []
        self.options: list = [None, None]
        if graphs:
            self.options = [ort.RunOptions(), ort.RunOptions()]
            for graph_id, options in enumerate(self.options):
                options.add_run_config_entry(GRAPH_ID, str(graph_id))
        self.runs = 0
        """Runs that succeeded."""

    @property
    def warming(self) -> bool:
        """Whether a failing run now is ONNX Runtime refusing the graphs (``WARMUP_RUNS``)."""
        return self.graphs and self.runs < WARMUP_RUNS

    def fill(self, batch: Mapping[str, Any], lr: float, weight_decay: float) -> None:
        """The batch and the hyper-parameters copied into their buffers, in place (an OrtValue of the
        batch, from ``Trainer.device_batch``, device to device). A UserError for an input of another
        shape or type than its buffer's: the buffers are fixed."""
        import onnxruntime as ort

        for name in self.spec.data:
            given = batch[name]
            source = given if isinstance(given, ort.OrtValue) else np.ascontiguousarray(float32_view.as_float32(given))
            if name not in self.data:
                first = source.numpy() if isinstance(source, ort.OrtValue) else source
                self.data[name], self.kinds[name] = self.allocate(first), _kind(first)
            buffer = self.data[name]
            if _kind(source) != (_kind(buffer) if isinstance(source, ort.OrtValue) else self.kinds[name]):
                raise UserError(f"graph mode: input {name!r} is {_kind(source)}; its fixed buffer holds "
                                f"{self.kinds[name]} (every batch of a graph-mode step has one shape and type)")
            buffer.update_inplace(source)
        self.scalars[self.spec.lr].update_inplace(np.array(lr, np.float32))
        self.scalars[self.spec.weight_decay].update_inplace(np.array(weight_decay, np.float32))

    def run(self, current: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """One step that reads ``current`` (one of ``sets``) and writes the other; its loss and
        skipped flag, copied to the host."""
        if not self.bindings:
            self.bindings = [self._bound(parity) for parity in (0, 1)]
        parity = 0 if current is self.sets[0] else 1
        self.session.run_with_iobinding(self.bindings[parity], self.options[parity])
        self.runs += 1
        return self.loss.numpy().copy(), self.skipped.numpy().copy()

    def _bound(self, parity: int):
        binding = self.session.io_binding()
        for name, value in {**self.data, **self.scalars}.items():
            binding.bind_ortvalue_input(name, value)
        bind_carried(binding, self.spec.carried, self.sets[parity], self.sets[1 - parity])
        binding.bind_ortvalue_output(self.spec.loss, self.loss)
        binding.bind_ortvalue_output(self.spec.skipped, self.skipped)
        return binding


def _static(shape) -> list[int]:
    """A declared output shape (ONNX Runtime's: ints, names or None) where it is static, else a scalar's."""
    return list(shape) if shape is not None and all(isinstance(d, int) for d in shape) else []


def _kind(value) -> str:
    """An array's or OrtValue's element type and shape, in words."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return f"{value.data_type()} {list(value.shape())}"
