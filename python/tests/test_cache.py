"""The instance cache: LRU order, eviction closes, teardown order and errors."""

import pytest

from distgemm import _cache


class Inst:
    def __init__(self, name, log, fail=False):
        self.name, self.log, self.fail = name, log, fail

    def close(self, collective=True):
        self.log.append((self.name, collective))
        if self.fail:
            raise RuntimeError(f"close {self.name} failed")


def test_hit_miss_and_lru_eviction():
    log = []
    cache = _cache.InstanceCache(limit=2)
    builds = []

    def build(name):
        def f():
            builds.append(name)
            return Inst(name, log)

        return f

    a = cache.get("a", build("a"))
    assert cache.get("a", build("a-again")) is a
    cache.get("b", build("b"))
    cache.get("a", build("a-again"))  # a becomes most recent
    cache.get("c", build("c"))  # evicts b, the least recently used
    assert builds == ["a", "b", "c"]
    assert log == [("b", True)]
    assert "b" not in cache and "a" in cache and len(cache) == 2
    assert [i.name for i in cache.values()] == ["a", "c"]


def test_clear_closes_in_lru_order_and_reports_the_first_error():
    log = []
    cache = _cache.InstanceCache(limit=8)
    for name in ("x", "y", "z"):
        cache.get(name, lambda name=name: Inst(name, log, fail=name == "y"))
    cache.get("x", lambda: None)
    with pytest.raises(RuntimeError, match="close y failed"):
        cache.clear()
    assert [n for n, _ in log] == ["y", "z", "x"]
    assert len(cache) == 0


def test_a_failed_build_caches_nothing():
    cache = _cache.InstanceCache()

    def build():
        raise ValueError("N=65 is not divisible")

    with pytest.raises(ValueError):
        cache.get("k", build)
    assert len(cache) == 0


def test_exit_abandons_or_closes(monkeypatch):
    log = []
    cache = _cache.InstanceCache()
    cache.get("a", lambda: Inst("a", log))
    cache.get("b", lambda: Inst("b", log))
    monkeypatch.setattr(_cache, "CACHE", cache)
    _cache.close_at_exit(collective=False)
    assert log == [("a", False), ("b", False)]
    cache.get("c", lambda: Inst("c", log))
    _cache.close_at_exit(collective=True)
    assert log[-1] == ("c", True)


def test_limit_from_env(monkeypatch):
    monkeypatch.setenv("DISTGEMM_CACHE_SIZE", "5")
    assert _cache._limit_from_env() == 5
    monkeypatch.setenv("DISTGEMM_CACHE_SIZE", "0")
    with pytest.raises(ValueError, match="at least 1"):
        _cache._limit_from_env()
    monkeypatch.setenv("DISTGEMM_CACHE_SIZE", "many")
    with pytest.raises(ValueError, match="not an integer"):
        _cache._limit_from_env()
    monkeypatch.delenv("DISTGEMM_CACHE_SIZE")
    assert _cache._limit_from_env() == _cache.DEFAULT_LIMIT


def test_a_group_never_evicts_another_groups_instance():
    from distgemm._cache import InstanceCache

    closed = []

    class Inst:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    cache = InstanceCache(limit=2)
    cache.get(("g1", 1), lambda: Inst("g1-1"), group="g1")
    cache.get(("g1", 2), lambda: Inst("g1-2"), group="g1")
    for i in range(5):
        cache.get(("g2", i), lambda i=i: Inst(f"g2-{i}"), group="g2")
    assert closed == ["g2-0", "g2-1", "g2-2"]
    assert ("g1", 1) in cache and ("g1", 2) in cache
    cache.get(("g1", 3), lambda: Inst("g1-3"), group="g1")
    assert closed[-1] == "g1-1"
    cache.clear()
    # Group by group (g1 before g2), least recently used first within a group.
    assert closed[-4:] == ["g1-2", "g1-3", "g2-3", "g2-4"]
