"""The record, in a converted model's metadata, of the nodes that measurements kept float32 (by
``node_key``, with the reason): a later conversion of that model keeps them float32 too
(``MeasureRanges``), and ``bench`` says which nodes it names."""

from __future__ import annotations

import json
from collections.abc import Mapping

import onnx

RECORD_KEY = "amp_rewrite.kept_fp32"
"""The metadata entry that holds the record."""


def recorded_fp32(model: onnx.ModelProto) -> dict[str, str]:
    """The reason for each node (by ``node_key``) that measurements kept float32, as recorded."""
    return json.loads(next((p.value for p in model.metadata_props if p.key == RECORD_KEY), "") or "{}")


def record(model: onnx.ModelProto, kept: Mapping[str, str]) -> None:
    """``kept`` recorded in ``model``'s metadata (in place), replacing an earlier record; nothing
    where it is empty."""
    if not kept:
        return
    entries = [p for p in model.metadata_props if p.key != RECORD_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(entries)
    model.metadata_props.add(key=RECORD_KEY, value=json.dumps(dict(kept), sort_keys=True))
