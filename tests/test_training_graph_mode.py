"""Graph mode (``training.graph_mode``): the step bound once at fixed addresses trains bit for bit
as the ordinary binding does; on CUDA it is the default for a step of fixed extents, and where
ONNX Runtime refuses CUDA graphs the trainer says so in one line and goes on without them.

No test here has a GPU: the CUDA cases open their session on the CPU (``instrument.session``
replaced) and keep their values in host memory (``StepSession.device_value`` replaced)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.errors import UserError
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.step_session import GRAPH_ID, WARMUP_RUNS, StepSession
from amp_rewrite.training import build
from amp_rewrite.training.runner.schedules import Schedule
from amp_rewrite.training.runner.trainer import Trainer
from tests.helpers import rng
from tests.test_specialize import _decoder
from tests.test_training_step import _batch, _mlp

FIXED = {"x": [6, 4], "labels": [6]}
"""The extents the MLP's step is specialized to (``_batch``'s)."""
REFUSAL = "This session cannot use the CUDA Graph feature as requested by the user"


def _step(optimizer: str = "adamw", precision: str = "float32", specialize=FIXED):
    return build(_mlp(), loss="cross-entropy", output="logits", optimizer=optimizer, precision=precision,
                 loss_scale="dynamic", specialize=specialize)


def _same(a: float, b: float) -> bool:
    return np.array_equal(np.float32(a), np.float32(b), equal_nan=True)


def _assert_same_state(one: Trainer, other: Trainer) -> None:
    for carried in one.spec.carried:
        assert np.array_equal(one.value(carried.input), other.value(carried.input), equal_nan=True), carried.input


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fixed_buffers_train_bit_for_bit_as_the_ordinary_binding(optimizer, precision):
    """Losses, scales, skipped flags and every carried value after each step: equal bits, through a
    step skipped for an inf gradient (the dynamic scale halves) and a learning rate changed between
    steps (the device scalar updated in place)."""
    step = _step(optimizer, precision)
    first = {name: value.copy() for name, value in step.initial.items()}
    fixed, ordinary = (Trainer(step, lr=0.05, weight_decay=0.01, graph_mode=mode) for mode in (True, False))
    assert fixed.graph_mode and not ordinary.graph_mode
    for seed in range(1, 7):
        batch = _batch(seed)
        if seed == 3:
            batch["x"][0, 0] = np.inf
        if seed == 4:
            fixed.lr = ordinary.lr = 0.02
        got, want = fixed.step(batch), ordinary.step(batch)
        assert _same(got.loss, want.loss) and got.scale == want.scale and got.skipped == want.skipped
        assert got.skipped == (seed == 3)
        _assert_same_state(fixed, ordinary)
    assert fixed.scale == 2.0**15
    assert all(np.array_equal(step.initial[name], value) for name, value in first.items()), "first values kept"


def test_fit_in_graph_mode_is_fit_without_it():
    """Epochs of full batches (the last partial one left out, as a specialized step does), a
    schedule, evaluation and the best epoch's weights loaded back into the fixed buffers."""
    step = _step("adamw", "float16")
    data = {"x": rng(5).normal(0, 1, (20, 4)).astype(np.float32), "labels": rng(6).integers(0, 3, 20)}
    schedule = Schedule("cosine", 1, 6, 0, 0.1)
    histories, trainers = [], []
    for mode in (True, False):
        trainer = Trainer(step, lr=0.05, graph_mode=mode)
        histories.append(trainer.fit(data, epochs=3, batch_size=6, eval_data=data, progress=False,
                                     schedule=schedule, keep_best=True))
        trainers.append(trainer)
    fixed, ordinary = histories
    assert len(fixed.scales) == 9 and trainers[0].steps == trainers[1].steps  # 3 full batches an epoch
    assert [(e["loss"], e["skipped"], e["scale"], e["eval"]) for e in fixed.epochs] == \
        [(e["loss"], e["skipped"], e["scale"], e["eval"]) for e in ordinary.epochs]
    assert (fixed.scales, fixed.skipped_steps, fixed.best_epoch) == \
        (ordinary.scales, ordinary.skipped_steps, ordinary.best_epoch)
    _assert_same_state(*trainers)
    assert trainers[0].step(_batch(9)) == trainers[1].step(_batch(9))  # trains on from the loaded weights alike


def test_a_batch_on_the_device_is_copied_into_the_fixed_buffers():
    step = _step()
    fixed, ordinary = Trainer(step, lr=0.1, graph_mode=True), Trainer(step, lr=0.1)
    for seed in (1, 2, 3):
        batch = _batch(seed)
        assert fixed.step(fixed.device_batch(batch)) == ordinary.step(batch)
    _assert_same_state(fixed, ordinary)


def test_an_input_the_step_has_no_extents_for_gets_the_first_batchs():
    step = _step(specialize={"x": [6, 4]})
    fixed, ordinary = Trainer(step, lr=0.1, graph_mode=True), Trainer(step, lr=0.1)
    for seed in (1, 2):
        assert fixed.step(_batch(seed)) == ordinary.step(_batch(seed))
    _assert_same_state(fixed, ordinary)
    with pytest.raises(UserError, match=r"input 'labels' is int64 \[5\]; its fixed buffer holds int64 \[6\]"):
        fixed.step({**_batch(), "labels": _batch()["labels"][:5]})


def test_a_batch_of_another_shape_or_type_is_one_error():
    """Found before the step runs, the first one too: the buffers are made at the step's extents."""
    trainer = Trainer(_step(), graph_mode=True)
    with pytest.raises(UserError, match=r"graph mode: input 'labels' is int32 \[6\]; its fixed buffer holds int64 "):
        trainer.step({**_batch(), "labels": _batch()["labels"].astype(np.int32)})
    with pytest.raises(UserError, match=r"input 'x' is float32 \[5, 4\]; its fixed buffer holds float32 \[6, 4\]"):
        trainer.step(_batch(n=5))
    assert trainer.steps == 0
    trainer.step(_batch())


def test_graph_mode_is_asked_of_a_step_of_fixed_extents():
    with pytest.raises(UserError, match="graph mode needs a step of fixed extents"):
        Trainer(_step(specialize=None), graph_mode=True)


def _on_the_cpu(monkeypatch, refuse_session: bool = False, refuse_run: int | None = None) -> dict:
    """``Trainer``s for CUDA opened on the CPU; what they asked for. ``refuse_session``: a session
    asked for CUDA graphs raises as ONNX Runtime does; ``refuse_run``: the run of that number (from
    1) that carries a graph id raises."""
    real = instrument.session
    seen: dict = {"options": [], "graph_ids": []}

    class Session:
        """The CPU session, its runs counted."""

        def __init__(self, session) -> None:
            self.session = session

        def __getattr__(self, name):
            return getattr(self.session, name)

        def run_with_iobinding(self, binding, run_options=None):
            graph_id = run_options.get_run_config_entry(GRAPH_ID) if run_options is not None else None
            if graph_id is not None:
                seen["graph_ids"].append(int(graph_id))
                if len(seen["graph_ids"]) == refuse_run:
                    raise RuntimeError("CUDA failure 900: operation not permitted when stream is capturing")
            return self.session.run_with_iobinding(binding, run_options)

    def session(model, base_dir=None, provider="CPUExecutionProvider", **kwargs):
        options = kwargs.pop("provider_options", None) or {}
        seen["options"].append(dict(options))
        if refuse_session and options.get("enable_cuda_graph") == "1":
            raise RuntimeError(f"{REFUSAL} as all compute graph nodes have not been partitioned to the CUDA EP.")
        return Session(real(model, base_dir, "CPUExecutionProvider", **kwargs))

    monkeypatch.setattr(instrument, "session", session)
    monkeypatch.setattr(StepSession, "device_value",
                        lambda self, array: ort.OrtValue.ortvalue_from_numpy(np.array(array, order="C")))
    return seen


def test_the_default_is_graph_mode_on_cuda_for_a_step_of_fixed_extents(monkeypatch):
    fixed, free = _step(), _step(specialize=None)
    assert not Trainer(fixed).graph_mode and not Trainer(free).graph_mode  # the CPU: off
    seen = _on_the_cpu(monkeypatch)
    trainer = Trainer(fixed, provider="CUDAExecutionProvider")
    assert trainer.graph_mode and seen["options"][-1]["enable_cuda_graph"] == "1"
    for seed in range(1, 5):
        trainer.step(_batch(seed))
    assert seen["graph_ids"] == [0, 1, 0, 1]  # a graph for each buffer set the step reads
    assert not Trainer(free, provider="CUDAExecutionProvider").graph_mode
    assert "enable_cuda_graph" not in seen["options"][-1]
    assert not Trainer(fixed, provider="CUDAExecutionProvider", graph_mode=False).graph_mode


def test_cuda_graphs_refused_by_the_session_are_one_note_and_training_goes_on(monkeypatch, capsys):
    step = _step()
    plain = Trainer(step, lr=0.1, emulate=False)
    _on_the_cpu(monkeypatch, refuse_session=True)
    trainer = Trainer(step, provider="CUDAExecutionProvider", lr=0.1)
    err = capsys.readouterr().err
    assert err == (f"amp-rewrite: note: CUDA graphs refused by ONNX Runtime ({REFUSAL} as all compute graph nodes "
                   f"have not been partitioned to the CUDA EP.); training without them\n")
    assert not trainer.graph_mode
    for seed in range(1, 4):
        assert trainer.step(_batch(seed)) == plain.step(_batch(seed))
    _assert_same_state(trainer, plain)
    assert capsys.readouterr().err == ""


def test_cuda_graphs_refused_by_a_first_run_are_one_note_and_the_step_is_taken_without(monkeypatch, capsys):
    """The capture fails on the third run: that step is taken again, unbound from the buffers, in a
    session without graphs; the weights are those of training without graphs throughout."""
    step = _step()
    plain = Trainer(step, lr=0.1, emulate=False)
    seen = _on_the_cpu(monkeypatch, refuse_run=3)
    trainer = Trainer(step, provider="CUDAExecutionProvider", lr=0.1)
    for seed in range(1, 6):
        assert trainer.step(_batch(seed)) == plain.step(_batch(seed))
    assert seen["graph_ids"] == [0, 1, 0] and not trainer.graph_mode
    assert "enable_cuda_graph" not in seen["options"][-1]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA graphs refused by ONNX Runtime (CUDA failure 900: operation not " \
                                   "permitted when stream is capturing); training without them" in err
    _assert_same_state(trainer, plain)


def test_a_run_that_fails_after_the_graphs_are_captured_is_an_error(monkeypatch):
    _on_the_cpu(monkeypatch, refuse_run=WARMUP_RUNS + 1)
    trainer = Trainer(_step(), provider="CUDAExecutionProvider")
    for seed in range(WARMUP_RUNS):
        trainer.step(_batch(seed))
    with pytest.raises(UserError, match="onnxruntime cannot run the training step on CUDAExecutionProvider: CUDA "
                                        "failure 900"):
        trainer.step(_batch())


def _train(tmp_path, model: onnx.ModelProto, data: dict, *extra: str) -> int:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "d.npz", **data)
    return main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "mse", "--output",
                 model.graph.output[0].name, "--batch-size", "8", "-o", str(tmp_path / "t.onnx"), "--quiet", *extra])


def test_train_graph_mode_on_trains_a_step_of_fixed_extents_as_off_does(tmp_path):
    """A decoder whose Resize sizes are computed needs its step specialized (train does it): on
    the CPU, --graph-mode on binds it at fixed addresses, with the weights --graph-mode off gives."""
    data = {"x": rng(4).normal(0, 1, (20, 3, 8, 8)).astype(np.float32), "labels": np.zeros((20, 2, 8, 8), np.float32)}
    trained = []
    for mode in ("on", "off"):
        assert _train(tmp_path, _decoder(), data, "--graph-mode", mode, "--epochs", "2", "--lr", "1e-2") == 0
        trained.append([numpy_helper.to_array(t) for t in onnx.load(tmp_path / "t.onnx").graph.initializer])
    assert all(np.array_equal(a, b) for a, b in zip(*trained))


def test_train_graph_mode_on_builds_the_step_for_the_batch_size(tmp_path):
    """A model whose step takes batches of any size gets one of --batch-size: the last, partial
    batch of each epoch (4 of 20 samples in batches of 8) is left out."""
    data = {"x": rng(4).normal(0, 1, (20, 4)).astype(np.float32), "labels": rng(5).normal(0, 1, (20, 3))}
    report = tmp_path / "r.json"
    assert _train(tmp_path, _mlp(), data, "--graph-mode", "on", "--precision", "float32", "--epochs", "3",
                  "--report", str(report)) == 0
    assert json.loads(report.read_text())["steps"] == 3 * 2
