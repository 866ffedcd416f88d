import os
import sys

# The fakes live beside the tests; the package under test is the installed wheel.
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
from fakes import FakeRankGemm, FakeTensor, install_fake_torch  # noqa: E402

from distgemm import _cache, _ops  # noqa: E402


@pytest.fixture
def env(monkeypatch):
    """A setup function for the op tests: installs the fake torch (its keyword arguments:
    see fakes.install_fake_torch) and a fake RankGemm, with a fresh instance cache and
    per-process state; returns the fake torch module."""

    def setup(**kwargs):
        torch = install_fake_torch(monkeypatch, **kwargs)
        monkeypatch.setattr(_ops, "RankGemm", FakeRankGemm)
        monkeypatch.setattr(_ops, "CACHE", _cache.InstanceCache())
        monkeypatch.setattr(_ops, "_checked_devices", {})
        monkeypatch.setattr(_ops, "_warned_copies", set())
        monkeypatch.setattr(_ops, "_torch_module", None)
        FakeRankGemm.built = []
        FakeTensor.copies = []
        return torch

    return setup
