"""The weight plane's errors. Each message names what was wrong and where (version, offset, file)."""

from __future__ import annotations


class WeightPlaneError(RuntimeError):
    """Base of every weight-plane error."""


class ShmError(WeightPlaneError):
    """A weight buffer directory cannot be used; the message says why."""


class WriterBusyError(ShmError):
    """Another process is the writer of this directory (the message names it)."""


class SlotBusyError(ShmError):
    """Readers did not leave a slot before the writer's deadline; the message names them."""


class IntegrityError(WeightPlaneError):
    """Bytes do not match what their version promised (checksum, length, layout digest, order)."""


class StaleVersionError(WeightPlaneError):
    """A version is not newer than the one already held (same incarnation, lower or equal number)."""


class FetchError(WeightPlaneError):
    """A gRPC call to a weight store failed (status and peer in the message)."""
