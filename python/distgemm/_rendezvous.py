"""The rendezvous distgemm's Rust builder calls back into: bytes exchanged among the ranks of a
torch.distributed process group.

The builder exchanges a few hundred bytes per rank (IPC handles, device UUIDs, problem,
schedule) when an instance is built and when it is closed. ``GroupRendezvous.all_gather`` does
that with ``torch.distributed.all_gather_object`` on the group, which works with every backend
(NCCL, gloo — gloo lets two ranks share one GPU in tests) and across hosts. Its wait is bounded
by the process group's timeout, not by distgemm's.
"""

from __future__ import annotations

from typing import Callable


class GroupRendezvous:
    """``rank``, ``world_size`` and ``all_gather(bytes) -> list[bytes]`` over one group.

    ``all_gather_object(out_list, obj)`` is the collective (torch.distributed's, bound to the
    group, in :meth:`for_group`; a fake in the unit tests).
    """

    def __init__(
        self, rank: int, world_size: int, all_gather_object: Callable[[list, object], None]
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a group of {world_size} ranks")
        self.rank = rank
        self.world_size = world_size
        self._all_gather_object = all_gather_object

    @classmethod
    def for_group(cls, group) -> GroupRendezvous:
        """The rendezvous of a torch.distributed process group (``None``: the default group)."""
        import torch.distributed as dist

        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("this process is not a member of the given process group")
        world_size = dist.get_world_size(group)

        def gather(out: list[bytes | None], obj: bytes) -> None:
            dist.all_gather_object(out, obj, group=group)

        return cls(rank, world_size, gather)

    def all_gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, indexed by rank (collective)."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"all_gather takes bytes, got {type(data).__name__}")
        out: list[bytes | None] = [None] * self.world_size
        self._all_gather_object(out, bytes(data))
        for r, part in enumerate(out):
            if not isinstance(part, bytes):
                raise TypeError(
                    f"rendezvous: rank {r} contributed {type(part).__name__}, not bytes"
                )
        return out  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"GroupRendezvous(rank={self.rank}, world_size={self.world_size})"
