"""Timed runs of models on one execution provider, and where their time goes.

``time_models`` runs models as a serving loop does. Each sample is placed once where the
provider reads it (``DEVICES``: the GPU for CUDA and TensorRT, host memory for the CPU
provider) and bound with ONNX Runtime's I/O binding, outputs included, so host copies stay
out of the timing; a provider ONNX Runtime cannot bind to its device reads host inputs, and
``Timing.binding`` says so. ``warmup`` untimed runs come first, then ``runs`` timed runs
cycling through the samples, interleaved across the models timed together.

A second session per model, with ONNX Runtime's profiler on, runs it ``profile_runs`` more times;
its node events, summed per node and divided by the runs, are ``Timing.nodes``, each with the
precision its inputs had (casts and device copies apart). On an asynchronous provider (CUDA)
the profiler of a release build times each node on the host (the kernel launch), not on the
device: ``Timing.host_side_profile`` says so. Device memory is read with NVML where the
provider runs on an NVIDIA GPU. All of it happens in a child process (``isolate``): a crash
of ONNX Runtime is one line, and the device memory counted is the child's own.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from amp_rewrite.inputs.samples import Sample
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.isolate import isolated

DEVICES = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}
"""Where each provider reads its inputs, as ``OrtValue`` names the device."""
ASYNCHRONOUS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
                          "DmlExecutionProvider"})
"""Providers whose nodes return before the device has run them."""
KINDS = {"float16": "float16", "bfloat16": "bfloat16", "float": "float32", "double": "float64"}
"""The precision a profiled node ran in, by the element type ONNX Runtime's profile names."""
INSERTED_CAST = "InsertedPrecisionFreeCast_"
"""ONNX Runtime names so the casts it inserts around a node its provider has no kernel for."""
COPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})
KERNEL_SUFFIX = "_kernel_time"
"""The suffix of a node's event name in ONNX Runtime's profile."""


@dataclass
class NodeTime:
    """One node of the session that ran: time per run, in milliseconds."""

    name: str
    op_type: str
    kind: str
    """float16, bfloat16, float32 or float64 (its first float input's type, else its output's);
    cast (one of the model's), inserted cast (ONNX Runtime's), copy, or other (no float data)."""
    ms: float
    input_shapes: list[list[int]]
    provider: str = ""
    """The provider ONNX Runtime assigned it to (another than the session's is a fallback)."""


@dataclass
class Timing:
    latencies_ms: list[float]
    binding: str
    nodes: list[NodeTime] = field(default_factory=list)
    host_side_profile: bool = False
    device_memory_bytes: int | None = None
    """Device memory in use after creating the session and the warm-up runs, less before (NVML);
    None where not read."""

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    @property
    def runs_per_second(self) -> float:
        return 1000.0 * len(self.latencies_ms) / sum(self.latencies_ms)


@dataclass
class Timed:
    """A model to time: its samples are already in the model's input types."""

    label: str
    model: onnx.ModelProto
    base_dir: str | None
    data: Sequence[Sample]
    provider_options: Mapping[str, str] | None = None


def time_models(models: Sequence[Timed], provider: str, warmup: int = 10, runs: int = 100,
                profile_runs: int = 10) -> list[Timing | str]:
    """Time each model on ``provider``: a Timing, or the one-line reason ONNX Runtime refused it.

    Every session lives in one child process and the timed runs interleave (one run of each
    model per round, the order reversed every other round), so a change of load or clock
    over time touches every model alike. Unnamed nodes are named after their first output, in
    the child, so that the profile's names are the ones ``node_key`` gives."""
    device = DEVICES.get(provider, "cpu")

    def work(progress) -> list[Timing | str]:
        live: dict[int, tuple] = {}
        found: list[Timing | str] = []
        timings: dict[int, Timing] = {}  # the entries of ``found`` that are timings, by position
        for position, entry in enumerate(models):
            progress(f"creating the session of {entry.label} on {provider}")
            try:
                session, bound, memory = _start(entry, provider, device, warmup)
            except Exception as exc:  # a model ONNX Runtime refuses spoils no other
                found.append(instrument.first_line(exc, limit=1000))
                continue
            live[position] = (session, bound)
            timings[position] = Timing([], _binding_text(provider, device), host_side_profile=provider in ASYNCHRONOUS,
                                       device_memory_bytes=memory)
            found.append(timings[position])
        progress(f"timing {len(live)} models on {provider}")
        order = list(live)
        for run in range(runs):
            for position in order if run % 2 == 0 else order[::-1]:
                session, bound = live[position]
                binding = bound[run % len(bound)]
                started = time.perf_counter()
                session.run_with_iobinding(binding)
                timings[position].latencies_ms.append(1000.0 * (time.perf_counter() - started))
        live.clear()
        if profile_runs > 0:
            for position in order:
                progress(f"profiling {models[position].label} on {provider}")
                timings[position].nodes = _profile(models[position], provider, device, profile_runs)
        return found

    return isolated(work, "onnxruntime (bench)")


def _start(entry: Timed, provider: str, device: str, warmup: int, profile_prefix: str | None = None):
    """A session with its bound samples, warmed up, and the device memory that took (or None)."""
    _name_nodes(entry.model)
    device_id = int((entry.provider_options or {}).get("device_id", 0))
    before = device_memory(device, device_id)
    session = instrument.session(entry.model, entry.base_dir, provider, optimize="all",
                                 provider_options=entry.provider_options, profile_prefix=profile_prefix)
    bound = [_bind(session, sample, device, device_id) for sample in entry.data]
    for run in range(warmup):
        session.run_with_iobinding(bound[run % len(bound)])
    after = device_memory(device, device_id)
    return session, bound, None if before is None or after is None else after - before


def _profile(entry: Timed, provider: str, device: str, runs: int) -> list[NodeTime]:
    with tempfile.TemporaryDirectory(prefix="amp-rewrite-profile-") as folder:
        session, bound, _ = _start(entry, provider, device, 1, os.path.join(folder, "profile"))
        for run in range(runs):
            session.run_with_iobinding(bound[run % len(bound)])
        with open(session.end_profiling()) as events:
            return node_times(json.load(events), skip=1)  # the first run allocates: not a steady-state time


def _bind(session, sample: Sample, device: str, device_id: int):
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in sample.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device,
                                                                           device_id))
    for output in session.get_outputs():
        binding.bind_output(output.name, device, device_id)
    return binding


def _binding_text(provider: str, device: str) -> str:
    if provider in DEVICES:
        return f"inputs and outputs bound on {device} with I/O binding: host copies are not timed"
    return f"{provider} cannot be bound to its device here: inputs are read from host memory, copies timed"


def node_times(events: list[dict], skip: int = 0) -> list[NodeTime]:
    """Each node's mean time per run in an ONNX Runtime profile, leaving out its first ``skip``
    runs, in the order the nodes first ran."""
    totals: dict[str, NodeTime] = {}
    seen: dict[str, int] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        name = name[:-len(KERNEL_SUFFIX)]
        seen[name] = seen.get(name, 0) + 1
        if seen[name] <= skip:
            continue
        args = event.get("args", {})
        if name not in totals:
            totals[name] = NodeTime(name, args.get("op_name", ""), _kind(name, args), 0.0, _shapes(args),
                                    args.get("provider", ""))
        totals[name].ms += event.get("dur", 0) / 1000.0
    for name, node in totals.items():
        node.ms /= seen[name] - skip
    return list(totals.values())


def _kind(name: str, args: dict) -> str:
    op = args.get("op_name", "")
    if op == "Cast":
        return "inserted cast" if name.startswith(INSERTED_CAST) else "cast"
    if op in COPY_OPS:
        return "copy"
    for key in ("input_type_shape", "output_type_shape"):
        for entry in args.get(key, []):
            for type_name in entry:
                if type_name in KINDS:
                    return KINDS[type_name]
    return "other"


def _shapes(args: dict) -> list[list[int]]:
    return [list(shape) for entry in args.get("input_type_shape", []) for shape in entry.values()]


def _name_nodes(model: onnx.ModelProto) -> None:
    taken = {node.name for node in model.graph.node if node.name}
    for node in model.graph.node:
        if not node.name and node.output and node.output[0] not in taken:
            node.name = node.output[0]
            taken.add(node.name)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def default_provider() -> str:
    """CUDA where this onnxruntime has it and NVML sees a GPU, else the CPU provider."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers() and device_memory("cuda", 0) is not None:
        return "CUDAExecutionProvider"
    return "CPUExecutionProvider"


def _nvml():
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return nvml if nvml.nvmlInit_v2() == 0 else None


def device_memory(device: str, device_id: int) -> int | None:
    """Bytes in use on an NVIDIA device (by every process), or None where NVML cannot say."""
    nvml = _nvml() if device == "cuda" else None
    if nvml is None:
        return None
    handle, memory = ctypes.c_void_p(), _NvmlMemory()
    if (nvml.nvmlDeviceGetHandleByIndex_v2(device_id, ctypes.byref(handle))
            or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))):
        return None
    return int(memory.used)
