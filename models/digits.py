"""scikit-learn's digits (1,797 8x8 images, shipped with the package) as .npz files for ``amp-rewrite train``."""

from __future__ import annotations

import os

import numpy as np


def write(folder: str | os.PathLike, input_name: str = "x", image: bool = False, test_share: float = 0.25,
          seed: int = 0) -> tuple[str, str]:
    """``train.npz`` and ``test.npz`` in ``folder``: pixels scaled to [0, 1] under ``input_name``
    (flat [N, 64], or [N, 1, 8, 8] with ``image``) and integer ``labels``; a fixed shuffled split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    x = x[:, None] if image else x.reshape(len(x), -1)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_share))
    paths = []
    for name, rows in (("train", order[:cut]), ("test", order[cut:])):
        path = os.path.join(folder, f"{name}.npz")
        np.savez(path, **{input_name: x[rows], "labels": y[rows]})
        paths.append(path)
    return paths[0], paths[1]
