"""The ONNX backend node test cases with float32 data, and onnx's model test directories with
their data, as cases: a name, the model, and its data sets of (inputs, expected outputs).
``tests/test_node_suite.py`` checks them; ``benchmarks/decisions.py`` snapshots their decisions."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import onnx
from onnx import TensorProto


def float_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    for case in cases:
        graph = case.model.graph
        if any(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in (*graph.input, *graph.output)):
            yield case


MODEL_DIR_KINDS = ("pytorch-converted", "pytorch-operator", "simple")
"""onnx's model test directories that hold their data: small PyTorch exports of opsets 6-9 and
hand-written models (``light`` is ``tests/test_light_models.py``'s; ``real`` holds no data)."""


def model_dir_cases():
    """The ``MODEL_DIR_KINDS`` tests as cases like the node suite's: a name, the model, and its
    data sets of (inputs, expected outputs)."""
    from onnx.backend.test.loader import load_model_tests

    for kind in MODEL_DIR_KINDS:
        for test in load_model_tests(kind=kind):
            folder = Path(test.model_dir)
            data_sets = [tuple([onnx.numpy_helper.to_array(onnx.load_tensor(f)) for f in _numbered(data, prefix)]
                               for prefix in ("input", "output"))
                         for data in sorted(folder.glob("test_data_set_*"))]
            yield replace(test, name=f"{kind}/{test.name}", model=onnx.load(folder / "model.onnx"),
                          data_sets=data_sets)


def _numbered(folder: Path, prefix: str) -> list[Path]:
    return sorted(folder.glob(f"{prefix}_*.pb"), key=lambda f: int(f.stem.split("_")[-1]))
