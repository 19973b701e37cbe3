"""Saving: the streamed writer gives protobuf's own bytes, converts deferred tensors as it
writes them, and leaves nothing behind when it fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from amp_rewrite import ConvertOptions, UserError, convert
from amp_rewrite.ir import io
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.tensors import convert_embedded
from models import builders
from tests import helpers

SAMPLES = {name: build() for name, build in builders.SAMPLES.items()}


def _model(sample) -> onnx.ModelProto:
    return sample[0] if isinstance(sample, tuple) else sample


def _decorated() -> onnx.ModelProto:
    """The transformer with the fields a plain model lacks: metadata, a doc string, a tensor
    stored as float_data, and tensors with fields after raw_data (doc_string, data_location)."""
    model = builders.transformer(blocks=2)
    model.doc_string = "a model"
    model.metadata_props.add(key="k", value="v")
    model.graph.doc_string = "a graph"
    weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    weights[0].doc_string = "documented"
    weights[1].data_location = onnx.TensorProto.DEFAULT
    values = numpy_helper.to_array(weights[2])
    weights[2].ClearField("raw_data")
    weights[2].float_data.extend(values.ravel().tolist())
    return model


@pytest.mark.parametrize("name", [*SAMPLES, "decorated"])
def test_streamed_file_is_protobufs_own_serialization(name: str, tmp_path: Path) -> None:
    model = _decorated() if name == "decorated" else _model(SAMPLES[name])
    written = io.save(model, tmp_path / "m.onnx", None)
    data = (tmp_path / "m.onnx").read_bytes()
    assert data == model.SerializeToString()
    assert written == len(data)


@pytest.mark.parametrize("precision", list(Precision))
def test_deferred_tensors_are_written_as_converting_them_in_place_would(precision: Precision, tmp_path: Path) -> None:
    model = _decorated()
    deferred = {t.name: precision for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    before = model.SerializeToString()
    io.save(model, tmp_path / "m.onnx", None, deferred)
    assert model.SerializeToString() == before, "saving changed the model"
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    for tensor in expected.graph.initializer:
        if tensor.name in deferred:
            convert_embedded(tensor, precision)
    assert (tmp_path / "m.onnx").read_bytes() == expected.SerializeToString()
    loaded = onnx.load(tmp_path / "m.onnx")
    onnx.checker.check_model(loaded)  # not full: the graph still reads these weights as float32
    weight = next(t for t in loaded.graph.initializer if t.name == model.graph.initializer[2].name)
    original = numpy_helper.to_array(model.graph.initializer[2])
    assert weight.data_type == precision.onnx_type and weight.doc_string == model.graph.initializer[2].doc_string
    np.testing.assert_array_equal(numpy_helper.to_array(weight).astype(np.float32),
                                  original.astype(precision.numpy_type).astype(np.float32))


@pytest.mark.parametrize("options", [{}, dict(precision="bfloat16", keep_io_types=False)])
def test_path_output_equals_in_memory_output(options: dict, tmp_path: Path) -> None:
    """A path's initializers are converted while saving; the file is what the in-memory
    conversion serializes to, and the report counts the bytes on disk."""
    source = tmp_path / "t.onnx"
    onnx.save(builders.transformer(blocks=3, with_mask=True), source)
    in_memory, _ = convert(onnx.load(source), **options)
    out, report = convert(source, tmp_path / "t.mixed.onnx", ConvertOptions(**options))
    assert Path(out).read_bytes() == in_memory.SerializeToString()
    assert report.bytes_after == Path(out).stat().st_size and report.bytes_before == source.stat().st_size


def test_model_over_the_protobuf_limit_goes_to_external_data_converted(tmp_path: Path, monkeypatch) -> None:
    model = builders.transformer(blocks=2)
    deferred = {t.name: Precision.FLOAT16 for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    for tensor in expected.graph.initializer:
        if tensor.name in deferred:
            convert_embedded(tensor, Precision.FLOAT16)
    monkeypatch.setattr(io, "PROTOBUF_LIMIT", 1000)
    written = io.save(model, tmp_path / "m.onnx", None, deferred)
    data = tmp_path / "m.onnx.data"
    assert data.stat().st_size > 0 and written == data.stat().st_size + (tmp_path / "m.onnx").stat().st_size
    loaded = onnx.load(tmp_path / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "m.onnx"))
    for got, want in zip(loaded.graph.initializer, expected.graph.initializer):
        assert got.data_type == want.data_type
        np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))


def test_failed_save_leaves_no_partial_output(tmp_path: Path) -> None:
    model = builders.transformer(blocks=2)
    broken = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    broken.raw_data = broken.raw_data[:-4]  # one value short of its shape
    with pytest.raises(UserError, match=broken.name):
        io.save(model, tmp_path / "m.onnx", None, {broken.name: Precision.FLOAT16})
    assert list(tmp_path.iterdir()) == []


def test_fields_this_protobuf_does_not_know_are_kept(tmp_path: Path) -> None:
    model = onnx.ModelProto()
    model.ParseFromString(builders.mlp().SerializeToString() + b"\xf8\x07\x05")  # field 127, varint 5
    io.save(model, tmp_path / "m.onnx", None)
    assert (tmp_path / "m.onnx").read_bytes() == model.SerializeToString()


def test_tensors_are_judged_without_a_float64_pass_where_a_bound_decides() -> None:
    """judge_tensors: what flushes is measured exactly; the norm is computed only where the
    largest value alone cannot bound the share below the threshold (a random weight matrix with a
    few values near zero: 2 s of a GPT-2 small's conversion went to float64 squares of every
    weight). Each tensor's verdict is the exact one, batched or not, and the input stays as it is."""
    from amp_rewrite.ir.tensors import judge_fit, judge_tensors

    precision, share = Precision("float16"), 0.01
    weights = np.random.default_rng(0).normal(0, 0.02, 4096).astype(np.float32)
    weights[[5, 900]] = [1e-9, -3e-8]  # flush, but carry nothing
    epsilon = np.full(8, 1e-12, np.float32)  # all of it flushes
    mixed = np.array([1.0, 0.0, 1e-9, 2.0], np.float32)  # flushes, nonzero share below 1%
    edge = np.array([1e-8] * 400 + [1e-6], np.float32)  # the bound cannot decide: the exact norm does
    arrays = [weights, epsilon, mixed, np.zeros(3, np.float32), edge, np.array([7e4], np.float32)]
    tensors = [numpy_helper.from_array(a, f"t{i}") for i, a in enumerate(arrays)]
    before = [t.SerializeToString() for t in tensors]
    fits = list(judge_tensors(tensors, None, precision, share))
    assert [t.SerializeToString() for t in tensors] == before
    assert [f.problem is not None for f in fits] == [False, True, False, False, True, True]
    assert [f.lost_share > 0 for f in fits] == [True, True, True, False, True, False]
    exact = [np.sqrt(np.sum(np.where(np.abs(a) < precision.flush_below, a.astype(np.float64) ** 2, 0))
                     / max(np.sum(a.astype(np.float64) ** 2), 1e-300)) for a in arrays]
    for fit, want, array in zip(fits, exact, arrays):
        assert judge_fit(array, precision, share) == fit  # alone as in a batch
        if fit.problem is not None or want == 0:
            assert fit.lost_share == pytest.approx(want, rel=1e-9)
        else:  # an upper bound, far below the threshold
            assert want <= fit.lost_share <= share / 10


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external-data"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_large_file_is_loaded_tensor_by_tensor_as_onnx_loads_it(name: str, external: bool, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """io.load parses a large file's initializers one at a time (two thirds of the memory of
    onnx.load on a GPT-2 small): the same model, byte for byte, subgraphs and external data
    references too."""
    path = tmp_path / "m.onnx"
    model = _model(SAMPLES[name])
    if external:
        builders.save_with_external_data(model, path)
    else:
        onnx.save(model, path)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    assert io.load(path).SerializeToString() == onnx.load(path, load_external_data=False).SerializeToString()


def test_a_truncated_large_file_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "m.onnx"
    data = builders.transformer(blocks=1).SerializeToString()
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    for cut in (len(data) // 2, len(data) - 3):
        path.write_bytes(data[:cut])
        with pytest.raises(UserError, match="not a readable ONNX model"):
            io.load(path)


def test_a_large_file_with_a_field_the_walk_does_not_take_is_loaded_by_protobuf(tmp_path: Path, monkeypatch) -> None:
    """A group field (wire types 3 and 4, which protobuf keeps as an unknown field) ends the
    tensor-by-tensor walk; protobuf's own parser loads the file then, as onnx.load does."""
    path = tmp_path / "m.onnx"
    group = io._varint(99 << 3 | 3) + io._varint(1 << 3 | 0) + io._varint(1) + io._varint(99 << 3 | 4)
    path.write_bytes(builders.transformer(blocks=1).SerializeToString() + group)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    assert io.load(path).SerializeToString() == onnx.load(path, load_external_data=False).SerializeToString()


def _lending() -> onnx.ModelProto:
    """Weights of every kind a borrowing load meets: float32 ones that go low, one beyond
    float16's range (kept float32), one read in both precisions, float16 and float64 ones, an
    integer one, small ones, one with a field after its raw data and one stored as float_data."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.normal(0, 0.1, (64, 64)), "big": rng.normal(0, 1, (64, 64)) * 1e5, "b": rng.normal(0, 1, 64),
               "doc": rng.normal(0, 1, (64, 64)), "listed": rng.normal(0, 1, (64, 64))}
    m = helpers.model("""(float[4, 64] x) => (float[4, 64] y, float[64, 64] z, double[64, 64] d, int64[2] s) {
        a = MatMul(x, w)
        c = MatMul(a, big)
        e = MatMul(c, doc)
        f = MatMul(e, listed)
        g = Add(f, b)
        h = Cast<to = 10>(g)
        k = MatMul(h, half)
        l = Cast<to = 1>(k)
        y = Reshape(l, shape)
        z = Exp(w)
        d = Add(wide, wide)
        s = Identity(shape)
    }""", {**{name: a.astype(np.float32) for name, a in weights.items()},
           "half": rng.normal(0, 1, (64, 64)).astype(np.float16), "wide": rng.normal(0, 1, (64, 64)),
           "shape": np.array([4, 64], np.int64)})
    tensors = {t.name: t for t in m.graph.initializer}
    tensors["doc"].doc_string = "a field after the raw data"
    tensors["listed"].float_data.extend(numpy_helper.to_array(tensors["listed"]).ravel().tolist())
    tensors["listed"].ClearField("raw_data")
    return m


def test_a_borrowing_load_leaves_float_weights_in_the_file(tmp_path: Path, monkeypatch) -> None:
    """Each float initializer of at least EXTERNAL_THRESHOLD bytes whose raw data ends its
    serialized form becomes external data in the model file itself, at its raw data: the same
    values, and nothing else borrowed or changed."""
    path = tmp_path / "m.onnx"
    onnx.save(_lending(), path)
    before = path.read_bytes()
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    borrowed, whole = io.load(path, borrow=io.EXTERNAL_THRESHOLD), onnx.load(path)
    assert path.read_bytes() == before
    lent = {t.name for t in borrowed.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert lent == {"w", "big", "half", "wide"}
    for got, want in zip(borrowed.graph.initializer, whole.graph.initializer):
        if got.name in lent:
            assert {e.key: e.value for e in got.external_data}["location"] == "m.onnx"
            got = onnx.TensorProto.FromString(got.SerializeToString())
            onnx.external_data_helper.load_external_data_for_tensor(got, str(tmp_path))
            got.ClearField("data_location")
        assert got == want


@pytest.mark.parametrize("options", [{}, dict(precision="bfloat16", keep_io_types=False)])
def test_a_borrowed_conversion_writes_what_an_unborrowed_one_does(options: dict, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """A large file's float weights stay in it while it is converted; the output is the same
    file, byte for byte (converted, kept float32, kept in both precisions), with no external data."""
    source = tmp_path / "m.onnx"
    onnx.save(_lending(), source)
    whole, _ = convert(source, tmp_path / "whole.onnx", **options)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    out, report = convert(source, tmp_path / "lent.onnx", **options)
    assert Path(out).read_bytes() == Path(whole).read_bytes()
    assert report.bytes_before == source.stat().st_size and report.bytes_after == Path(out).stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lent.onnx", "m.onnx", "whole.onnx"]
    types = {t.name: t.data_type for t in onnx.load(out).graph.initializer}
    assert types["wide"] == onnx.TensorProto.DOUBLE
    assert types["big"] == (onnx.TensorProto.FLOAT if not options else onnx.TensorProto.BFLOAT16)


def test_borrowed_weights_over_the_protobuf_limit_go_to_external_data_converted(tmp_path: Path,
                                                                               monkeypatch) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(_lending(), source)
    whole, _ = convert(source, tmp_path / "whole.onnx")
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    monkeypatch.setattr(io, "PROTOBUF_LIMIT", 1000)
    out, _ = convert(source, tmp_path / "lent.onnx")
    assert (tmp_path / "lent.onnx.data").stat().st_size > 0
    onnx.checker.check_model(out, full_check=True)
    for got, want in zip(onnx.load(out).graph.initializer, onnx.load(whole).graph.initializer):
        assert got.name == want.name and got.data_type == want.data_type
        np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))


def test_a_tensor_whose_raw_data_does_not_end_it_is_not_borrowed(tmp_path: Path, monkeypatch) -> None:
    """Fields written out of protobuf's order (the raw data first): the load proves where the
    raw data lies before it borrows, and loads this one as it is."""
    model = _lending()
    tensor = next(t for t in model.graph.initializer if t.name == "w")
    head = onnx.TensorProto()
    head.CopyFrom(tensor)
    head.ClearField("raw_data")
    reordered = io.length_delimited(9, tensor.raw_data) + head.SerializeToString()
    assert onnx.TensorProto.FromString(reordered) == tensor
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.graph.initializer.remove(next(t for t in rest.graph.initializer if t.name == "w"))
    path = tmp_path / "m.onnx"
    path.write_bytes(rest.SerializeToString() + io.length_delimited(7, io.length_delimited(5, reordered)))
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    loaded = {t.name: t for t in io.load(path, borrow=io.EXTERNAL_THRESHOLD).graph.initializer}
    assert loaded["w"] == tensor and loaded["big"].data_location == onnx.TensorProto.EXTERNAL


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-path", "relative-path"])
def test_convert_holds_no_file_of_its_input_open_after(relative: bool, tmp_path: Path, monkeypatch) -> None:
    """The descriptors that reads of borrowed or external weights keep are closed once the
    output is written (a deleted input's space is freed), however the input's path is spelt."""
    onnx.save(_lending(), tmp_path / "m.onnx")
    source = Path("m.onnx") if relative else tmp_path / "m.onnx"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)

    def open_files() -> set[str]:
        fds = Path("/proc/self/fd")
        return {str(p.resolve()) for p in fds.iterdir() if p.exists() and p.resolve().parent == tmp_path}

    convert(source, tmp_path / "out.onnx")
    assert open_files() == set()


def test_convert_closes_and_counts_its_input_data_file_not_its_outputs(tmp_path: Path) -> None:
    """A model with external data: its data file is closed once the output is written, and the
    report's size before is the input's files, though the save points the tensors at the
    output's data file (listed after the save, the input's file stayed open and the output's
    was counted as the input's)."""
    from models import builders

    source = builders.save_with_external_data(builders.transformer(blocks=2), tmp_path / "t.onnx")
    out, report = convert(source, tmp_path / "mixed.onnx")
    fds = Path("/proc/self/fd")
    assert not {p.resolve() for p in fds.iterdir() if p.exists()} & {tmp_path / "t.onnx.data"}
    assert report.bytes_before == sum((tmp_path / f).stat().st_size for f in ("t.onnx", "t.onnx.data"))
    assert report.bytes_after == sum((tmp_path / f).stat().st_size for f in ("mixed.onnx", "mixed.onnx.data"))
    assert report.bytes_after < 0.55 * report.bytes_before


def test_check_on_borrowed_models_gives_what_it_gives_on_loaded_ones(tmp_path: Path, monkeypatch) -> None:
    """``check`` leaves both large models' float weights in their files (ONNX Runtime reads
    them in its children): the same figures, float32 and mixed, emulated and as deployed, and
    the same suspects explained (a tolerance of zero fails the check)."""
    from amp_rewrite import Tolerance
    from amp_rewrite import check as check_models
    from amp_rewrite.numerics import check as check_module

    source, mixed = tmp_path / "m.onnx", tmp_path / "mixed.onnx"
    onnx.save(_lending(), source)
    convert(source, mixed)

    def checked():
        return check_models(source, mixed, random=2, tolerance=Tolerance(0, 0), localize_failures=True)

    loaded = checked()
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    monkeypatch.setattr(check_module, "BORROW_BYTES", 1024)
    lent = io.load(source, borrow=check_module.BORROW_BYTES)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in lent.graph.initializer)
    borrowed = checked()
    assert [(o.name, repr(o.errors)) for o in borrowed.outputs] == [(o.name, repr(o.errors)) for o in loaded.outputs]
    assert borrowed.passed == loaded.passed is False and borrowed.deployed == loaded.deployed
    assert loaded.suspects and [(s.node, s.reason) for s in borrowed.suspects] == [
        (s.node, s.reason) for s in loaded.suspects]


def test_bench_on_a_borrowed_model_runs_its_analysis_where_the_weights_lie(tmp_path: Path, monkeypatch) -> None:
    """``bench`` reads its models as ``check`` does (large weights left in the file): the
    analysis that gives the reasons for float32 nodes reads them from there."""
    from amp_rewrite import bench
    from amp_rewrite.numerics import check as check_module

    source = tmp_path / "m.onnx"
    onnx.save(_lending(), source)
    monkeypatch.setattr(io, "STREAMED_LOAD_BYTES", 0)
    monkeypatch.setattr(check_module, "BORROW_BYTES", 1024)
    result = bench(str(source), provider="CPUExecutionProvider", options=ConvertOptions(), warmup=0, runs=1,
                   profile_runs=0)  # CUDA's policy: the analysis judges the weights that may go low
    assert [m.label for m in result.models] == ["float32", "amp-rewrite"]
