"""Which weights a model holds: :class:`WeightKey`, the (incarnation, version) pair every plane passes.

Pure, and importable from every layer (it sits with ``config`` at the bottom, see .importlinter).

Order: version numbers count within one *incarnation* of train rank 0 (a random token that
changes when rank 0 restarts, whose numbers then start again), and incarnations have no order
of their own. So keys are not ordered: ``<`` raises ``TypeError`` (tuple order would rank
incarnations by their text). What the code asks instead:

* :meth:`WeightKey.supersedes` -- is this key the one to load instead of another? A key of a
  different incarnation always supersedes (only the live rank 0 publishes, so a key that differs
  is the newer rank 0's); within one incarnation the higher version does.
* :meth:`WeightKey.satisfies` -- does a model holding this key meet a task's ``min_version``
  (of a given incarnation, when the caller knows which)?

A ``WeightKey`` is a named tuple, so it equals the plain ``(incarnation, version)`` pair it
replaces and hashes like one.
"""

from __future__ import annotations

from typing import NamedTuple


class WeightKey(NamedTuple):
    incarnation: str
    version: int

    @classmethod
    def of(cls, pair: tuple[str, int] | None) -> WeightKey | None:
        """``pair`` as a key (None stays None): for keys from duck-typed planes."""
        return None if pair is None else cls(*pair)

    def supersedes(self, other: tuple[str, int] | None) -> bool:
        """Whether a holder of ``other`` (None: nothing) should load this key instead."""
        if other is None:
            return True
        incarnation, version = other
        return self.incarnation != incarnation or self.version > version

    def satisfies(self, *, min_version: int, incarnation: str | None = None) -> bool:
        """Whether this key is ``min_version`` or newer, of ``incarnation`` (None: of any)."""
        return self.version >= min_version and incarnation in (None, self.incarnation)

    def __lt__(self, other: object) -> bool:
        raise _unordered()

    def __le__(self, other: object) -> bool:
        raise _unordered()

    def __gt__(self, other: object) -> bool:
        raise _unordered()

    def __ge__(self, other: object) -> bool:
        raise _unordered()


def _unordered() -> TypeError:
    return TypeError("weight keys have no order across incarnations: use supersedes() or satisfies()")
