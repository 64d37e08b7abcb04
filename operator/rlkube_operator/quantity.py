"""Kubernetes resource quantities, as far as the operator computes with them (pure).

Only what gang scheduling needs: the requests of a whole train gang are one pod's requests times
the number of ranks. A quantity is multiplied in its own unit (``500m`` x 4 is ``2000m``, ``1Gi``
x 4 is ``4Gi``), so nothing is rounded and the API server reads the same amount.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal

#: The API server's quantity grammar: a signed decimal, then a binary or decimal suffix or an exponent.
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|(?:[eE][+-]?[0-9]+))?$"
)


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def scale(quantity: str | int | float, factor: int) -> str:
    """``quantity`` times ``factor``, in the quantity's own unit."""
    text = str(quantity).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    product = Decimal(number) * factor
    digits = format(product.normalize(), "f") if product != product.to_integral() else str(int(product))
    return digits + suffix


def pod_requests(requests: Mapping[str, object], limits: Mapping[str, object]) -> dict[str, str]:
    """What the scheduler reserves for one container: its requests, a limit where no request is set."""
    names = [*requests, *(name for name in limits if name not in requests)]
    return {name: str(requests[name] if name in requests else limits[name]) for name in names}


def gang_requests(requests: Mapping[str, str], members: int) -> dict[str, str]:
    """The requests of ``members`` identical pods."""
    return {name: scale(value, members) for name, value in requests.items()}
