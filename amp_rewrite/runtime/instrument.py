"""Running a model with ONNX Runtime and reading its intermediate values.

``expose`` derives a model whose outputs include the values asked for: a
top-level value becomes a graph output as it is; a value inside an If, Loop or
Scan body is reduced in the body to a statistics vector
``[max |x|, nonzero elements, elements below each of two thresholds]`` that is carried out
through each enclosing control-flow node (as a Loop or Scan scan output, or an
If output with an empty stand-in in the other branch). One run of that model
measures every value of the model, nested ones included.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import onnx
import onnx.defs
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir import ir_versions
from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.ir.graph import ModelIndex, ValueKey
from amp_rewrite.ir.opsets import default_opset, ensure_opset
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import has_subgraphs, iter_graphs
from amp_rewrite.ir.types import typed_index

STAT_PREFIX = "__amp_stat"
# Where a control-flow node carries a body output out: the attribute names of its
# bodies, and for Scan the per-scan-output attributes that must grow with it.
_LIFTABLE = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_SCAN_OUTPUT_ATTRIBUTES = ("scan_output_axes", "scan_output_directions")


@dataclass(frozen=True)
class Thresholds:
    """The magnitudes below which statistics count nonzero elements: ``flush`` (they become
    zero in the low type) and ``normal`` (the low type's smallest normal: below it a value
    keeps fewer significant bits, and rounding upstream can flush it)."""

    flush: float
    normal: float

    @classmethod
    def of(cls, precision: Precision) -> Thresholds:
        return cls(precision.flush_below, precision.smallest_normal)


class ValueStats(NamedTuple):
    """What a run showed of one float value. A tuple: a measurement's statistics of every value
    cross from the measuring child to the caller pickled, and tuples pickle and load faster than
    frozen dataclasses."""

    max_abs: float
    nonzero: int
    small: int
    """Nonzero elements with magnitude below ``Thresholds.flush``."""
    subnormal: int
    """Nonzero elements with magnitude below ``Thresholds.normal`` (``small`` among them)."""

    @classmethod
    def of(cls, array: np.ndarray, thresholds: Thresholds) -> ValueStats:
        """Over the finite elements: a -inf mask value overflows nothing."""
        magnitude = np.abs(np.asarray(array, dtype=np.float32)).ravel()
        peak = float(magnitude.max()) if magnitude.size else 0.0
        if peak < np.inf:  # the common case: no inf or NaN (a NaN peak compares false too)
            below_normal = int(np.count_nonzero(magnitude < thresholds.normal))
            if not below_normal:  # the commonest: no zero, nothing small
                return cls(peak, magnitude.size, 0, 0)
            nonzero = int(np.count_nonzero(magnitude))
            zeros = magnitude.size - nonzero
            subnormal = below_normal - zeros
            small = int(np.count_nonzero(magnitude < thresholds.flush)) - zeros if subnormal else 0
            return cls(peak, nonzero, small, subnormal)
        finite = magnitude[np.isfinite(magnitude)]
        peak = float(finite.max()) if finite.size else 0.0  # all -inf (a mask's fill): float16 holds it
        positive = finite[finite > 0]
        return cls(peak, int(positive.size), int(np.count_nonzero(positive < thresholds.flush)),
                   int(np.count_nonzero(positive < thresholds.normal)))

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> ValueStats:
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        if not rows.size:
            return cls(0.0, 0, 0, 0)
        return cls(float(rows[:, 0].max()), *(int(count) for count in rows[:, 1:].sum(axis=0)))

    def merged(self, other: ValueStats) -> ValueStats:
        return ValueStats(max(self.max_abs, other.max_abs), self.nonzero + other.nonzero, self.small + other.small,
                          self.subnormal + other.subnormal)

    @property
    def small_share(self) -> float:
        return self.small / self.nonzero if self.nonzero else 0.0


class PackedStats:
    """Statistics by value key, packed for the trip from a measuring child to its caller: the
    keys, and their ``ValueStats`` as rows of one array. A dict of ValueStats, an object per value,
    would hold more memory in the caller once unpickled, at the end of a conversion (its memory
    peak), than the keys and rows with the position of each key. Read as a Mapping's ``get``."""

    def __init__(self, stats: Mapping[ValueKey, ValueStats]) -> None:
        self.keys = list(stats)
        self.rows = np.array(list(stats.values()), dtype=np.float64).reshape(-1, 4)
        self._at: dict[ValueKey, int] | None = None

    def __getstate__(self) -> tuple[list[ValueKey], np.ndarray]:
        return self.keys, self.rows

    def __setstate__(self, state: tuple[list[ValueKey], np.ndarray]) -> None:
        self.keys, self.rows = state
        self._at = None

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, key: ValueKey, default: ValueStats | None = None) -> ValueStats | None:
        if self._at is None:
            self._at = {k: i for i, k in enumerate(self.keys)}
        at = self._at.get(key)
        if at is None:
            return default
        peak, nonzero, small, subnormal = self.rows[at].tolist()
        return ValueStats(peak, int(nonzero), int(small), int(subnormal))


StatsByKey = Mapping[ValueKey, ValueStats] | PackedStats
"""Statistics by value key, as a measurement gives them: read with ``get`` (a ``PackedStats`` is no Mapping)."""


@dataclass
class Exposed:
    """A model with extra outputs, and what each extra output holds."""

    model: onnx.ModelProto
    top: list[str]
    """Top-level values that are graph outputs as they are."""
    stats: dict[str, ValueKey]
    """Statistics outputs: output name -> nested value."""


def float_values(model: onnx.ModelProto, top_level: bool = False) -> list[ValueKey]:
    """Keys of the float32 values that nodes compute (every graph, or the top level only)."""
    return [key for key in _computed_floats(typed_index(model)) if key[0] == 0 or not top_level]


def _computed_floats(index: ModelIndex) -> list[ValueKey]:
    return [v.key for v in index.all_values() if v.producer is not None and v.elem_type == TensorProto.FLOAT]


def expose(model: onnx.ModelProto, keys: Iterable[ValueKey], thresholds: Thresholds | None = None) -> Exposed:
    """A copy of ``model`` whose outputs also give each value of ``keys`` (float values): a
    top-level one as it is, a nested one as its statistics row (which ``thresholds`` define)."""
    keys = list(keys)
    if thresholds is None and any(key[0] != 0 for key in keys):
        raise ValueError("nested values are exposed as statistics rows, which need thresholds")
    exposed = lift_nested(model, keys, thresholds, copy=True)
    present = {o.name for o in exposed.model.graph.output}
    for _, name in (k for k in keys if k[0] == 0):
        if name not in present:
            exposed.model.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
        exposed.top.append(name)
    return exposed


def lift_nested(model: onnx.ModelProto, keys: Iterable[ValueKey] | None, thresholds: Thresholds | None,
                copy: bool = False) -> Exposed:
    """``model`` (a copy when ``copy`` or when a value is lifted) in which every nested value of
    ``keys`` (None: every nested float32 value that a node computes) is reduced to a statistics
    row carried to a top-level output (``stats``); ``thresholds`` may be None only where there is none."""
    nested = None if keys is None else [k for k in keys if k[0] != 0]
    if nested is None and not has_subgraphs(model.graph):
        nested = []
    if nested is None or nested or copy:
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        model = model_copy
    stats: dict[str, ValueKey] = {}
    if nested is None or nested:
        index = typed_index(model)
        if nested is None:
            nested = [key for key in _computed_floats(index) if key[0] != 0]
        builder = _StatBuilder(index, thresholds)
        for key in nested:
            name = builder.lift(key) if key in index.values else None
            if name is not None:
                stats[name] = key
        builder.finish()
    return Exposed(model, [], stats)


def exact_sigmoid(model: onnx.ModelProto) -> None:
    """Compute each Sigmoid of ``model`` (every graph, in place) as exp(-softplus(-x)), which
    ONNX Runtime's CPU kernels give to within 5.3e-7 relative from -100 to 40: its Sigmoid is
    exact only to 2^-25 absolute (multiples of 3e-8: 3e-8 at -17.9999, 0 at -18 and at -57), so
    a measurement through it sees zeros where float32 holds values that float16 flushes to zero
    (and a Log after them turns -inf on a GPU). The composition is of unary ops: any float type."""
    def sigmoid(node: onnx.NodeProto) -> bool:
        return node.op_type == "Sigmoid" and node.domain in ("", "ai.onnx")

    names: Names | None = None
    for graph in iter_graphs(model.graph):  # a graph rebuilt here is walked on as rebuilt
        if not any(map(sigmoid, graph.node)):
            continue
        names = names or Names.of_model(model)
        nodes = []
        for node in graph.node:
            if not sigmoid(node):
                nodes.append(node)
                continue
            made = [names.fresh(f"{node.output[0]}_exact_sigmoid") for _ in range(3)]
            nodes += [helper.make_node(op, [source], [target], name=names.fresh(f"{target}_node"))
                      for op, source, target in zip(("Neg", "Softplus", "Neg", "Exp"), [node.input[0], *made],
                                                    [*made, node.output[0]])]
        graph.ClearField("node")
        graph.node.extend(nodes)


class _StatBuilder:
    """Makes the statistics nodes: one ``GraphBuilder`` per graph (model-wide names, constants
    cached per graph), whose nodes are appended to their graph by ``finish``."""

    def __init__(self, index: ModelIndex, thresholds: Thresholds | None) -> None:
        self.index = index
        self.thresholds = thresholds
        self.owner = {g: node_id for node_id, graphs in index.subgraphs.items() for g in graphs}
        self.root = GraphBuilder(Names.of_model(index.model), index.opsets.get("", onnx.defs.onnx_opset_version()),
                                 prefix=STAT_PREFIX + "_")
        self.builders: dict[int, GraphBuilder] = {}

    def lift(self, key: ValueKey) -> str | None:
        """Reduce a nested value to its statistics and carry them to a top-level output."""
        graph_id, name = key
        if not self._liftable(graph_id):
            return None
        stat = self._stat_nodes(self._builder(graph_id), name)
        while graph_id != 0:
            stat, graph_id = self._carry_out(graph_id, stat)
        self.index.model.graph.output.append(helper.make_tensor_value_info(stat, TensorProto.FLOAT, None))
        return stat

    def finish(self) -> None:
        """Append each graph's new nodes to it (they read only values defined before them)."""
        for graph_id, builder in self.builders.items():
            self.index.graphs[graph_id].proto.node.extend(builder.nodes)

    def _builder(self, graph_id: int) -> GraphBuilder:
        if graph_id not in self.builders:
            self.builders[graph_id] = self.root.child()
        return self.builders[graph_id]

    def _liftable(self, graph_id: int) -> bool:
        while graph_id != 0:
            owner = self.index.nodes[self.owner[graph_id]]
            if owner.domain != "" or owner.op_type not in _LIFTABLE:
                return False
            graph_id = owner.graph
        return True

    def _stat_nodes(self, b: GraphBuilder, value: str) -> str:
        """Nodes computing [max |x| over the finite elements (from opset 9, which has Where), nonzero
        count, count below each threshold] (shape [4])."""
        zero = b.const(np.zeros(1, np.float32))
        flat = b.op("Reshape", b.op("Abs", value), b.ints([-1]))
        if b.opset >= 9:
            flat = b.op("Where", b.op("Less", flat, b.const(np.array([np.inf], np.float32))), flat, zero)
        padded = b.op("Concat", flat, zero, axis=0)
        peak = b.op("ReduceMax", padded, keepdims=1)
        nonzero = b.op("Cast", b.op("Greater", padded, zero), to=TensorProto.FLOAT)
        counts = [b.op("ReduceSum", nonzero, keepdims=1)]
        assert self.thresholds is not None, "a nested value's statistics need thresholds"
        for threshold in (self.thresholds.flush, self.thresholds.normal):
            below = b.op("Cast", b.op("Less", padded, b.const(np.array([threshold], np.float32))),
                         to=TensorProto.FLOAT)
            counts.append(b.op("ReduceSum", b.op("Mul", nonzero, below), keepdims=1))
        return b.op("Concat", peak, *counts, axis=0)

    def _carry_out(self, graph_id: int, name: str) -> tuple[str, int]:
        """Make ``name`` an output of its body and of the owning node; return the node's new output."""
        owner = self.index.nodes[self.owner[graph_id]]
        bodies = [a for a in owner.proto.attribute if a.type == AttributeProto.GRAPH]
        for attr, body_id in zip(bodies, self.index.subgraphs[owner.id]):
            body = attr.g
            if body_id == graph_id:
                body.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            else:  # the other If branch gives an empty stand-in (one per output: outputs are distinct values)
                stand_in = self._builder(body_id).op("Constant", value=numpy_helper.from_array(np.zeros(0, np.float32)))
                body.output.append(helper.make_tensor_value_info(stand_in, TensorProto.FLOAT, None))
        if owner.op_type == "Scan":
            for attr in owner.proto.attribute:
                if attr.name in _SCAN_OUTPUT_ATTRIBUTES:
                    attr.ints.append(0)
        carried = self.root.names.fresh(STAT_PREFIX + "_carried")
        owner.proto.output.append(carried)
        return carried, owner.graph


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


def measure(exposed: Exposed, results: Mapping[str, np.ndarray],
            thresholds: Thresholds) -> dict[ValueKey, ValueStats]:
    """Statistics of every exposed value from one run's results."""
    measured = {(0, name): ValueStats.of(results[name], thresholds) for name in exposed.top}
    for name, key in exposed.stats.items():
        measured[key] = ValueStats.of_rows(results[name])
    return measured


def merge(runs: Iterable[dict[ValueKey, ValueStats]]) -> dict[ValueKey, ValueStats]:
    merged: dict[ValueKey, ValueStats] = {}
    for measured in runs:
        for key, stats in measured.items():
            merged[key] = merged[key].merged(stats) if key in merged else stats
    return merged
