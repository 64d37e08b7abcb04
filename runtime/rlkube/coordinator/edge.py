"""What the coordinator accepts from the wire: limits, the registration gate, and refusals.

Pure: no I/O, no clock of its own (the gate takes ``now``). Every limit is checked before the
state changes, and a refused call raises :class:`Refused` with the reason; the gRPC servicer
answers it with :attr:`Refused.code` (``INVALID_ARGUMENT``, ``PERMISSION_DENIED`` or
``RESOURCE_EXHAUSTED``), never ``UNKNOWN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Refusal(Enum):
    """Why a call is refused; the servicer maps each to one gRPC status code."""

    INVALID = "INVALID_ARGUMENT"  # the message itself is malformed or out of range
    DENIED = "PERMISSION_DENIED"  # well-formed, but the caller may not do this (not the lease holder)
    EXHAUSTED = "RESOURCE_EXHAUSTED"  # a rate or count limit; retry later


class Refused(Exception):
    def __init__(self, kind: Refusal, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


#: The largest request the coordinator's server reads (a PushFragment: num_envs x T transitions).
#: gRPC answers RESOURCE_EXHAUSTED to anything larger without parsing it.
MAX_REQUEST_BYTES = 64 << 20
#: Characters of any identifier or name on the wire (pod, node, worker and task ids, reasons).
MAX_NAME_CHARS = 253  # a Kubernetes object name
#: Entries of one fingerprint report, and episodes reported in one push.
MAX_FINGERPRINT_ENTRIES = 4096
MAX_EPISODES_PER_PUSH = 100_000
#: Live members at most; a registration past it is RESOURCE_EXHAUSTED.
MAX_MEMBERS = 1024
#: Registrations: a burst of this many, then this many per second (a token bucket).
REGISTRATION_BURST = 64
REGISTRATIONS_PER_SECOND = 10.0
#: Environments one worker may declare.
MAX_NUM_ENVS = 65_536


def check_name(what: str, value: str, *, required: bool = False) -> None:
    """Refuse an identifier that is too long, not printable, or missing when ``required``."""
    if required and not value:
        raise Refused(Refusal.INVALID, f"{what} is required")
    if len(value) > MAX_NAME_CHARS:
        raise Refused(Refusal.INVALID, f"{what} has {len(value)} characters; at most {MAX_NAME_CHARS}")
    if not value.isprintable():
        raise Refused(Refusal.INVALID, f"{what} holds non-printable characters")


@dataclass
class RegistrationGate:
    """A token bucket over registrations: ``burst`` at once, then ``rate`` per second."""

    burst: int = REGISTRATION_BURST
    rate: float = REGISTRATIONS_PER_SECOND
    _tokens: float = -1.0
    _at: float = 0.0

    def admit(self, now: float) -> bool:
        if self._tokens < 0:
            self._tokens, self._at = float(self.burst), now
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
