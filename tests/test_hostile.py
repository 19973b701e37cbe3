"""Hostile inputs (docs/security.md): model and data files built as an attacker would, each refused
by every subcommand in one line with exit 2, nothing written, and no byte of a file outside the
model's folder read or reflected.

Each case lies in ``ROOT/models/`` with a sentinel file in ``ROOT/`` beside that folder (what a
traversal would reach); the commands run in-process with an audit hook that records every file the
process opens, so "not read" is observed, not inferred from the output.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_rewrite.errors import printable
from amp_rewrite.ir.io import length_delimited
from tests import untrusted
from tests.untrusted import SENTINEL, lay_out

SUBCOMMANDS = ("convert", "inspect", "check", "bench", "grad", "train-graph", "train")


def _model(initializer: TensorProto, node_name: str = "add", output: str = "y") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info(output, TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", initializer.name], [output], name=node_name)], "g",
                              [x], [y], [initializer])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(location: str, dims=(4,), **entries: str) -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


def _write(folder: Path, model: onnx.ModelProto | bytes) -> Path:
    path = folder / "m.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _weights(folder: Path, name: str = "w.bin", size: int = 16) -> None:
    (folder / name).write_bytes(np.arange(size // 4, dtype=np.float32).tobytes())


_GRAPH_TYPE = b"\xa0\x01" + bytes([onnx.AttributeProto.GRAPH])
"""An AttributeProto's ``type`` field (20, a varint) saying GRAPH."""


def _nested_ifs(depth: int) -> bytes:
    """A model of an If in the then-branch of an If, ``depth`` deep, written as bytes (protobuf's
    own classes refuse to build it): past protobuf's parser's nesting limit."""
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    leaf = helper.make_graph([helper.make_node("Constant", [], ["y"], value=helper.make_tensor(
        "k", TensorProto.FLOAT, [1], [1.0]))], "leaf", [], [out]).SerializeToString()
    body = leaf
    for level in range(depth):
        branches = b"".join(
            length_delimited(5, length_delimited(1, name.encode()) + _GRAPH_TYPE + length_delimited(6, graph))
            for name, graph in (("then_branch", body), ("else_branch", leaf)))
        node = (length_delimited(1, b"c") + length_delimited(2, b"y") + length_delimited(3, f"if{level}".encode())
                + length_delimited(4, b"If") + branches)
        body = length_delimited(1, node) + length_delimited(2, f"b{level}".encode())
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, []).SerializeToString()
    graph = body + length_delimited(11, cond) + length_delimited(12, out.SerializeToString())
    opset = helper.make_opsetid("", 17).SerializeToString()
    return bytes([1 << 3, 8]) + length_delimited(7, graph) + length_delimited(8, opset)


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "traversal": (lambda d: _write(d, _model(_external("../secret.txt"))), "points outside the model's folder"),
    "deep traversal": (lambda d: _write(d, _model(_external("a/../../../../../../../etc/passwd"))), "outside"),
    "absolute": (lambda d: _write(d, _model(_external(str(d.parent / "secret.txt")))), "is an absolute path"),
    "windows absolute": (lambda d: _write(d, _model(_external("C:\\secret.txt"))), "is an absolute path"),
    "symlinked file": (lambda d: (os.symlink(d.parent / "secret.txt", d / "w.bin"),
                                  _write(d, _model(_external("w.bin"))))[1], "is a symbolic link"),
    "symlinked folder": (lambda d: (os.symlink(d.parent, d / "up"),
                                    _write(d, _model(_external("up/secret.txt"))))[1], "through a linked folder"),
    "a folder": (lambda d: ((d / "sub").mkdir(), _write(d, _model(_external("sub"))))[1], "is missing"),
    "empty location": (lambda d: _write(d, _model(_external(""))), "is not a file name"),
    "truncated": (lambda d: (_weights(d, size=8), _write(d, _model(_external("w.bin"))))[1], "past the end"),
    "offset past the end": (lambda d: (_weights(d), _write(d, _model(_external("w.bin", offset="4096"))))[1],
                            "past the end"),
    "length beyond type and dims": (lambda d: (_weights(d, size=64),
                                               _write(d, _model(_external("w.bin", length="64"))))[1],
                                    "declares 64 bytes where its type and shape [4] need 16"),
    "offset not a number": (lambda d: (_weights(d), _write(d, _model(_external("w.bin", offset="-4"))))[1],
                            "not a whole number"),
    "dims claiming terabytes": (lambda d: (_weights(d), _write(d, _model(_external("w.bin", dims=(1 << 40,)))))[1],
                                "claims more than the data holds"),
    "conversion mark": (lambda d: (_weights(d), _write(d, _model(_external(
        "w.bin", **{"amp_rewrite.source_type": "11"}))))[1], "amp-rewrite's own mark"),
    "embedded dims claiming more than its bytes": (
        lambda d: _write(d, _model(TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 40],
                                               raw_data=b"\0" * 16))), "holds 16 bytes where its type and shape"),
    "location not UTF-8": (lambda d: (_weights(d), _write(d, _model(_external("w.bin")).SerializeToString().replace(
        b"w.bin", b"w\xf4bin")))[1], "holds a name that is not UTF-8 text"),
    "node name not UTF-8": (lambda d: _write(d, _model(helper.make_tensor("w", TensorProto.FLOAT, [4], [1, 2, 3, 4]),
                                                       node_name="abcdef").SerializeToString().replace(
        b"abcdef", b"abc\xffef")), "holds a name that is not UTF-8 text"),
    "malformed protobuf": (lambda d: _write(d, b"\x0a\xff\xff\xff\xff\x0f" + SENTINEL), "not a readable ONNX model"),
    "not protobuf": (lambda d: _write(d, b"<html><script>alert(1)</script></html>"), "not a readable ONNX model"),
    "nesting past the parser's limit": (lambda d: _write(d, _nested_ifs(120)), "not a readable ONNX model"),
}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    lay_out(tmp_path)
    x = np.ones((8, 4), np.float32)
    np.savez(tmp_path / "models" / "data.npz", x=x, labels=x)
    return tmp_path


def _argv(command: str, model: Path, out: Path) -> list[str]:
    data = str(model.parent / "data.npz")
    return {
        "convert": ["convert", str(model), "-o", str(out / "m.onnx"), "--report", str(out / "r.json")],
        "inspect": ["inspect", str(model)],
        "check": ["check", str(model), str(model), "--random", "1", "--junit", str(out / "j.xml")],
        "bench": ["bench", str(model), "--runs", "2", "--report", str(out / "b.json")],
        "grad": ["grad", str(model), "--loss", "y", "-o", str(out / "g.onnx")],
        "train-graph": ["train-graph", str(model), "--loss", "mse", "--output", "y", "-o", str(out / "step.onnx")],
        "train": ["train", str(model), "--data", data, "--loss", "mse", "--output", "y", "--epochs", "1",
                  "-o", str(out / "t.onnx")],
    }[command]


def _digests(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("command", SUBCOMMANDS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_model_gets_one_line_and_exit_2_and_nothing_outside_is_read(case, command, root):
    build, message = CASES[case]
    model = build(root / "models")
    before = _digests(root / "models")
    code, out, err, opened = untrusted.run(_argv(command, model, root / "out"))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amp-rewrite: error:") and message in lines[0], err
    assert list((root / "out").iterdir()) == [], "a partial output was left behind"
    assert _digests(root / "models") == before, "the input was modified"
    assert not untrusted.outside(root, opened), f"opened outside the model's folder: {untrusted.outside(root, opened)}"
    assert SENTINEL.decode() not in out + err


def test_a_loop_of_trillions_of_trips_is_stopped_by_the_timeout_in_bounded_memory(root, monkeypatch):
    """The byte fuzz's find: a Loop whose trip count was mutated to 2**43+3. The range check's
    run is stopped at its timeout (2 s here) and the conversion reports it, written without
    ranges; ``check`` refuses in one line. The measuring child's memory does not grow with the
    iterations (``test_stages``: a Loop's statistics are one running row)."""
    from amp_rewrite.runtime import isolate
    from models.builders import control_flow

    monkeypatch.setattr(isolate, "DEFAULT_TIMEOUT", 2.0)
    m = control_flow(width=4)
    at = next(i for i, t in enumerate(m.graph.initializer) if t.name == "trips")
    m.graph.initializer[at].CopyFrom(onnx.numpy_helper.from_array(np.array(2**43 + 3, np.int64), "trips"))
    model = _write(root / "models", m)
    code, out, err, _ = untrusted.run(_argv("convert", model, root / "out"))
    assert code == 0 and "range check: NOT RUN" in out and "did not finish within 2 s" in out, err
    code, out, err, _ = untrusted.run(_argv("check", model, root / "out"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "did not finish within 2 s" in lines[0], err


def test_a_relative_location_inside_the_folder_still_loads(root):
    """The checks refuse what leaves the folder, not external data as such: a file in a subfolder,
    spelled with a detour that stays inside, converts, and its values come through."""
    folder = root / "models"
    (folder / "weights").mkdir()
    _weights(folder / "weights", size=32)
    model = _write(folder, _model(_external("weights/../weights/w.bin", offset="16", length="16")))
    code, _, err, opened = untrusted.run(["convert", str(model), "-o", str(root / "out" / "m.onnx")])
    assert code == 0, err
    converted = onnx.load(str(root / "out" / "m.onnx"))
    values = onnx.numpy_helper.to_array(converted.graph.initializer[0]).astype(np.float32)
    np.testing.assert_array_equal(values, [4, 5, 6, 7])
    assert not untrusted.outside(root, opened)


HOSTILE_NAMES = ("<script>alert(1)</script>", "../../x", "line\nforged: amp-rewrite: 100 of 100 float nodes",
                 "\x1b[2J\x1b]0;title\x07", "rtl\u202eexe.txt", "a\x00b")


def _named(name: str) -> onnx.ModelProto:
    """A model whose node, input, output and initializer are all called ``name`` (and variants)."""
    x = helper.make_tensor_value_info(name + "_in", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor(name + "_w", TensorProto.FLOAT, [4], [1e5, 2, 3, 4])
    nodes = [helper.make_node("Mul", [x.name, w.name], [name + "_t"], name=name + "_mul"),
             helper.make_node("Exp", [name + "_t"], [name], name=name)]
    model = helper.make_model(helper.make_graph(nodes, name, [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_names_from_models_cannot_inject_into_reports_pages_or_paths(name, root):
    folder, out = root / "models", root / "out"
    model = _write(folder, _named(name))
    runs = {
        "convert": ["convert", str(model), "-o", str(out / "m.onnx"), "--report", str(out / "r.json")],
        "inspect": ["inspect", str(model)],
        "explain": ["inspect", str(model), "--explain", name],
        "check": ["check", str(model), str(out / "m.onnx"), "--random", "1", "--junit", str(out / "j.xml"),
                  "--report", str(out / "c.json"), "--localize"],
        "train-graph": ["train-graph", str(model), "--loss", "mse", "--output", name, "-o", str(out / "step.onnx")],
    }
    for command, argv in runs.items():
        code, stdout, stderr, _ = untrusted.run(argv)
        if command == "train-graph" and "\0" in name:  # the state's keys are names: a NUL would cut one short
            assert code == 2 and "NUL" in stderr and len(stderr.strip().splitlines()) == 1, stderr
            continue
        assert code in (0, 1), (command, stderr)
        for text in (stdout, stderr):
            assert "\x1b" not in text and "\u202e" not in text and "\0" not in text, command
            assert not any(line.startswith("forged") for line in text.splitlines()), (command, text)
    written = {"m.onnx", "r.json", "j.xml", "c.json"} | (set() if "\0" in name else
                                                         {"step.onnx", "step.onnx.json", "step.onnx.init.npz"})
    assert {p.name for p in out.iterdir()} == written, "a file named from the model appeared"
    assert {p.name for p in root.iterdir()} == {"models", "out", "secret.txt"}
    report = json.loads((out / "r.json").read_text())
    assert name in {d["node"] for d in report["decisions"]}, "the JSON report keeps the name (JSON escapes it)"
    cases = ET.parse(out / "j.xml").getroot().findall("testcase")  # well-formed XML whatever the name holds
    assert [case.get("name") for case in cases] == [printable(name)]
    if "\0" in name:
        return
    with np.load(out / "step.onnx.init.npz", allow_pickle=False) as initial:
        assert name + "_w" in initial.files, "the step's state keeps the parameter's name as a key, not a path"


def test_an_npz_holding_pickled_objects_is_refused_unloaded(root, monkeypatch):
    folder = root / "models"
    model = _write(folder, _model(helper.make_tensor("w", TensorProto.FLOAT, [4], [1, 2, 3, 4])))
    objects, labels = np.array([{"a": 1}, None], dtype=object), np.ones((2, 4), np.float32)
    np.savez(folder / "evil.npz", x=objects, labels=labels)
    (folder / "evil").mkdir()
    np.save(folder / "evil" / "x.npy", objects)
    np.save(folder / "evil" / "labels.npy", labels)
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle from a user's file was loaded")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    for argv in (["check", str(model), str(model), "--inputs", str(folder / "evil.npz")],
                 ["bench", str(model), "--inputs", str(folder / "evil.npz"), "--runs", "2"],
                 ["convert", str(model), "-o", str(root / "out" / "m.onnx"), "--inputs", str(folder / "evil.npz")],
                 *(["train", str(model), "--data", str(folder / data), "--loss", "mse", "--output", "y",
                    "-o", str(root / "out" / "t.onnx")] for data in ("evil.npz", "evil"))):
        code, _, err, _ = untrusted.run(argv)
        assert code == 2, (argv[0], err)
        assert len(err.strip().splitlines()) == 1 and "never unpickles a data file" in err, (argv[0], err)
    assert list((root / "out").iterdir()) == []


def test_the_python_api_refuses_the_same_models_whatever_form_they_come_in(root):
    """A path, and an onnx_ir model loaded from it (whose external tensors keep their location
    and folder), are refused by ``convert`` and ``gradient_model`` as the command line refuses them."""
    import onnx_ir as ir

    import amp_rewrite
    from amp_rewrite.autodiff.gradient import gradient_model
    from amp_rewrite.ir.external import UnsafeExternalData

    model = _write(root / "models", _model(_external("../secret.txt")))
    with untrusted.recording_opens() as opened:
        for form in (str(model), ir.load(str(model))):
            output = str(root / "out" / "m.onnx") if isinstance(form, str) else None  # in-memory: returned
            with pytest.raises(UnsafeExternalData, match="points outside the model's folder"):
                amp_rewrite.convert(form, output)
            with pytest.raises(UnsafeExternalData):
                gradient_model(form, "y")
    assert not untrusted.outside(root, list(opened))
    assert list((root / "out").iterdir()) == []
