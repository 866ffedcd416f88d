"""FP8 (float8_e4m3fn operands, tensor-wise scales, bf16 result) through the ops on a fake
torch and a fake RankGemm: the argument checks, what is built and cached, and the scale-update
path (new scales reach the cached instance through set_fp8_scales, never a rebuild)."""

import pytest
from fakes import (
    BF16,
    E4M3,
    E5M2,
    F16,
    F32,
    FakeRankGemm,
    FakeScale,
    FakeTensor,
)

import distgemm
from distgemm import _checks



def e4m3(shape, **kwargs):
    return FakeTensor(shape, E4M3, **kwargs)


def test_all_gather_linear_in_fp8_builds_e4m3_with_the_scales_and_writes_bf16(env):
    env(rank=1, world=2)
    x, w = e4m3((16, 128)), e4m3((64, 128))
    out = distgemm.all_gather_linear(x, w, scale_a=0.5, scale_b=FakeScale(0.25))
    assert out.shape == (32, 64) and out.dtype is BF16
    [inst] = FakeRankGemm.built
    assert (inst.args["dtype"], inst.args["m"], inst.args["n"], inst.args["k"]) == (
        "e4m3",
        32,
        128,
        128,
    )
    assert inst.fp8_scales == (0.5, 0.25) and inst.scale_updates == []
    assert inst.launches == [(0xABC, x.data_ptr(), w.data_ptr(), None, out.data_ptr())]
    # out_dtype=torch.bfloat16 spelled out is the same instance; out= must be bf16.
    given = FakeTensor((32, 64), BF16)
    assert distgemm.all_gather_linear(x, w, out=given, scale_a=0.5, scale_b=0.25) is given
    assert len(FakeRankGemm.built) == 1 and len(inst.launches) == 2
    with pytest.raises(
        TypeError, match="out has dtype torch.float8_e4m3fn; the result is torch.bfloat16"
    ):
        distgemm.all_gather_linear(x, w, out=e4m3((32, 64)), scale_a=0.5, scale_b=0.25)


def test_new_scales_update_the_cached_instance_without_a_rebuild(env):
    env(rank=0, world=4)
    x, w = e4m3((64, 32)), e4m3((256, 32))
    for sa, sb in ((0.5, 0.25), (0.5, 0.25), (2.0, 0.25), (2.0, 0.25), (0.5, 0.25)):
        out = distgemm.linear_reduce_scatter(x, w, schedule="rs-a", scale_a=sa, scale_b=sb)
    assert out.shape == (16, 256) and out.dtype is BF16
    [inst] = FakeRankGemm.built
    assert inst.args["dtype"] == "e4m3" and inst.args["k"] == 128
    # Set only when the pair changes, and each launch runs with its call's scales.
    assert inst.scale_updates == [(2.0, 0.25), (0.5, 0.25)]
    assert inst.launch_scales == [
        (0.5, 0.25),
        (0.5, 0.25),
        (2.0, 0.25),
        (2.0, 0.25),
        (0.5, 0.25),
    ]
    # Scales are compared as the f32 values the kernels use: 0.1 twice is one value.
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a", scale_a=0.1, scale_b=0.1)
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a", scale_a=0.1, scale_b=0.1)
    assert len(inst.scale_updates) == 3 and inst.fp8_scales[0] != 0.1
    assert inst.fp8_scales[0] == pytest.approx(0.1, rel=2**-24)


def test_the_cache_keys_on_the_dtype(env):
    env()
    shape_x, shape_w = (16, 128), (64, 128)
    distgemm.all_gather_linear(FakeTensor(shape_x), FakeTensor(shape_w))
    distgemm.all_gather_linear(e4m3(shape_x), e4m3(shape_w), scale_a=1.0, scale_b=1.0)
    distgemm.all_gather_linear(FakeTensor(shape_x), FakeTensor(shape_w))
    distgemm.all_gather_linear(e4m3(shape_x), e4m3(shape_w), scale_a=1.0, scale_b=2.0)
    assert [(i.args["dtype"], i.fp8_scales) for i in FakeRankGemm.built] == [
        ("bf16", None),
        ("e4m3", (1.0, 2.0)),
    ]
    assert [len(i.launches) for i in FakeRankGemm.built] == [2, 2]


def test_scale_tensors_are_read_on_the_host_once_per_call(env):
    env()
    sa, sb = FakeScale(0.75), FakeScale(3)
    distgemm.all_gather_linear(e4m3((16, 128)), e4m3((64, 128)), scale_a=sa, scale_b=sb)
    assert (sa.reads, sb.reads) == (1, 1)
    assert FakeRankGemm.built[0].fp8_scales == (0.75, 3.0)


def test_fp8_argument_errors_name_the_problem(env):
    env()
    x, w = e4m3((16, 128)), e4m3((64, 128))
    bf16_x, bf16_w = FakeTensor((16, 128)), FakeTensor((64, 128))
    e5m2 = FakeTensor((16, 128), E5M2), FakeTensor((64, 128), E5M2)
    ag = distgemm.all_gather_linear

    def ag8(sa=1.0, sb=1.0, operands=(x, w), **kwargs):
        return ag(*operands, scale_a=sa, scale_b=sb, **kwargs)

    cases = [
        (lambda: ag(x, w), TypeError, "pass both scale_a and scale_b"),
        (lambda: ag(x, w, scale_a=1.0), TypeError, "pass both scale_a and scale_b"),
        (lambda: ag8(operands=(x, bf16_w)), TypeError, "x_shard is e4m3 but weight is bf16"),
        (lambda: ag(bf16_x, w), TypeError, "x_shard is bf16 but weight is e4m3"),
        (lambda: ag8(operands=e5m2), TypeError, "float8_e5m2; .* takes e4m3 only"),
        (
            lambda: ag(bf16_x, bf16_w, scale_a=1.0),
            TypeError,
            "scale_a given, but x_shard and weight are bf16",
        ),
        (lambda: ag8(operands=(bf16_x, bf16_w)), TypeError, "scale_a and scale_b given"),
        (
            lambda: ag(bf16_x, bf16_w, out_dtype=F16),
            TypeError,
            "GEMM of bf16 operands writes torch.bfloat16",
        ),
        (
            lambda: ag8(out_dtype=F16),
            TypeError,
            "out_dtype=torch.float16: .* e4m3 operands writes torch.bfloat16 .the only output",
        ),
        (lambda: ag8(sa=0.0), ValueError, "scale_a=0.0: FP8 scales must be finite"),
        (lambda: ag8(sb=-1.0), ValueError, "scale_b=-1.0"),
        (lambda: ag8(sa=float("nan")), ValueError, "scale_a=nan"),
        (lambda: ag8(sa=float("inf")), ValueError, "scale_a=inf"),
        (lambda: ag8(sa=1e39), ValueError, "finite and at least 2.-63 in f32"),
        (lambda: ag8(sa=2.0**-64), ValueError, "at least 2.-63"),
        (lambda: ag8(sa=True), TypeError, "scale_a must be a float"),
        (lambda: ag8(sa="1"), TypeError, "scale_a must be a float"),
        (
            lambda: ag8(sa=FakeTensor((16, 2), F32)),
            ValueError,
            r"scale_a has shape \(16, 2\): a row-wise scale .* \(16,\), \(16, 1\)",
        ),
        (lambda: ag8(sa=FakeScale(float("nan"))), ValueError, "scale_a=nan"),
        # K and K/TP are rows of 16 e4m3 elements.
        (
            lambda: ag8(operands=(e4m3((16, 24)), e4m3((64, 24)))),
            ValueError,
            "K=24 is not a multiple of 16",
        ),
        (
            lambda: distgemm.linear_reduce_scatter(
                e4m3((16, 24)), e4m3((64, 24)), scale_a=1.0, scale_b=1.0
            ),
            ValueError,
            "K/TP=24 is not a multiple of 16",
        ),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()
    assert FakeRankGemm.built == []
    # The 16-bit ops are unchanged: the same K=24 is fine in bf16, N/TP stays a multiple of 8.
    distgemm.linear_reduce_scatter(FakeTensor((16, 24)), FakeTensor((64, 24)))
    ag8(operands=(e4m3((16, 128)), e4m3((8, 128))))
    assert [i.args["dtype"] for i in FakeRankGemm.built] == ["bf16", "e4m3"]


def test_check_problem_counts_operand_elements_per_16_bytes():
    _checks.check_problem("rs-a", 64, 64, 64, 2, operand_bytes=1)  # K/TP = 32
    with pytest.raises(ValueError, match="K/TP=24 is not a multiple of 16"):
        _checks.check_problem("rs-a-single", 64, 64, 48, 2, operand_bytes=1)
    with pytest.raises(ValueError, match="N=60 is not a multiple of 8"):
        _checks.check_problem("rs-a", 64, 60, 64, 2, operand_bytes=1)
    _checks.check_problem("rs-a", 64, 64, 48, 2)  # 16-bit: K/TP = 24 is fine


def test_scale_value_is_the_f32_value():
    assert _checks.scale_value("scale_a", 0.5) == 0.5
    assert _checks.scale_value("scale_a", 3) == 3.0
    assert _checks.scale_value("scale_a", FakeScale(2.0**-63)) == 2.0**-63
    assert _checks.scale_value("scale_a", 0.1) == pytest.approx(0.1, rel=2**-24)
    assert _checks.scale_value("scale_a", 0.1) != 0.1


def test_return_gathered_moves_e4m3_as_bytes(env):
    torch = env(backend="gloo")
    _, gathered = distgemm.all_gather_linear(
        e4m3((16, 128)), e4m3((64, 128)), return_gathered=True, scale_a=1.0, scale_b=1.0
    )
    assert gathered.shape == (32, 128) and gathered.dtype is E4M3
    assert torch.distributed.gathered == [("all_gather", 2, (16, 128))]


def test_fused_all_gather_scaled_matmul_matches_torchs_signature(env):
    torch = env(backend="nccl")
    a = e4m3((16, 128))
    w1, w2 = e4m3((64, 128)), e4m3((32, 128))
    sa, sb1, sb2 = FakeScale(0.5), FakeScale(0.25), FakeScale(2.0)
    gathered, outs = distgemm.fused_all_gather_scaled_matmul(
        a,
        [w1.t(), w2.t()],
        sa,
        [sb1, sb2],
        0,
        "0",
        [None, None],
        [None, None],
        [torch.bfloat16, torch.bfloat16],
        [True, False],
    )
    assert gathered.shape == (32, 128) and gathered.dtype is E4M3
    assert [(o.shape, o.dtype) for o in outs] == [((32, 64), BF16), ((32, 32), BF16)]
    assert [i.fp8_scales for i in FakeRankGemm.built] == [(0.5, 0.25), (0.5, 2.0)]
    assert [i.launches[0][2] for i in FakeRankGemm.built] == [w1.data_ptr(), w2.data_ptr()]
    none, [out] = distgemm.fused_all_gather_scaled_matmul(
        a, [w1.t()], 1.0, [1.0], -2, "0", return_A=False
    )
    assert none is None and out.dtype is BF16
    assert FakeRankGemm.built[0].scale_updates == [(1.0, 1.0)]
    bad = [
        (dict(B_scales=[sb1]), ValueError, "B_scales must be a list of 2 scales"),
        (dict(biases=[None, FakeTensor((64,))]), ValueError, "biases: .* takes no biases"),
        (dict(result_scales=[sa, None]), ValueError, "result_scales"),
        (dict(out_dtypes=[None, torch.bfloat16]), TypeError, "out_dtypes.0.=None asks for e4m3"),
        (dict(out_dtypes=[torch.float16, torch.bfloat16]), TypeError, "out_dtype=torch.float16"),
        (dict(gather_dim=1), ValueError, "gather_dim=1: distgemm supports gather_dim=0 only"),
        (
            dict(A_scale=FakeTensor((16, 1), F32)),
            ValueError,
            "scale_a is row-wise but scale_b is tensor-wise",
        ),
    ]
    for override, exc, message in bad:
        kwargs = dict(
            A_shard=a,
            Bs=[w1.t(), w2.t()],
            A_scale=sa,
            B_scales=[sb1, sb2],
            gather_dim=0,
            group_name="0",
        )
        kwargs.update(override)
        with pytest.raises(exc, match=message):
            distgemm.fused_all_gather_scaled_matmul(**kwargs)
    with pytest.raises(TypeError, match="scale_a and scale_b given, but A_shard and Bs.0. are"):
        distgemm.fused_all_gather_scaled_matmul(
            FakeTensor((16, 128)), [FakeTensor((64, 128)).t()], 1.0, [1.0], 0, "0"
        )


def test_fused_scaled_matmul_reduce_scatter_matches_torchs_signature(env):
    torch = env(rank=1, world=2)
    a, w = e4m3((8, 4, 64)), e4m3((256, 64))
    sa, sb = FakeScale(0.5), FakeScale(0.25)
    out = distgemm.fused_scaled_matmul_reduce_scatter(
        a, w.t(), sa, sb, "sum", 0, 0, "0", [8, 4, 256], None, None, torch.bfloat16, True
    )
    assert out.shape == (4, 4, 256) and out.dtype is BF16
    [inst] = FakeRankGemm.built
    args = inst.args
    assert (args["schedule"], args["auto"], args["dtype"]) == ("rs-a", True, "e4m3")
    assert (args["m"], args["n"], args["k"], args["alpha"]) == (32, 256, 128, 1.0)
    assert inst.fp8_scales == (0.5, 0.25) and (sa.reads, sb.reads) == (1, 1)
    assert inst.launches == [(0xABC, a.data_ptr(), w.data_ptr(), None, out.data_ptr())]
    # A flattened to a matrix (torch's async-TP pass): output_shape regroups its rows and the
    # result is that shape scattered along dim 0, on the same instance; "avg" is alpha 1/TP.
    flat = e4m3((32, 64))
    out = distgemm.fused_scaled_matmul_reduce_scatter(
        flat, w.t(), 1.0, 2.0, "sum", -3, -2, "0", (8, 4, 256), out_dtype=torch.bfloat16
    )
    assert out.shape == (4, 4, 256) and len(FakeRankGemm.built) == 1
    assert inst.scale_updates == [(1.0, 2.0)]
    avg = distgemm.fused_scaled_matmul_reduce_scatter(
        flat, w.t(), 1.0, 2.0, "avg", 0, 0, "0", [32, 256], out_dtype=torch.bfloat16
    )
    assert avg.shape == (16, 256)
    assert [i.args["alpha"] for i in FakeRankGemm.built] == [1.0, 0.5]


def test_fused_scaled_matmul_reduce_scatter_refusals_name_the_argument(env):
    torch = env(world=2)
    a, w = e4m3((8, 64)), e4m3((256, 64))
    bad = [
        (dict(reduce_op="max"), ValueError, "reduce_op='max'"),
        (dict(orig_scatter_dim=1), ValueError, "orig_scatter_dim=1: .* orig_scatter_dim=0 only"),
        (dict(scatter_dim_after_maybe_reshape=1), ValueError, "scatter_dim_after_maybe_reshape=1"),
        (dict(A_scale=FakeTensor((8, 1), F32)), ValueError, "scale_a is row-wise but scale_b is"),
        (dict(B_scale=FakeTensor((1, 256), F32)), ValueError, "scale_b is row-wise but scale_a is"),
        (dict(bias=FakeTensor((256,))), ValueError, "bias: .* takes no bias"),
        (dict(result_scale=FakeScale(1.0)), ValueError, "result_scale: .* takes no result_scale"),
        (dict(out_dtype=None), TypeError, "out_dtype=None asks for a float8_e4m3fn result"),
        (dict(out_dtype=torch.float16), TypeError, "out_dtype=torch.float16"),
        (dict(output_shape=[8, 128]), ValueError, r"output_shape=\[8, 128\] is not the shape"),
        (dict(output_shape=[2, 2, 256]), ValueError, "must hold A's 8 rows"),
        (dict(output_shape=[1, 8, 256]), ValueError, "output_shape.0.=1 is not divisible by"),
        (dict(output_shape=8), TypeError, "output_shape must be a list of ints"),
        (dict(A=FakeTensor((8, 64))), TypeError, "A is bf16 but B is e4m3"),
        (dict(A=e4m3((8, 24)), B=e4m3((256, 24)).t()), ValueError, "K/TP=24 is not a multiple"),
        (dict(A=(8, 64)), TypeError, "A must be a torch.Tensor"),
        (dict(group_name="tp"), ValueError, "group_name='tp' names no process group"),
    ]
    for override, exc, message in bad:
        kwargs = dict(
            A=a,
            B=w.t(),
            A_scale=1.0,
            B_scale=1.0,
            reduce_op="sum",
            orig_scatter_dim=0,
            scatter_dim_after_maybe_reshape=0,
            group_name="0",
            output_shape=[8, 256],
            out_dtype=torch.bfloat16,
        )
        kwargs.update(override)
        with pytest.raises(exc, match=message):
            distgemm.fused_scaled_matmul_reduce_scatter(**kwargs)
    assert FakeRankGemm.built == []
    # 16-bit operands belong to fused_matmul_reduce_scatter: scales are refused for them.
    with pytest.raises(TypeError, match="scale_a and scale_b given, but A and B are bf16"):
        distgemm.fused_scaled_matmul_reduce_scatter(
            FakeTensor((8, 64)),
            FakeTensor((256, 64)).t(),
            1.0,
            1.0,
            "sum",
            0,
            0,
            "0",
            [8, 256],
            out_dtype=torch.bfloat16,
        )
