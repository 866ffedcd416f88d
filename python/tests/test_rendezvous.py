"""The rendezvous adapter over a fake process group: ranks in threads, all_gather_object
implemented with a barrier, as torch.distributed's is with a collective."""

import threading

import pytest

from distgemm._rendezvous import GroupRendezvous


class FakeGroup:
    """all_gather_object for `world` threads; `order` can permute where each rank's object lands."""

    def __init__(self, world, order=None):
        self.world = world
        self.order = order or list(range(world))
        self.slots = [None] * world
        self.barrier = threading.Barrier(world, timeout=10)
        self.rounds = 0

    def gatherer(self, rank):
        def all_gather_object(out, obj):
            self.slots[self.order[rank]] = obj
            self.barrier.wait()
            out[:] = list(self.slots)
            self.barrier.wait()
            if rank == 0:
                self.rounds += 1

        return all_gather_object


def run_ranks(world, body, order=None):
    group = FakeGroup(world, order)
    results, errors = [None] * world, [None] * world

    def worker(rank):
        try:
            results[rank] = body(GroupRendezvous(rank, world, group.gatherer(rank)))
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors[rank] = e

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results, errors, group


def test_all_gather_returns_every_rank_in_rank_order():
    def body(rdv):
        first = rdv.all_gather(f"rank{rdv.rank}".encode())
        second = rdv.all_gather(bytes([rdv.rank]) * (rdv.rank + 1))
        return first, second

    results, errors, group = run_ranks(4, body)
    assert errors == [None] * 4
    for first, second in results:
        assert first == [b"rank0", b"rank1", b"rank2", b"rank3"]
        assert second == [b"\x00", b"\x01\x01", b"\x02\x02\x02", b"\x03\x03\x03\x03"]
    assert group.rounds == 2


def test_empty_payload_is_a_barrier():
    results, errors, _ = run_ranks(3, lambda rdv: rdv.all_gather(b""))
    assert errors == [None] * 3
    assert results == [[b"", b"", b""]] * 3


def test_attributes_and_argument_checks():
    rdv = GroupRendezvous(1, 2, lambda out, obj: None)
    assert (rdv.rank, rdv.world_size) == (1, 2)
    assert repr(rdv) == "GroupRendezvous(rank=1, world_size=2)"
    with pytest.raises(TypeError, match="all_gather takes bytes"):
        rdv.all_gather("text")
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2 ranks"):
        GroupRendezvous(2, 2, lambda out, obj: None)


def test_a_rank_that_contributes_nothing_is_an_error():
    # A peer whose slot stays empty (e.g. a backend that dropped it) is reported by rank.
    rdv = GroupRendezvous(0, 2, lambda out, obj: out.__setitem__(0, obj))
    with pytest.raises(TypeError, match="rank 1 contributed NoneType"):
        rdv.all_gather(b"x")


def test_collective_errors_propagate():
    def broken(out, obj):
        raise RuntimeError("gloo: connection closed by peer")

    with pytest.raises(RuntimeError, match="connection closed"):
        GroupRendezvous(0, 2, broken).all_gather(b"x")


def test_the_extension_builds_collectively_through_the_python_rendezvous():
    """Two ranks in threads call the extension's constructor; its Rust rendezvous calls back
    into the fake group (the GIL released around the build). On a machine without a GPU both
    ranks get the driver's error, and none hangs."""
    import distgemm
    from distgemm._distgemm import RankGemm

    def build(rdv):
        try:
            RankGemm(rdv, 0, "ag-a", False, 64, 64, 64, "bf16")
        except Exception as e:  # noqa: BLE001 - the test inspects it
            return e
        return None

    results, errors, group = run_ranks(2, build)
    assert errors == [None, None]
    assert all(isinstance(e, distgemm.DistGemmError) for e in results), results
    assert group.rounds >= 1  # the handshake went through the Python all_gather
