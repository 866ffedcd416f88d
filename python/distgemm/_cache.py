"""Built instances, reused across calls: one per (group, problem, dtype, schedule, scalars).

Building is collective and costs milliseconds (handles exchanged, workspaces allocated, graphs
instantiated); a repeated call with the same key pays only the launch. The cache is a
least-recently-used map of bounded size *per process group*: the members of a group make the
same calls on that group in the same order (the ops are collective), so they evict and close
the same instances of that group in the same order, which closing (a collective teardown over
that group) needs. A call on one group never evicts another group's instance, whose other
members would not be making the matching call.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Hashable
from typing import Callable

DEFAULT_LIMIT = 32


def _limit_from_env() -> int:
    raw = os.environ.get("DISTGEMM_CACHE_SIZE", "")
    if not raw:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError(f"DISTGEMM_CACHE_SIZE={raw!r} is not an integer") from None
    if limit < 1:
        raise ValueError(f"DISTGEMM_CACHE_SIZE={limit} must be at least 1")
    return limit


class InstanceCache:
    """An LRU map key -> instance (anything with ``close()``), closing what it evicts."""

    def __init__(self, limit: int = DEFAULT_LIMIT):
        if limit < 1:
            raise ValueError(f"cache limit {limit} must be at least 1")
        self.limit = limit
        # key -> (group, instance), least recently used first.
        self._entries: OrderedDict[Hashable, tuple] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def values(self) -> list:
        """The instances, least recently used first."""
        return [inst for _, inst in self._entries.values()]

    def get(self, key: Hashable, build: Callable[[], object], group: Hashable = None) -> object:
        """The instance for ``key``, built by ``build()`` (collective) on a miss; at most
        ``limit`` instances of ``group`` are kept, the least recently used of that group (and
        only of that group) closed first."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry[1]
        inst = build()
        self._entries[key] = (group, inst)
        same = [k for k, (g, _) in self._entries.items() if g == group]
        for old_key in same[: max(0, len(same) - self.limit)]:
            _, old = self._entries.pop(old_key)
            old.close()
        return inst

    def clear(self, close: Callable[[object], None] = lambda inst: inst.close()) -> None:
        """Closes every instance, group by group; raises the first error after trying them
        all."""
        # Group by group (in an order every process agrees on), least recently used first
        # within a group: a process in several groups then meets each group's other members
        # in the same order, whatever else it ran.
        order = sorted(
            self._entries.items(), key=lambda item: repr(item[1][0])
        )
        self._entries.clear()
        first = None
        for _, (_, inst) in order:
            try:
                close(inst)
            except Exception as e:  # noqa: BLE001 - close the rest, then report
                first = first or e
        if first is not None:
            raise first


CACHE = InstanceCache(_limit_from_env())


def clear_cache() -> None:
    """Closes every built distgemm instance of this process (collective: call it on every rank
    of every group that ran a distgemm op, at the same point, e.g. before
    ``torch.distributed.destroy_process_group()``). Later calls rebuild what they need."""
    CACHE.clear()


def exited_with_error() -> bool:
    """Whether the interpreter is exiting on an uncaught exception (set before atexit runs)."""
    return any(hasattr(sys, name) for name in ("last_exc", "last_value"))


def close_at_exit(collective: bool) -> None:
    """The atexit hook's body. After a normal exit every rank reaches it with the same cache,
    so the instances are closed collectively, in LRU order. After an uncaught exception, or
    with the default process group gone, other ranks may never arrive: the instances are then
    abandoned without a rendezvous (the process is ending; the driver frees its memory)."""
    CACHE.clear(
        close=(lambda inst: inst.close())
        if collective
        else (lambda inst: inst.close(collective=False))
    )
