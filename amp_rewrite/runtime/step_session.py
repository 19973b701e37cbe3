"""A training step's session: the step graph on an execution provider, its carried values kept
on the device between runs, and graph mode.

The carried values (weights, optimizer states, the loss scale) stay in ONNX Runtime buffers
between steps (I/O binding). Two buffer sets are kept and swapped each step: the step reads
one and writes the other, since ONNX Runtime makes no promise about a buffer bound as both an
input and an output (a backward node may still read the old weight).

Graph mode binds the step once, at fixed addresses, so that ONNX Runtime's CUDA provider can
capture it as CUDA graphs and replay each step in one launch. A CUDA graph replays the kernels
it captured on the addresses they had, so every input and output of the step must stay where it
was (ONNX Runtime's conditions for ``enable_cuda_graph``: static shapes, every value bound on the
device, captured after regular warm-up runs). ``FixedBinding`` binds the step so: each data
input gets a buffer of the step's fixed extents, filled in place each step; the hyper-parameters
are device scalars updated in place; the loss and the skipped flag go to device outputs read back
after the run (the model's own outputs, which nothing reads, stay unbound: ONNX Runtime places
them as intermediate values, from its arena, the same in every replay). The carried values
alternate between the two buffer sets, so there are two bindings, one per parity, captured as
two graphs (run option ``gpu_graph_id`` 0 and 1). On another provider the same binding runs
without graphs: it is how the mode is tested on the CPU, bit for bit against the ordinary binding.

This module knows the step by its names alone (``StepIO``): what the training layer builds is
beyond it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.errors import UserError
from amp_rewrite.runtime import instrument

CUDA = "CUDAExecutionProvider"
GRAPH_OPTIONS = {"enable_cuda_graph": "1"}
"""The CUDA provider's options that turn CUDA graphs on."""
GRAPH_ID = "gpu_graph_id"
"""The run option that names the graph a run captures or replays (ONNX Runtime's key)."""
WARMUP_RUNS = 6
"""Runs within which a failure is ONNX Runtime refusing the graphs (the session goes on without
them): each graph is captured after two regular runs of its own id at most, and two ids alternate."""
PROVIDER_DEFAULTS = {CUDA: {"arena_extend_strategy": "kSameAsRequested"}}
"""Provider options the step runs with unless the caller's say otherwise. CUDA's arena grows by
powers of two by default; a step allocates the same buffers every time, so an arena grown by what
it asks holds less device memory in the same time (benchmarks/RESULTS.md, "Training steps on a GPU")."""


@dataclass(frozen=True)
class StepIO:
    """The step graph's interface by name: ``data`` fed each run (arrays, or device values from
    ``device_batch``), ``scalars`` (float32 hyper-parameters) fed each run, ``carried`` (input,
    output) pairs whose outputs become the next run's inputs, the ``loss`` and ``skipped`` outputs
    read back, and the data's fixed ``extents`` (None: any)."""

    data: Sequence[str]
    scalars: Sequence[str]
    carried: Sequence[tuple[str, str]]
    loss: str
    skipped: str
    extents: Mapping[str, Sequence[int]] | None = None


def fixed_extents(graph_mode: bool | None, provider: str) -> bool:
    """Whether graph mode wants a step built for fixed extents: asked for (True), or by default
    (None) on CUDA."""
    return bool(graph_mode) or graph_mode is None and provider == CUDA


def wanted(graph_mode: bool | None, provider: str, extents: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether a step is bound at fixed addresses: as ``graph_mode`` says, or where it is None, on
    CUDA for a step of fixed ``extents`` (a specialized step). A UserError where it is asked for a
    step of any extents: a fixed buffer holds one shape."""
    if graph_mode is None:
        return fixed_extents(None, provider) and extents is not None
    if graph_mode and extents is None:
        raise UserError("graph mode needs a step of fixed extents, and this one takes batches of any size: build it "
                        "with build(specialize={input: extents}), or train without graph mode")
    return graph_mode


def note_refused(exc: BaseException) -> None:
    """The one line that says training goes on without CUDA graphs."""
    print(f"amp-rewrite: note: CUDA graphs refused by ONNX Runtime ({instrument.first_line(exc)}); training "
          f"without them", file=sys.stderr)


def is_device_value(value: Any) -> bool:
    """Whether ``value`` is an ONNX Runtime value (``device_batch``), not a host array."""
    import onnxruntime as ort

    return isinstance(value, ort.OrtValue)


class StepSession:
    """``model`` (the step graph, ``io`` its interface) in a session on ``provider``, its carried
    values from ``initial`` on the device. ``provider_options``: ONNX Runtime's names (CUDA's
    ``device_id``, ``gpu_mem_limit``, ...) over ``PROVIDER_DEFAULTS``; the values live on
    ``device_id``'s device. ``graph_mode``: ``wanted``'s argument; where ONNX Runtime refuses the
    graphs (at the session or in a first run), one note and the session goes on without."""

    def __init__(self, model: onnx.ModelProto, io: StepIO, initial: Mapping[str, np.ndarray], provider: str,
                 provider_options: Mapping[str, str] | None, graph_mode: bool | None) -> None:
        self.model, self.io, self.provider = model, io, provider
        self.provider_options = {**PROVIDER_DEFAULTS.get(provider, {}), **(provider_options or {})}
        self.device = "cuda" if provider == CUDA else "cpu"
        self.device_id = int(self.provider_options.get("device_id", 0))
        self.graph_mode = wanted(graph_mode, provider, io.extents)
        """Whether the step is bound at fixed addresses (``FixedBinding``)."""
        graphs = self.graph_mode and provider == CUDA
        if graphs:
            try:
                self.session = self._open(GRAPH_OPTIONS)
            except UserError:  # not a refusal of the graphs: the provider is not there
                raise
            except Exception as exc:
                note_refused(exc)
                graphs = self.graph_mode = False
        if not graphs:
            with instrument.refusals("the training step", provider):  # a step ONNX Runtime refuses: one line
                self.session = self._open({})
        names = [name for name, _ in io.carried]
        self.buffers = [{name: self.device_value(initial[name]) for name in names},
                        {name: self.device_value(np.zeros_like(initial[name])) for name in names}]
        """The two carried buffer sets: the step reads the first and writes the second, then they swap."""
        self.fixed = FixedBinding(model, self.session, io, list(self.buffers), self.device_value,
                                  graphs) if self.graph_mode else None

    def _open(self, options: Mapping[str, str]):
        """The step's session, with ``options`` over the provider's (basic optimizations only: fusions
        across the casts would change the precision chosen)."""
        return instrument.session(self.model, None, self.provider, optimize="basic",
                                  provider_options={**self.provider_options, **options})

    def device_value(self, array: np.ndarray):
        """A copy of ``array`` on the step's device (on the CPU an OrtValue shares its array's memory,
        which the step writes over: the step's first values must stay as they were)."""
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.array(array, order="C"), self.device, self.device_id)

    def run(self, batch: Mapping[str, Any], scalars: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """One step on ``batch`` (host arrays, already in the step's types, or device values) with the
        hyper-parameters ``scalars``: the loss and the skipped flag. The buffer sets then swap."""
        if self.fixed is not None:
            self.fixed.fill(batch, scalars)
        with instrument.refusals("the training step", self.provider, raised_as=(RuntimeError,)):
            loss, skipped = self._fixed_run(batch, scalars) if self.fixed is not None else self._run(batch, scalars)
        self.buffers.reverse()
        return loss, skipped

    def _run(self, batch: Mapping[str, Any], scalars: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """One run bound as it comes: the batch and the hyper-parameters from the host, the loss and the
        skipped flag to it."""
        binding = self.session.io_binding()
        for name in self.io.data:
            if is_device_value(batch[name]):
                binding.bind_ortvalue_input(name, batch[name])
            else:
                binding.bind_cpu_input(name, np.asarray(batch[name], order="C"))
        for name in self.io.scalars:
            binding.bind_cpu_input(name, np.array(scalars[name], np.float32))
        bind_carried(binding, self.io.carried, *self.buffers)
        for name in (self.io.loss, self.io.skipped):
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        loss, skipped = (value.numpy() for value in binding.get_outputs()[-2:])  # bound last
        return loss, skipped

    def _fixed_run(self, batch: Mapping[str, Any], scalars: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """One run of the fixed binding (its buffers filled); where a first run fails as CUDA graphs
        are captured, the note, and this step and the rest bound as they come, in a session without
        graphs (a failed run wrote only the buffer set the step writes)."""
        assert self.fixed is not None
        try:
            return self.fixed.run(self.buffers[0])
        except Exception as exc:
            if not self.fixed.warming:
                raise
            note_refused(exc)
        self.session, self.fixed, self.graph_mode = self._open({}), None, False
        return self._run(batch, scalars)

    def value(self, name: str) -> np.ndarray:
        """The current value of a carried input, copied: the step writes its buffers over in place
        (on the CPU, ``OrtValue.numpy`` shares them)."""
        return self.buffers[0][name].numpy().copy()

    def load(self, name: str, value: np.ndarray) -> None:
        """A carried input's current value set, in place (a fixed binding holds its buffer)."""
        self.buffers[0][name].update_inplace(value)


def bind_carried(binding, carried: Sequence[tuple[str, str]], reads: Mapping[str, Any],
                 writes: Mapping[str, Any]) -> None:
    """Each carried value read from ``reads`` and its next value written into ``writes`` (OrtValues
    keyed by the carried input's name)."""
    for name, output in carried:
        binding.bind_ortvalue_input(name, reads[name])
        binding.bind_ortvalue_output(output, writes[name])


class FixedBinding:
    """The step's two bindings (one per buffer set read), every value in them at a fixed address.

    ``model``: the step the ``session`` runs. ``sets``: the two carried buffer sets, whose
    OrtValues keep their places (a checkpoint is loaded into them in place). ``allocate``: an
    array -> its OrtValue on the step's device. ``graphs``: run as CUDA graphs (the session was
    opened with ``GRAPH_OPTIONS``), ``gpu_graph_id`` 0 for a step that reads ``sets[0]``, 1 for
    ``sets[1]``."""

    def __init__(self, model: onnx.ModelProto, session, io: StepIO, sets: Sequence[dict], allocate,
                 graphs: bool) -> None:
        import onnxruntime as ort

        self.session, self.io, self.sets, self.allocate, self.graphs = session, io, sets, allocate, graphs
        self.scalars = {name: allocate(np.zeros((), np.float32)) for name in io.scalars}
        outputs = {o.name: o.shape for o in session.get_outputs()}
        self.loss = allocate(np.zeros(_static(outputs[io.loss]), np.float32))
        self.skipped = allocate(np.zeros(_static(outputs[io.skipped]), np.bool_))
        types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
        extents = io.extents or {}
        first = {name: np.zeros(extents[name], types[name]) for name in io.data if name in extents}
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

    def fill(self, batch: Mapping[str, Any], scalars: Mapping[str, float]) -> None:
        """The batch and the hyper-parameters copied into their buffers, in place (a device value of
        the batch, device to device). A UserError for an input of another shape or type than its
        buffer's: the buffers are fixed."""
        for name in self.io.data:
            given = batch[name]
            device = is_device_value(given)
            source: Any = given if device else np.ascontiguousarray(given)
            if name not in self.data:
                first = source.numpy() if device else source
                self.data[name], self.kinds[name] = self.allocate(first), _kind(first)
            buffer = self.data[name]
            if _kind(source) != (_kind(buffer) if device else self.kinds[name]):
                raise UserError(f"graph mode: input {name!r} is {_kind(source)}; its fixed buffer holds "
                                f"{self.kinds[name]} (every batch of a graph-mode step has one shape and type)")
            buffer.update_inplace(source)
        for name, value in self.scalars.items():
            value.update_inplace(np.array(scalars[name], np.float32))

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
        bind_carried(binding, self.io.carried, self.sets[parity], self.sets[1 - parity])
        binding.bind_ortvalue_output(self.io.loss, self.loss)
        binding.bind_ortvalue_output(self.io.skipped, self.skipped)
        return binding


def _static(shape) -> list[int]:
    """A declared output shape (ONNX Runtime's: ints, names or None) where it is static, else a scalar's."""
    return list(shape) if shape is not None and all(isinstance(d, int) for d in shape) else []


def _kind(value) -> str:
    """An array's or OrtValue's element type and shape, in words."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return f"{value.data_type()} {list(value.shape())}"
