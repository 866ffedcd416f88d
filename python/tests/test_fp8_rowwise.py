"""Row-wise FP8 (one float32 scale per row of A and per row of B) through the ops on a fake
torch and a fake RankGemm: the scale mode in the build and the cache key, the scale vectors'
addresses passed with each launch (the caller's own for reduce-scatter; for all-gather the
gathered scales of A and an N-long vector holding this rank's scales of B), the refusals."""

import math

import pytest
from fakes import BF16, E4M3, F32, Device, FakeRankGemm, FakeScale, FakeTensor

import distgemm
from distgemm import _checks


def e4m3(shape, **kwargs):
    return FakeTensor(shape, E4M3, **kwargs)


def f32(shape, **kwargs):
    return FakeTensor(shape, F32, **kwargs)


def record_full(torch):
    """Makes the fake torch.full keep the tensors it creates (in the returned list)."""
    created, full = [], torch.full

    def recording(*args, **kwargs):
        created.append(full(*args, **kwargs))
        return created[-1]

    torch.full = recording
    return created


def test_all_gather_linear_row_wise_gathers_scale_a_and_places_scale_b(env):
    torch = env(rank=1, world=2, backend="nccl")
    fulls = record_full(torch)
    x, w = e4m3((16, 128)), e4m3((64, 128))
    sa, sb = f32((16, 1)), f32((64,))
    out = distgemm.all_gather_linear(x, w, scale_a=sa, scale_b=sb)
    assert out.shape == (32, 64) and out.dtype is BF16
    [inst] = FakeRankGemm.built
    assert inst.args["scale_mode"] == "row" and inst.fp8_scales is None
    assert (inst.args["m"], inst.args["n"], inst.args["k"]) == (32, 128, 128)
    # scale_a: one all-gather on the op's group into M float32, from this rank's 16 scales.
    [(name, gathered, src, group)] = torch.distributed.collectives
    assert name == "all_gather_into_tensor" and group is torch.distributed.group.WORLD
    assert (gathered.shape, gathered.dtype) == ((32,), F32)
    assert (src.shape, src.data_ptr()) == ((16,), sa.data_ptr())
    # scale_b: an N-long float32 vector of NaN, this rank's N/TP scales at [64, 128).
    [b_full] = fulls
    assert (b_full.shape, b_full.dtype) == ((128,), F32) and math.isnan(b_full.fill)
    [(dst, src)] = FakeTensor.copies
    assert (dst.shape, dst.data_ptr()) == ((64,), b_full.data_ptr() + 4 * 64)
    assert (src.shape, src.data_ptr()) == ((64,), sb.data_ptr())
    assert inst.launches == [(0xABC, x.data_ptr(), w.data_ptr(), None, out.data_ptr())]
    assert inst.scale_ptrs == [(gathered.data_ptr(), b_full.data_ptr())]
    # New scale tensors: the same instance, new addresses, another small collective.
    distgemm.all_gather_linear(x, w, scale_a=f32((16,)), scale_b=f32((1, 64)))
    assert len(FakeRankGemm.built) == 1 and len(inst.scale_ptrs) == 2
    assert inst.scale_ptrs[1] != inst.scale_ptrs[0]
    assert len(torch.distributed.collectives) == 2


def test_row_wise_all_gather_of_a_3d_input_on_gloo(env):
    torch = env(rank=2, world=4, backend="gloo")
    x, w = e4m3((8, 2, 64)), e4m3((16, 64))
    distgemm.all_gather_linear(x, w, scale_a=f32((8, 2, 1)), scale_b=f32((16, 1)))
    [inst] = FakeRankGemm.built
    assert (inst.args["m"], inst.args["n"]) == (64, 64)
    [(name, chunks, src, group)] = torch.distributed.collectives
    assert name == "all_gather" and src.shape == (16,) and group is torch.distributed.group.WORLD
    assert [c.shape for c in chunks] == [(16,)] * 4
    assert [c.data_ptr() - chunks[0].data_ptr() for c in chunks] == [0, 64, 128, 192]
    assert inst.scale_ptrs == [(chunks[0].data_ptr(), inst.scale_ptrs[0][1])]
    [(dst, _)] = FakeTensor.copies
    assert dst.data_ptr() == inst.scale_ptrs[0][1] + 4 * 2 * 16


def test_linear_reduce_scatter_row_wise_passes_the_callers_scales(env):
    torch = env(rank=1, world=2)
    x, w = e4m3((32, 64)), e4m3((256, 64))
    for sa, sb in ((f32((32, 1)), f32((1, 256))), (f32((32,)), f32((256, 1)))):
        out = distgemm.linear_reduce_scatter(x, w, scale_a=sa, scale_b=sb)
        assert out.shape == (16, 256) and out.dtype is BF16
        assert FakeRankGemm.built[0].scale_ptrs[-1] == (sa.data_ptr(), sb.data_ptr())
    [inst] = FakeRankGemm.built
    assert (inst.args["m"], inst.args["n"], inst.args["k"]) == (32, 256, 128)
    assert inst.args["scale_mode"] == "row" and inst.fp8_scales is None
    assert torch.distributed.collectives == [] and FakeTensor.copies == []


def test_the_cache_keys_on_the_scale_mode_not_the_scales(env):
    env(world=2)
    x, w = e4m3((32, 64)), e4m3((256, 64))
    rs = distgemm.linear_reduce_scatter
    rs(x, w, scale_a=0.5, scale_b=2.0)
    rs(x, w, scale_a=f32((32, 1)), scale_b=f32((256,)))
    rs(x, w, scale_a=0.25, scale_b=2.0)
    rs(x, w, scale_a=f32((32, 1)), scale_b=f32((256,)))
    tensor, row = FakeRankGemm.built
    assert (tensor.args["scale_mode"], row.args["scale_mode"]) == ("tensor", "row")
    assert tensor.scale_ptrs == [(0, 0), (0, 0)] and tensor.scale_updates == [(0.25, 2.0)]
    assert len(row.scale_ptrs) == 2 and row.scale_updates == []


def test_a_one_row_scale_tensor_takes_its_partners_mode(env):
    env(world=2)
    # x_shard has one row: a (1, 1) scale_a is row-wise beside a row-wise scale_b (not read).
    x, w = e4m3((1, 128)), e4m3((64, 128))
    distgemm.all_gather_linear(x, w, scale_a=f32((1, 1)), scale_b=f32((64,)))
    assert FakeRankGemm.built[0].args["scale_mode"] == "row"


def test_row_wise_refusals_come_before_any_build_or_collective(env):
    torch = env(rank=0, world=2, backend="nccl")
    x, w = e4m3((16, 128)), e4m3((64, 128))
    xr, wr = e4m3((32, 64)), e4m3((256, 64))
    xb, wb = FakeTensor((16, 128)), FakeTensor((64, 128))
    ag, rs = distgemm.all_gather_linear, distgemm.linear_reduce_scatter
    bf16 = FakeTensor((16, 1), BF16)
    other_gpu = f32((16, 1), device=Device("cuda", 1))
    strided = FakeTensor((16, 1), F32, strides=(2, 1))
    cases = [
        (lambda: ag(x, w, scale_a=bf16, scale_b=f32((64,))), TypeError, "torch.float32"),
        (lambda: ag(x, w, scale_a=other_gpu, scale_b=f32((64,))), ValueError, "on cuda:1"),
        (lambda: ag(x, w, scale_a=strided, scale_b=f32((64,))), ValueError, "not contiguous"),
        (lambda: ag(x, w, scale_a=f32((32, 1)), scale_b=f32((64,))), ValueError, r"\(32, 1\)"),
        # all-gather: scale_b covers this rank's N/TP weight rows, not N.
        (lambda: ag(x, w, scale_a=f32((16, 1)), scale_b=f32((128,))), ValueError, r"\(64,\)"),
        (lambda: ag(x, w, scale_a=f32((16, 1)), scale_b=0.5), ValueError, "scale_a is row-wise"),
        (lambda: ag(x, w, scale_a=1.0, scale_b=f32((1, 64))), ValueError, "scale_b is row-wise"),
        (lambda: ag(x, w, scale_a=FakeScale(1.0), scale_b=f32((64,))), ValueError, "tensor-wise"),
        (lambda: rs(xr, wr, scale_a=f32((16, 1)), scale_b=f32((256,))), ValueError, r"\(32, 1\)"),
        (lambda: rs(xr, wr, scale_a=f32((32, 1)), scale_b=f32((256, 2))), ValueError, "scale_b"),
        (
            lambda: ag(xb, wb, scale_a=f32((16, 1)), scale_b=f32((64,))),
            TypeError,
            "scales apply to torch.float8_e4m3fn inputs only",
        ),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()
    assert FakeRankGemm.built == [] and torch.distributed.collectives == []


def test_scaled_drop_ins_take_torchs_row_wise_shapes(env):
    torch = env(rank=1, world=2, backend="nccl")
    a, w1, w2 = e4m3((16, 128)), e4m3((64, 128)), e4m3((32, 128))
    gathered, outs = distgemm.fused_all_gather_scaled_matmul(
        a, [w1.t(), w2.t()], f32((16, 1)), [f32((1, 64)), f32((1, 32))], 0, "0"
    )
    assert gathered.shape == (32, 128) and [o.shape for o in outs] == [(32, 64), (32, 32)]
    assert [i.args["scale_mode"] for i in FakeRankGemm.built] == ["row", "row"]
    # One scale all-gather per B, then return_A's gather of A.
    assert [(c[0], c[1].shape) for c in torch.distributed.collectives] == [
        ("all_gather_into_tensor", (32,)),
        ("all_gather_into_tensor", (32,)),
        ("all_gather_into_tensor", (32, 128)),
    ]
    # torch's replicated row-wise A_scale (the gathered rows' scales) is refused.
    with pytest.raises(ValueError, match=r"scale_a has shape \(32, 1\)"):
        distgemm.fused_all_gather_scaled_matmul(a, [w1.t()], f32((32, 1)), [f32((1, 64))], 0, "0")
    ar, wr = e4m3((8, 4, 64)), e4m3((256, 64))
    sa, sb = f32((8, 4, 1)), f32((1, 256))
    out = distgemm.fused_scaled_matmul_reduce_scatter(
        ar, wr.t(), sa, sb, "sum", 0, 0, "0", [8, 4, 256], out_dtype=torch.bfloat16
    )
    assert out.shape == (4, 4, 256)
    rs = FakeRankGemm.built[-1]
    assert rs.args["scale_mode"] == "row" and rs.scale_ptrs == [(sa.data_ptr(), sb.data_ptr())]


def test_row_scale_shapes():
    assert _checks.row_scale_shapes((8, 4), 32, of_b=False) == ((32,), (32, 1), (8, 4), (8, 4, 1))
    assert _checks.row_scale_shapes((16,), 16, of_b=False) == ((16,), (16, 1))
    assert _checks.row_scale_shapes((256,), 256, of_b=True) == ((256,), (1, 256), (256, 1))
