"""The byte fuzz: valid models' files mutated (``models/mutations.py``) and handed to ``convert``
and ``inspect`` with default options, and ``check --random 1`` of each conversion. Every run ends
in a result (exit 0 or 1) or one line with exit 2 and nothing written; none in an internal error;
nothing outside the model's folder is opened (a symbolic link to the sentinel lies beside each
model, as ``link.bin``); memory stays bounded.

The fuzz runs in a process of its own (``python tests/test_fuzz_models.py``), whose peak memory
is its own: ``make test`` runs AMP_FUZZ_MODEL_EXAMPLES (default 40) examples from seed 0, ``make
fuzz`` many more from a random seed (AMP_FUZZ_RANDOM=1), printing the seed. An internal error
leaves its model in the output folder, to rerun by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLES = int(os.environ.get("AMP_FUZZ_MODEL_EXAMPLES", "40"))
RANDOM = os.environ.get("AMP_FUZZ_RANDOM", "") not in ("", "0")
BUDGET_MIB = {"process": 2048, "child": 6144}
"""Peak resident memory of the fuzz process, and of its largest child: a mutation that makes
amp-rewrite allocate what a tensor's dims claim shows up here. The child's is larger by design: the
range check's last candidate inputs (``inputs.samples.LONGER_DIMS``, up to 8192 long) are tried when
a run fails inside the model, and a mutated model that fails so whatever the extents (a LayerNorm's
axis set to 2**31) runs its attention at that length."""
CHILD_TIMEOUT = 120.0
"""Seconds the fuzz gives each run of ONNX Runtime (``isolate.DEFAULT_TIMEOUT``, 900 s elsewhere):
a mutated trip count makes a Loop of trillions of iterations, which only the timeout ends (a
refusal, as any stopped run), and the fuzz would wait for it in every subcommand."""


def _seeds(folder: Path) -> list[tuple[bytes, bytes | None]]:
    """The valid models mutated: (model bytes, external data bytes or None)."""
    from models import builders

    models = [builders.mlp(features=8, hidden=16, layers=2), builders.transformer(blocks=1),
              builders.control_flow(width=4), builders.seed_cnn(image_size=16, classes=4)]
    seeds: list[tuple[bytes, bytes | None]] = [(m.SerializeToString(), None) for m in models]
    external = folder / "seed" / "m.onnx"
    external.parent.mkdir(parents=True)
    builders.save_with_external_data(builders.transformer(blocks=1), external, location="m.onnx.data")
    seeds.append((external.read_bytes(), (folder / "seed" / "m.onnx.data").read_bytes()))
    return seeds


def fuzz(examples: int, seed: int, folder: Path) -> dict:
    from amp_rewrite.runtime import isolate
    from models.mutations import mutant
    from tests import untrusted

    isolate.DEFAULT_TIMEOUT = CHILD_TIMEOUT

    rng = np.random.default_rng(seed)
    seeds = _seeds(folder)
    root = folder / "root"
    counts: dict[str, int] = {}
    problems: list[str] = []
    for example in range(examples):
        data, external = seeds[int(rng.integers(len(seeds)))]
        other = seeds[int(rng.integers(len(seeds)))][0]
        model = mutant(rng, data, other)
        shutil.rmtree(root, ignore_errors=True)
        untrusted.lay_out(root)
        path = root / "models" / "m.onnx"
        path.write_bytes(model)
        if external is not None:
            (root / "models" / "m.onnx.data").write_bytes(external)
        os.symlink(root / "secret.txt", root / "models" / "link.bin")
        (folder / "last.onnx").write_bytes(model)  # a crash leaves what caused it
        converted = root / "models" / "x.onnx"
        for argv in (["convert", str(path), "-o", str(root / "out" / "x.onnx")], ["inspect", str(path)],
                     ["check", str(path), str(converted), "--random", "1"]):
            if argv[0] == "check" and not converted.exists():  # the conversion, where there is one, against its source
                continue
            done = untrusted.run(argv)
            kind = {0: "result", 1: "result", 2: "refused"}.get(done.code, "internal error")
            counts[f"{argv[0]} {kind}"] = counts.get(f"{argv[0]} {kind}", 0) + 1
            problem = _problem(done, kind, root)
            if problem:
                kept = folder / f"problem-{example}.onnx"
                kept.write_bytes(model)
                problems.append(f"{argv[0]} on {kept}: {problem}")
            for written in (root / "out").iterdir():
                written.rename(root / "models" / written.name)
        for who, peak in _peaks().items():
            if peak >= BUDGET_MIB[who] and not any(p.startswith(f"{who} memory") for p in problems):
                kept = folder / f"memory-{example}.onnx"
                kept.write_bytes(model)
                problems.append(f"{who} memory past {BUDGET_MIB[who]} MiB ({peak} MiB) on {kept}")
    return {"seed": seed, "examples": examples, "counts": counts, "problems": problems, "peak_mib": _peaks()}


def _peaks() -> dict[str, int]:
    """Peak resident memory so far, in MiB: of this process, and of its largest child."""
    return {who: resource.getrusage(kind).ru_maxrss // 1024
            for who, kind in (("process", resource.RUSAGE_SELF), ("child", resource.RUSAGE_CHILDREN))}


def _problem(done, kind: str, root: Path) -> str | None:
    from tests import untrusted

    if kind == "internal error":
        return done.err.strip()
    if untrusted.outside(root, done.opened) or untrusted.SENTINEL.decode() in done.out + done.err:
        return f"read outside the model's folder: {untrusted.outside(root, done.opened)}"
    if kind == "refused":
        lines = done.err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("amp-rewrite: error:"):
            return f"a refusal of {len(lines)} lines: {done.err!r}"
        if any((root / "out").iterdir()):
            return "a refusal left output behind"
    return None


def test_mutated_models_get_a_result_or_one_line(tmp_path: Path) -> None:
    seed = int(np.random.default_rng().integers(1 << 31)) if RANDOM else 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, __file__, "--examples", str(EXAMPLES), "--seed", str(seed),
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"the fuzz process died (seed {seed}; its last model: {tmp_path / 'last.onnx'}):" \
                                 f"\n{done.stderr[-3000:]}"
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(summary))
    assert not summary["problems"], f"seed {seed}: " + "\n".join(summary["problems"])
    assert sum(summary["counts"][f"{command} {kind}"] for command in ("convert", "inspect")
               for kind in ("result", "refused")) == 2 * EXAMPLES
    assert summary["counts"].get("convert refused", 0) > 0 and summary["counts"].get("convert result", 0) > 0, \
        "the mutations should both break models and leave some valid"
    assert all(summary["peak_mib"][who] < budget for who, budget in BUDGET_MIB.items()), summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=EXAMPLES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args()
    print(json.dumps(fuzz(options.examples, options.seed, options.out)))
