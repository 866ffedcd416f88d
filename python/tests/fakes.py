"""Stand-ins for torch, torch.distributed and the extension's RankGemm, so the ops' checks,
keys and launches can be tested in CI, where there is neither torch nor a GPU."""

from __future__ import annotations

import math
import sys
import types
from typing import ClassVar


class Dtype:
    def __init__(self, name: str, size: int):
        self.name, self.size = name, size

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


BF16, F16, F32 = Dtype("bfloat16", 2), Dtype("float16", 2), Dtype("float32", 4)
E4M3, E5M2, U8 = Dtype("float8_e4m3fn", 1), Dtype("float8_e5m2", 1), Dtype("uint8", 1)


class FakeScale:
    """A one-element (or longer) tensor holding a scale; counts the host reads (``item()``)."""

    def __init__(self, value, numel=1):
        self.value, self._numel, self.reads = value, numel, 0

    def numel(self):
        return self._numel

    def item(self):
        self.reads += 1
        return self.value


class Device:
    def __init__(self, type_: str, index):
        self.type, self.index = type_, index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class FakeTensor:
    """Shape, dtype, device, strides and an address: what the ops look at."""

    _next_ptr = 1 << 20
    copies: ClassVar[list] = []  # (destination, source) of every copy_()

    def __init__(self, shape, dtype=BF16, device=None, ptr=None, strides=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device or Device("cuda", 0)
        self._strides = strides or self._contiguous_strides(self.shape)
        if ptr is None:
            ptr = FakeTensor._next_ptr
            FakeTensor._next_ptr += max(1, self.numel() * dtype.size + 4096) // 512 * 512 + 512
        self._ptr = ptr
        self.fill = None  # torch.full's value

    @staticmethod
    def _contiguous_strides(shape):
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))

    def dim(self):
        return len(self.shape)

    def numel(self):
        return math.prod(self.shape)

    def item(self):
        raise AssertionError("a tensor's value was read on the host (a synchronisation)")

    def element_size(self):
        return self.dtype.size

    def stride(self):
        return self._strides

    def is_contiguous(self):
        return self._strides == self._contiguous_strides(self.shape)

    def data_ptr(self):
        return self._ptr

    def t(self):
        assert self.dim() == 2
        return FakeTensor(self.shape[::-1], self.dtype, self.device, self._ptr, self._strides[::-1])

    def chunk(self, n):
        rows = self.shape[0] // n
        step = rows * math.prod(self.shape[1:]) * self.dtype.size
        return [
            FakeTensor((rows, *self.shape[1:]), self.dtype, self.device, self._ptr + i * step)
            for i in range(n)
        ]

    def view(self, how):
        """torch's two views: as another dtype of the same size, or (contiguous) as a shape."""
        if isinstance(how, tuple):
            assert self.is_contiguous() and math.prod(how) == self.numel()
            return FakeTensor(how, self.dtype, self.device, self._ptr)
        assert how.size == self.dtype.size
        return FakeTensor(self.shape, how, self.device, self._ptr, self._strides)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(self.numel() // known if d == -1 else d for d in shape)
        return self.view(tuple(shape))

    def narrow(self, dim, start, length):
        assert dim == 0 and self.is_contiguous() and start + length <= self.shape[0]
        step = math.prod(self.shape[1:]) * self.dtype.size
        return FakeTensor(
            (length, *self.shape[1:]), self.dtype, self.device, self._ptr + start * step
        )

    def copy_(self, src):
        assert src.shape == self.shape
        FakeTensor.copies.append((self, src))
        return self

    def contiguous(self):
        return self if self.is_contiguous() else FakeTensor(self.shape, self.dtype, self.device)


class FakeRankGemm:
    """Records what the ops build and launch; shard shapes as distgemm's contract states."""

    built: ClassVar[list] = []

    def __init__(
        self,
        rendezvous,
        device,
        schedule,
        auto,
        m,
        n,
        k,
        dtype,
        alpha=1.0,
        beta=0.0,
        timeout_s=None,
        allow_shared_gpu=False,
        rs_partials=None,
        fp8_scales=None,
        scale_mode=None,
    ):
        self.rank, self.tp = rendezvous.rank, rendezvous.world_size
        self.args = {
            "device": device,
            "schedule": schedule,
            "auto": auto,
            "m": m,
            "n": n,
            "k": k,
            "dtype": dtype,
            "alpha": alpha,
            "beta": beta,
            "timeout_s": timeout_s,
            "allow_shared_gpu": allow_shared_gpu,
            "rs_partials": rs_partials,
            "scale_mode": scale_mode,
        }
        self.schedule = schedule
        self.fp8_scales = fp8_scales
        self.scale_updates = []
        self.launches = []
        self.launch_scales = []  # the tensor-wise scales each launch ran with
        self.scale_ptrs = []  # each launch's (a_scales, b_scales) addresses
        self.closed = False
        FakeRankGemm.built.append(self)

    def shard_shape(self, which):
        a = self.args
        p, m, n, k = self.tp, a["m"], a["n"], a["k"]
        if self.schedule.startswith("ag-"):
            return {"A": (m // p, k), "B": (n // p, k), "D": (m, n // p)}[which]
        return {"A": (m, k // p), "B": (n, k // p), "D": (m // p, n)}[which]

    def set_fp8_scales(self, sa, sb):
        assert not self.closed and self.fp8_scales is not None
        self.fp8_scales = (sa, sb)
        self.scale_updates.append((sa, sb))

    def launch(self, stream, a, b, c, d, a_scales=0, b_scales=0):
        assert not self.closed
        # As the Rust binding: scale vectors exactly for a row-wise instance.
        assert (self.args["scale_mode"] == "row") == (a_scales != 0) == (b_scales != 0)
        self.launches.append((stream, a, b, c, d))
        self.launch_scales.append(self.fp8_scales)
        self.scale_ptrs.append((a_scales, b_scales))

    def synchronize(self):
        pass

    def close(self, collective=True):
        self.closed = True


def install_fake_torch(
    monkeypatch,
    *,
    rank=0,
    world=2,
    capability=(9, 0),
    backend="gloo",
    initialized=True,
    capturing=False,
    grad_enabled=True,
):
    """Puts a fake `torch` (with `torch.cuda` and `torch.distributed`) into sys.modules."""
    torch = types.ModuleType("torch")
    torch.bfloat16, torch.float16, torch.float32 = BF16, F16, F32
    torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8 = E4M3, E5M2, U8
    torch.empty = lambda shape, dtype, device: FakeTensor(shape, dtype, device)

    def full(shape, value, dtype, device):
        t = FakeTensor(shape, dtype, device)
        t.fill = value
        return t

    torch.full = full
    torch.is_grad_enabled = lambda: grad_enabled

    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda d: capability
    cuda.get_device_name = lambda d: "NVIDIA H200" if capability == (9, 0) else "NVIDIA A100"
    cuda.current_stream = lambda d: types.SimpleNamespace(cuda_stream=0xABC)
    cuda.is_current_stream_capturing = lambda: capturing
    torch.cuda = cuda

    world_group = types.SimpleNamespace(group_name="0")
    gathered = []
    collectives = []  # (name, out tensor(s), input tensor, group) of every all-gather
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: initialized
    dist.group = types.SimpleNamespace(WORLD=world_group)
    dist.get_rank = lambda g=None: rank
    dist.get_world_size = lambda g=None: world
    dist.get_process_group_ranks = lambda g: list(range(world))
    dist.get_backend = lambda g=None: backend

    def all_gather_object(out, obj, group=None):
        for i in range(len(out)):
            out[i] = obj

    def all_gather(outs, x, group=None):
        gathered.append(("all_gather", len(outs), x.shape))
        collectives.append(("all_gather", outs, x, group))

    def all_gather_into_tensor(out, x, group=None):
        gathered.append(("all_gather_into_tensor", out.shape, x.shape))
        collectives.append(("all_gather_into_tensor", out, x, group))

    dist.all_gather_object = all_gather_object
    dist.all_gather = all_gather
    dist.all_gather_into_tensor = all_gather_into_tensor
    dist.gathered = gathered
    dist.collectives = collectives
    c10d = types.ModuleType("torch.distributed.distributed_c10d")

    def resolve(name):
        if name != world_group.group_name:
            raise KeyError(name)
        return world_group

    c10d._resolve_process_group = resolve
    dist.distributed_c10d = c10d
    torch.distributed = dist

    for name, mod in (
        ("torch", torch),
        ("torch.cuda", cuda),
        ("torch.distributed", dist),
        ("torch.distributed.distributed_c10d", c10d),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    return torch
