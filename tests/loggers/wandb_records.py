"""Reading what an offline W&B run wrote (its ``.wandb`` file), as ``wandb sync`` would.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of
records ``[crc32 4][length 2][type 1][data]`` (types: full, first, middle, last), each datum a
``wandb_internal_pb2.Record``. Only the history rows are needed here.
"""

from __future__ import annotations

import json
import struct
import time
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


def history(run_dir: Path, *, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The rows the run logged (``run.log``), in order, keyed by metric name.

    Read once the file is complete: ``run.finish()`` can return while W&B's service process is
    still writing it, so this waits (up to ``timeout``) for the run's exit record, written last.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout
    while True:
        (path,) = run_dir.glob("wandb/offline-run-*/*.wandb")
        parsed = []
        try:
            for raw in records(path):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(raw)
                parsed.append(record)
        except DecodeError:  # the last record is still being written
            parsed = []
        if any(r.WhichOneof("record_type") == "exit" for r in parsed):
            break
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout:.0f} s"
        time.sleep(0.05)
    rows = []
    for record in parsed:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
