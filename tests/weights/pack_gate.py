"""A publisher ``pack_gate`` that holds packing before the last chunk, for tests of streaming."""

from __future__ import annotations

import threading


class Gate:
    """Holds packing before the last chunk until ``release()``; ``packing_last`` says it got there."""

    def __init__(self, *, fail: bool = False) -> None:
        self.packing_last = threading.Event()
        self.released = threading.Event()
        self.fail = fail

    def __call__(self, index: int, chunks: int) -> None:
        if index == chunks - 1:
            self.packing_last.set()
            assert self.released.wait(30), "the test never released packing"
            if self.fail:
                raise RuntimeError("the trainer failed while packing the last chunk")

    def release(self) -> None:
        self.released.set()
