"""Turn SIGTERM and SIGINT into a ``threading.Event``, safely.

I/O (a pipe, a thread). A Python signal handler runs in the main thread between two bytecodes,
wherever that thread is: also inside ``Event.set`` or a logging call that holds a lock. A second
SIGTERM arriving while the first one's handler was in ``Event.set`` (the kubelet's, plus the
parent-death signal of a supervisor that died) re-entered it and waited forever for the lock the
interrupted call held: an eval pod hung instead of stopping. So the handler here only writes the
signal's number to a pipe (no lock); a thread reads it, logs, and sets the event.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType

logger = logging.getLogger(__name__)


def stop_on_signals(
    stop: threading.Event, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> None:
    """Set ``stop`` when any of ``signals`` arrives, however often and whenever (main thread only)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # a full pipe: the relay has a byte to read already
            os.write(write_fd, bytes([signum]))

    def relay() -> None:
        while True:
            received = os.read(read_fd, 64)
            if not received:
                return
            for signum in received:
                logger.info("received %s: stopping", signal.Signals(signum).name)
            stop.set()

    threading.Thread(target=relay, name="signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, handler)
