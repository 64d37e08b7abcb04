"""Reading what an offline W&B run wrote (its ``.wandb`` file), as ``wandb sync`` would.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of
records ``[crc32 4][length 2][type 1][data]`` (types: full, first, middle, last), each datum a
``wandb_internal_pb2.Record``. Only the history rows are needed here.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out: list[bytes] = []
    pending = b""
    pos = HEADER
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # block trailer: padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
            pending = b""
        else:
            break  # zero padding at the end of the last block
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The rows the run logged (``run.log``), in order, keyed by metric name."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/*.wandb")
    rows = []
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
