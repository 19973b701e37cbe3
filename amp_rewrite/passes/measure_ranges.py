"""MeasureRanges: run the float32 model on generated inputs and keep overflowing values float32."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..analysis import Analysis
from ..coloring import Color, Priority
from ..graph import Value
from ..precision import Precision

RECORD_KEY = "amp_rewrite.kept_fp32"
"""Model metadata: named nodes that measurements kept float32, so a second run keeps them too."""
SYMBOLIC_DIM_FOR_RUN = 1
INTEGER_INPUT_HIGH = 4
"""Integer inputs (token ids, indices) are drawn from [0, 4): valid for any vocabulary."""


class MeasureRanges:
    """Invariant: when the range check runs, no candidate produces or reads in low
    precision a top-level value whose measured magnitude on generated inputs exceeds
    ``precision max / headroom``; such nodes are fixed float32 (SAFETY) with the
    measured figure as reason. When it cannot run, the report says why.
    """

    def run(self, analysis: Analysis) -> None:
        options = analysis.options
        self._apply_record(analysis)
        skip = self._skip_reason(analysis)
        if skip:
            analysis.range_check = f"skipped: {skip}"
            return
        watched = self._watched(analysis)
        if not watched:
            analysis.range_check = "skipped: no value could change precision"
            return
        try:
            measured = _measure(analysis, watched, options.seed)
        except Exception as exc:  # the range check is a safety net; a model ORT can't run is still converted
            analysis.range_check = f"skipped: onnxruntime could not run the model ({_first_line(exc)})"
            analysis.notes.append(f"warning: range check {analysis.range_check}")
            return
        limit = analysis.precision.max / options.headroom
        over = 0
        for value in watched:
            peak = measured.get(value.name)
            if peak is None or peak <= limit:
                continue
            over += 1
            reason = (f"value {value.name!r} reached {peak:.3g} on generated inputs, beyond "
                      f"{limit:.4g} ({analysis.precision.value} max / headroom {options.headroom:g})")
            for node_id in _touching(analysis, value):
                if analysis.coloring.fix(node_id, Color.FP32, reason, Priority.SAFETY):
                    name = analysis.index.nodes[node_id].proto.name
                    if name:
                        analysis.measured_fp32.setdefault(name, reason)
        analysis.range_check = f"measured {len(measured)} values on generated inputs; {over} beyond {limit:.4g}"

    def _apply_record(self, analysis: Analysis) -> None:
        recorded = next((p.value for p in analysis.index.model.metadata_props if p.key == RECORD_KEY), None)
        if not recorded:
            return
        kept = json.loads(recorded)
        for node_id in analysis.slots:
            reason = kept.get(analysis.index.nodes[node_id].proto.name)
            if reason and analysis.coloring.fix(node_id, Color.FP32, f"recorded by an earlier run: {reason}",
                                                Priority.SAFETY):
                analysis.measured_fp32[analysis.index.nodes[node_id].proto.name] = reason

    def _skip_reason(self, analysis: Analysis) -> str | None:
        options = analysis.options
        if options.range_check == "off":
            return "range_check=off"
        if analysis.precision is Precision.BFLOAT16:
            return "bfloat16 has float32's range"
        weight_bytes = sum(_nbytes(t) for t in analysis.index.initializers.values())
        if options.range_check == "auto" and weight_bytes > options.range_check_max_bytes:
            return (f"weights of {weight_bytes / 2**30:.1f} GiB exceed range_check_max_bytes "
                    f"({options.range_check_max_bytes / 2**30:.1f} GiB); use range_check=on")
        return None

    def _watched(self, analysis: Analysis) -> list[Value]:
        """Top-level values computed by a node and touched by a node that may run low."""
        seen: dict = {}
        for node_id in analysis.slots:
            if analysis.coloring.color(node_id) is not Color.FP32:
                for _, _, value in analysis.slot_values(node_id):
                    if value.key[0] == 0 and value.producer is not None:
                        seen.setdefault(value.key, value)
        return list(seen.values())


def _touching(analysis: Analysis, value: Value) -> list[int]:
    nodes = [n for n, _ in analysis.slot_readers(value)]
    producer = value.producer
    if producer and producer[0] in analysis.slots and producer[1] in analysis.slots[producer[0]].outputs:
        nodes.append(producer[0])
    return nodes


def _measure(analysis: Analysis, watched: list[Value], seed: int) -> dict[str, float]:
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(analysis.index.model)
    present = {o.name for o in model.graph.output}
    for value in watched:
        if value.name not in present:
            model.graph.output.append(helper.make_tensor_value_info(value.name, TensorProto.FLOAT, None))
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session_options.log_severity_level = 4
    if analysis.base_dir:
        session_options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(analysis.base_dir))
    session = ort.InferenceSession(model.SerializeToString(), session_options, providers=["CPUExecutionProvider"])
    feeds = _generated_inputs(analysis, session, seed)
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, feeds)
    peaks = {}
    for name, array in zip(names, results):
        array = np.asarray(array)
        if array.dtype.kind == "f" and array.size:
            finite = np.abs(array[np.isfinite(array)])
            peaks[name] = float(finite.max()) if finite.size else float("inf")
    return peaks


def _generated_inputs(analysis: Analysis, session, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for meta in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else SYMBOLIC_DIM_FOR_RUN for d in meta.shape]
        kind = meta.type.removeprefix("tensor(").removesuffix(")")
        dtype = np.dtype({"float": "float32", "double": "float64"}.get(kind, kind))
        if dtype.kind == "f":
            feeds[meta.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[meta.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[meta.name] = rng.integers(0, INTEGER_INPUT_HIGH, shape).astype(dtype)
    return feeds


def _nbytes(tensor: onnx.TensorProto) -> int:
    size = int(np.prod(tensor.dims, dtype=np.int64))
    return size * max(1, onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize) \
        if tensor.data_type != TensorProto.STRING else 0


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
