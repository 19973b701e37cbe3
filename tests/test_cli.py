"""The command line: success path, and one clear line with exit 2 for every user mistake."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from models import builders


def amp(*args: str, cwd: Path | None = None, buffered: bool = False,
        stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """The command in a process of its own (``buffered``: its output block-buffered, whatever
    PYTHONUNBUFFERED says here; ``stdout``: where its output goes, else captured)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    if buffered:
        env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run([sys.executable, "-m", "amp_rewrite", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, cwd=cwd, env=env)


@pytest.fixture()
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "mlp.onnx"
    path.parent.mkdir()
    onnx.save(builders.mlp(), path)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_convert_writes_model_and_report_and_prints_a_summary(sample: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "mlp.mixed.onnx", tmp_path / "report.json"
    before = _digest(sample)
    done = amp("convert", str(sample), "-o", str(out), "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert "float nodes in float16" in done.stdout and "casts inserted" in done.stdout
    onnx.checker.check_model(str(out), full_check=True)
    data = json.loads(report.read_text())
    assert data["low_nodes"] > 0 and data["casts_inserted"] == 2 and data["bytes_after"] < data["bytes_before"]
    assert all(d["reason"] for d in data["decisions"])
    assert _digest(sample) == before
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _text(path: Path) -> Path:
    path.write_text("this is not a model\n")
    return path


def _external_missing(path: Path) -> Path:
    builders.save_with_external_data(builders.transformer(), path)
    Path(str(path) + ".data").unlink()
    return path


CASES = {
    "missing file": (lambda p: p.parent / "nope.onnx", [], "input file not found"),
    "not onnx": (lambda p: _text(p.parent / "notes.onnx"), [], "not"),
    "truncated": (lambda p: _truncate(p), [], "not a readable ONNX model"),
    "external data missing": (lambda p: _external_missing(p.parent / "ext.onnx"), [], "is missing: no file"),
    "unknown precision": (lambda p: p, ["--precision", "float8"], "invalid choice"),
    "unknown provider": (lambda p: p, ["--provider", "TPU"], "invalid choice"),
    "output folder missing": (lambda p: p, ["-o", "/nonexistent/dir/out.onnx"], "output folder does not exist"),
    "output is input": (lambda p: p, ["SAME"], "output path is the input path"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_mistakes_get_one_line_and_exit_2(case: str, sample: Path, tmp_path: Path) -> None:
    make_input, extra, message = CASES[case]
    source = make_input(sample)
    out = tmp_path / "out" / "result.onnx"
    out.parent.mkdir()
    args = ["convert", str(source), "-o", str(out)]
    if extra == ["SAME"]:
        args[-1] = str(source)
    elif extra:
        args = ["convert", str(source), *extra] + ([] if "-o" in extra else ["-o", str(out)])
    before = {p: _digest(p) for p in source.parent.iterdir() if p.is_file()}
    done = amp(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amp-rewrite: error:") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert list(out.parent.iterdir()) == [], "a partial output was left behind"
    assert {p: _digest(p) for p in source.parent.iterdir() if p.is_file()} == before


def test_unwritable_output_folder_is_a_user_error(sample: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as a user who can write anywhere")
    done = amp("convert", str(sample), "-o", str(locked / "x.onnx"))
    assert done.returncode == 2 and "not writable" in done.stderr


def test_inspect_prints_every_decision_and_explains_one(sample: Path) -> None:
    done = amp("inspect", str(sample))
    assert done.returncode == 0
    assert "log_softmax" in done.stdout and "allow" in done.stdout
    explained = amp("inspect", str(sample), "--explain", "log_softmax", "--provider", "none")
    assert explained.returncode == 0 and "reason:" in explained.stdout and "class: deny" in explained.stdout
    missing = amp("inspect", str(sample), "--explain", "no_such_node")
    assert missing.returncode == 2 and "no node named 'no_such_node'" in missing.stderr
    as_json = json.loads(amp("inspect", str(sample), "--json", "--provider", "none").stdout)
    assert {row["precision"] for row in as_json} == {"low", "fp32"}


def test_what_the_command_printed_arrives_though_it_skips_the_teardown(sample: Path) -> None:
    """``cli.entry`` ends the process without the interpreter's teardown: block-buffered output
    still arrives whole, with the exit code."""
    decisions = amp("inspect", str(sample), "--json", "--provider", "none", buffered=True)
    assert decisions.returncode == 0 and json.loads(decisions.stdout)
    missing = amp("inspect", str(sample), "--explain", "no_such_node", buffered=True)
    assert missing.returncode == 2 and "no node named 'no_such_node'" in missing.stderr



def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(sample: Path, tmp_path: Path) -> None:
    """``amp-rewrite convert ... | head``: once the reader has gone, the summary has nowhere to go;
    the command exits as a shell reports SIGPIPE (141), with no internal error, its output written."""
    out = tmp_path / "o.onnx"
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed:
        done = amp("convert", str(sample), "-o", str(out), stdout=closed)
    assert done.returncode == 141 and done.stderr == ""
    onnx.checker.check_model(str(out), full_check=True)

def test_keep_fp32_flags_reach_the_coloring(sample: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    done = amp("convert", str(sample), "-o", str(out), "--keep-fp32-op", "MatMul", "--keep-fp32-node", "gemm_.*",
               "--report", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    kept = {d["node"]: d["reason"] for d in report["fp32_reasons"]}
    assert any("--keep-fp32-op MatMul" in r for r in kept.values())
    assert any("--keep-fp32-node gemm_.*" in r for r in kept.values())
