"""Running a model with ONNX Runtime: sessions on a provider (a clear line where the runtime
refuses the model), models made readable by the installed runtime (IR version, opset), and the
runs' outputs by name. The models derived for measuring are ``expose``'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir import ir_versions
from amp_rewrite.ir.opsets import default_opset, ensure_opset


def require_provider(provider: str) -> None:
    """A clear error when the installed onnxruntime does not offer ``provider``."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        raise UserError(f"{provider} is not available in this onnxruntime "
                        f"(available: {', '.join(ort.get_available_providers())})")


ORT_MIN_OPSET = 7
"""The oldest default-domain opset ONNX Runtime has kernels for (it has none for Add-6):
``runnable`` upgrades an older model to it."""

OPTIMIZATION = {"none": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "all": "ORT_ENABLE_ALL"}
"""ONNX Runtime's graph optimization levels by the names ``session`` takes."""


def session(model: onnx.ModelProto | bytes, base_dir: str | os.PathLike | None = None,
            provider: str = "CPUExecutionProvider", optimize: str = "none", reuse_memory: bool = True,
            arena: bool = True, threads: int = 0, provider_options: Mapping[str, str] | None = None,
            profile_prefix: str | None = None, save_optimized: str | os.PathLike | None = None,
            initializers: Mapping[str, np.ndarray] | None = None):
    """An ONNX Runtime session for ``model`` (or its serialized form) on ``provider`` (a clear
    error when it is not there or does not start); external data is read from ``base_dir``.
    ``optimize`` is a key of OPTIMIZATION (the graph rewrites ONNX Runtime may do).
    ``reuse_memory=False`` skips ONNX Runtime's buffer-reuse planning, whose time grows faster
    than linearly with the node count, at the price of holding every intermediate value to the
    end of a run. ``arena=False`` allocates CPU buffers from the C heap rather than from ONNX
    Runtime's growing arena: without buffer reuse each value is allocated once, and the arena
    only grows (``stages`` runs so).
    ``threads``: the size of ONNX Runtime's intra-op thread pool (0: its default, one per core).
    ``profile_prefix`` turns ONNX Runtime's profiler on (``end_profiling`` names the file);
    ``save_optimized`` is where ONNX Runtime writes the model it runs (its inserted casts in it).
    ``initializers``: arrays that replace the model's initializers of those names, which must
    be external data there (ONNX Runtime copies them in before it would read the files).
    A model (not its serialized form) runs ``runnable``."""
    import onnxruntime as ort

    require_provider(provider)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION[optimize])
    options.log_severity_level = 4
    options.enable_mem_reuse = reuse_memory
    options.enable_cpu_mem_arena = arena
    options.intra_op_num_threads = threads
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if save_optimized:
        options.optimized_model_filepath = os.fspath(save_optimized)
    if base_dir:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         os.fspath(base_dir))
    if initializers:
        options.add_external_initializers(list(initializers),
                                          [ort.OrtValue.ortvalue_from_numpy(a) for a in initializers.values()])
    proto = None if isinstance(model, bytes) else runnable(model)
    if proto is None:
        serialized = readable(model)
    else:
        with _zero_extents_unknown(proto):
            serialized = readable(proto.SerializeToString(), proto)
    created = ort.InferenceSession(serialized, options, providers=[provider],
                                   provider_options=[dict(provider_options or {})])
    if provider not in created.get_providers():  # onnxruntime-gpu lists CUDA even when it cannot load it
        raise UserError(f"{provider} could not be started (its libraries are missing or no device is there); "
                        f"the session got {', '.join(created.get_providers())}")
    return created


@functools.cache
def readable_ir_version() -> int:
    """The newest IR version the installed onnxruntime reads: asked of it, a one-node model per
    version from the newest onnx writes down (it says so only by refusing a model)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    for version in range(onnx.IR_VERSION, 3, -1):
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ORT_MIN_OPSET)], ir_version=version)
        try:
            ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return version
        except Exception:  # refused: an older version, then
            continue
    return onnx.IR_VERSION


def readable(serialized: bytes, model: onnx.ModelProto | None = None) -> bytes:
    """``serialized`` as the installed onnxruntime reads it: declared at the newest IR version it
    reads where the model declares a newer one (``model``, its proto where at hand, says which
    and whether its opsets allow that: a clear error where they need the newer version)."""
    declared = model.ir_version if model is not None else ir_versions.declared_ir_version(serialized)
    if declared is None or declared <= READ_BY_ALL:
        return serialized
    newest = readable_ir_version()
    if declared <= newest:
        return serialized
    if model is not None and (needed := ir_versions.needed_ir_version(model)) > newest:
        raise UserError(f"the installed onnxruntime reads IR versions up to {newest}, and the model's opsets "
                        f"need IR version {needed}: install a newer onnxruntime")
    return ir_versions.declared_at(serialized, newest)


READ_BY_ALL = 10
"""The newest IR version every onnxruntime this package takes (1.18 on) reads: a model declared
at it or below needs no asking (``readable_ir_version`` imports onnxruntime, and asks it)."""


def ir_version_note(model: onnx.ModelProto) -> str | None:
    """What the report says where ONNX Runtime ran the model declared at an older IR version
    (``readable``), None where it ran it as it is."""
    if model.ir_version <= READ_BY_ALL or model.ir_version <= (newest := readable_ir_version()):
        return None
    import onnxruntime as ort

    return (f"the model declares IR version {model.ir_version}, and onnxruntime {ort.__version__} reads up to "
            f"{newest}: its runs here used the model declared at IR version {newest}")


@contextlib.contextmanager
def _zero_extents_unknown(model: onnx.ModelProto) -> Iterator[None]:
    """Graph inputs' dimensions declared with extent 0 declared unknown while in the block, back
    as they were after: exporters write 0 for "dynamic", which ONNX Runtime takes at its word
    (it refuses any other extent), so a session runs the model with them unknown."""
    zeros = [d for info in model.graph.input if info.type.HasField("tensor_type")
             for d in info.type.tensor_type.shape.dim if d.HasField("dim_value") and d.dim_value == 0]
    for dim in zeros:
        dim.ClearField("dim_value")
    try:
        yield
    finally:
        for dim in zeros:
            dim.dim_value = 0


def runnable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or where its default-domain opset is below ``ORT_MIN_OPSET``, a copy upgraded
    to it by ``onnx.version_converter``, which keeps the values' names: the same function at the
    oldest opset ONNX Runtime has kernels for. Where the converter cannot upgrade it (an op it has
    no adapter or schema for), the model as it is: ONNX Runtime may still run its ops, or names the one it cannot."""
    if (default_opset(model) or ORT_MIN_OPSET) >= ORT_MIN_OPSET:
        return model
    try:
        return ensure_opset(model, ORT_MIN_OPSET)
    except UserError:
        return model


@contextlib.contextmanager
def refusals(what: str, provider: str, raised_as: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """ONNX Runtime's own errors in the block (it refuses the model, or a run fails) as one
    ``UserError`` naming ``what``: a model ONNX Runtime cannot run is the user's to hear of,
    in one line; any other exception is left as it is. ``raised_as``: exception classes that
    only ONNX Runtime raises in the block (``run_with_iobinding`` raises a run's failure as a
    plain RuntimeError)."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime") and not isinstance(exc, raised_as):
            raise
        raise UserError(f"onnxruntime cannot run {what} on {provider}: {first_line(exc)}") from None


_SOURCE_LOCATION = re.compile(r"/onnxruntime_src/\S+:\d+ ")


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An error's first line (its type's name when it has no text), at most ``limit`` characters,
    less what ONNX Runtime writes before its reason: the source file and line, and the C++
    function's signature (``onnxruntime::Model::Model(onnx::ModelProto&&, ...)``), which filled
    a line before "Unsupported model IR version" could be read."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    while (found := _SOURCE_LOCATION.search(text)) is not None:
        text = text[:found.start()] + _past_signature(text[found.end():])
    return text[:limit]


def _past_signature(text: str) -> str:
    """``text`` past the C++ signature it starts with (a qualified name, its parenthesized
    parameters, ``const``), or as it is where it starts with none."""
    opening = text.find("(")
    if opening < 0 or "::" not in text[:opening]:
        return text
    depth = 0
    for position in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[position], 0)
        if depth == 0:
            return text[position + 1:].removeprefix(" const").lstrip()
    return text


def run(sess, feeds: Mapping[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Outputs by name (all of them when ``names`` is None)."""
    names = names or [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))
