"""Checkpoints: every carried value of a step (weights, optimizer states, the loss scale, the step
count) and the epoch it ends, in one ``.npz`` written whole or not at all (``files.save_arrays``),
and read back only into a step whose carried values they match."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import read_npz
from amp_rewrite.ir import files
from amp_rewrite.training.graph.flat_state import FLAT
from amp_rewrite.training.spec import StepSpec

EPOCH_KEY = "__epoch__"
"""A checkpoint's array that holds the epoch it ends."""


def write(path: str | os.PathLike, state: Mapping[str, np.ndarray], epoch: int) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.save_arrays(path, {**state, EPOCH_KEY: np.array(epoch)})


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], int]:
    """A checkpoint's carried values, and the epoch it ended."""
    arrays = read_npz(path)
    if EPOCH_KEY not in arrays:
        raise UserError(f"{path} is not a checkpoint of amp-rewrite train (no {EPOCH_KEY})")
    return arrays, int(arrays.pop(EPOCH_KEY))


def checked(spec: StepSpec, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state``'s value of every carried input of ``spec``, float32: all of them there, each shaped
    as the step's, else a UserError naming what the checkpoint was written for."""
    missing = [c.input for c in spec.carried if c.input not in state]
    if missing:
        layout = any(name.startswith(f"{FLAT}.") for name in state) != bool(spec.flat)
        raise UserError(f"the checkpoint lacks {', '.join(missing[:5])}: it was written for another step"
                        + (" (its optimizer states in the other --flat-state layout)" if layout else ""))
    values = {}
    for carried in spec.carried:
        value = np.asarray(state[carried.input], np.float32)
        if list(value.shape) != list(carried.shape):
            raise UserError(f"the checkpoint's {carried.input!r} has shape {list(value.shape)}, the step's "
                            f"{carried.shape}: it was written for another model")
        values[carried.input] = value
    return values
