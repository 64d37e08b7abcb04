"""A pod stops on SIGTERM however many arrive at once (the kubelet's and a dead supervisor's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import logging, sys, threading
    from rlkube.launch.signals import stop_on_signals

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    stop = threading.Event()
    stop_on_signals(stop)
    print("ready", flush=True)
    busy = threading.Event()
    while not stop.is_set():  # the main thread takes and drops locks all the time, as a pod's does
        busy.set()
        busy.clear()
        logging.getLogger("child").debug("tick")
    print("stopped", flush=True)
    """
)


def test_a_burst_of_sigterms_stops_the_process_once_and_never_hangs_it() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        for _ in range(300):
            os.kill(child.pid, signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out.strip() == "stopped"
    assert "received SIGTERM: stopping" in err


def test_the_handler_takes_no_lock_so_a_signal_inside_event_set_cannot_deadlock() -> None:
    import threading

    from rlkube.launch.signals import stop_on_signals

    stop = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop_on_signals(stop, (signal.SIGUSR1,))
        # What the main thread holds while it is inside stop.set() (or a logging call): the lock
        # a handler calling stop.set() would wait for forever, in this very thread.
        with stop._cond:  # type: ignore[attr-defined]
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs here, in this thread
            assert not stop.is_set()
        assert stop.wait(10)  # set by the relay thread once the lock is free
    finally:
        signal.signal(signal.SIGUSR1, previous)
