"""The ops end to end on a fake torch and a fake RankGemm: what they check, what they build
(the global problem and schedule), what they launch (the tensors' addresses on the current
stream) and what they return."""

import pytest
from fakes import BF16, F16, F32, Device, FakeRankGemm, FakeTensor

import distgemm
from distgemm import _cache, _ops



def test_all_gather_linear_builds_the_global_problem_and_launches_on_the_current_stream(env):
    env(rank=1, world=2)
    x, w = FakeTensor((16, 128)), FakeTensor((64, 128))
    out = distgemm.all_gather_linear(x, w)
    assert out.shape == (32, 64) and out.dtype is BF16
    [inst] = FakeRankGemm.built
    assert inst.args == {
        "device": 0,
        "schedule": "ag-a",
        "auto": True,
        "m": 32,
        "n": 128,
        "k": 128,
        "dtype": "bf16",
        "alpha": 1.0,
        "beta": 0.0,
        "timeout_s": None,
        "allow_shared_gpu": False,
        "rs_partials": None,
        "scale_mode": None,
    }
    assert inst.launches == [(0xABC, x.data_ptr(), w.data_ptr(), None, out.data_ptr())]


def test_repeated_calls_reuse_the_instance_and_new_shapes_build_once(env):
    env()
    w = FakeTensor((64, 128), F16)
    for _ in range(3):
        distgemm.all_gather_linear(FakeTensor((16, 128), F16), w)
    distgemm.all_gather_linear(FakeTensor((8, 128), F16), w)
    assert [i.args["m"] for i in FakeRankGemm.built] == [32, 16]
    assert len(FakeRankGemm.built[0].launches) == 3


def test_out_and_shared_gpu_and_timeout(env, monkeypatch):
    env()
    monkeypatch.setenv("DISTGEMM_ALLOW_SHARED_GPU", "1")
    monkeypatch.setenv("DISTGEMM_TIMEOUT_S", "2.5")
    x, w, out = FakeTensor((2, 4, 64)), FakeTensor((32, 64)), FakeTensor((4, 4, 32))
    assert distgemm.all_gather_linear(x, w, schedule="ag-a-single", out=out) is out
    [inst] = FakeRankGemm.built
    assert inst.args["schedule"] == "ag-a-single" and inst.args["auto"] is False
    assert inst.args["allow_shared_gpu"] is True and inst.args["timeout_s"] == 2.5
    with pytest.raises(ValueError, match=r"out has shape \(4, 4, 16\); the result is \(4, 4, 32\)"):
        distgemm.all_gather_linear(x, w, out=FakeTensor((4, 4, 16)))
    with pytest.raises(TypeError, match="out has dtype torch.float16"):
        distgemm.all_gather_linear(x, w, out=FakeTensor((4, 4, 32), F16))
    with pytest.raises(ValueError, match="the output overlaps x_shard"):
        distgemm.all_gather_linear(x, w, out=FakeTensor((4, 4, 32), ptr=x.data_ptr()))


def test_return_gathered_uses_the_backend_collective(env):
    torch = env(backend="nccl")
    _, gathered = distgemm.all_gather_linear(
        FakeTensor((16, 128)), FakeTensor((64, 128)), return_gathered=True
    )
    assert gathered.shape == (32, 128)
    assert torch.distributed.gathered == [("all_gather_into_tensor", (32, 128), (16, 128))]
    torch = env(backend="gloo")
    distgemm.all_gather_linear(FakeTensor((16, 128)), FakeTensor((64, 128)), return_gathered=True)
    assert torch.distributed.gathered == [("all_gather", 2, (16, 128))]


def test_linear_reduce_scatter(env):
    env(rank=0, world=4)
    x, w = FakeTensor((64, 32)), FakeTensor((256, 32))
    out = distgemm.linear_reduce_scatter(x, w, schedule="rs-a")
    assert out.shape == (16, 256)
    [inst] = FakeRankGemm.built
    assert (
        inst.args["schedule"],
        inst.args["auto"],
        inst.args["m"],
        inst.args["n"],
        inst.args["k"],
    ) == ("rs-a", False, 64, 256, 128)
    assert inst.launches == [(0xABC, x.data_ptr(), w.data_ptr(), None, out.data_ptr())]


def test_reduce_scatter_partials_reach_the_build_and_key_the_cache(env):
    env(rank=0, world=4)
    x, w = FakeTensor((64, 32)), FakeTensor((256, 32))
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a")
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a", partials="push")
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a", partials="push")
    distgemm.linear_reduce_scatter(x, w, schedule="rs-a", partials="read")
    # Unset reaches the build as None (the tuning table's choice under Auto, else read).
    assert [i.args["rs_partials"] for i in FakeRankGemm.built] == [None, "push", "read"]
    assert [len(i.launches) for i in FakeRankGemm.built] == [1, 2, 1]
    with pytest.raises(ValueError, match="partials='pull'"):
        distgemm.linear_reduce_scatter(x, w, partials="pull")
    assert len(FakeRankGemm.built) == 3


def test_bad_arguments_name_the_problem(env):
    env()
    x, w = FakeTensor((16, 128)), FakeTensor((64, 128))
    cases = [
        (
            lambda: distgemm.all_gather_linear(FakeTensor((16, 128), F32), w),
            TypeError,
            "x_shard has dtype torch.float32",
        ),
        (
            lambda: distgemm.all_gather_linear(x, FakeTensor((64, 128), F16)),
            TypeError,
            "x_shard is bf16 but weight is f16",
        ),
        (
            lambda: distgemm.all_gather_linear(x, FakeTensor((128, 64)).t()),
            ValueError,
            "weight is not contiguous",
        ),
        (
            lambda: distgemm.all_gather_linear(x, FakeTensor((64, 128), device=Device("cuda", 1))),
            ValueError,
            "weight is on cuda:1",
        ),
        (
            lambda: distgemm.all_gather_linear(x, FakeTensor((60, 128))),
            ValueError,
            "N/TP=60 is not a multiple of 8",
        ),
        (lambda: distgemm.all_gather_linear(x, w, schedule="rs-a"), ValueError, "schedule='rs-a'"),
        (
            lambda: distgemm.linear_reduce_scatter(FakeTensor((15, 64)), FakeTensor((64, 64))),
            ValueError,
            "x.shape.0.=15",
        ),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()
    assert FakeRankGemm.built == []


def test_not_hopper_and_not_initialized(env):
    env(capability=(8, 0))
    with pytest.raises(
        RuntimeError,
        match="NVIDIA A100 .compute capability 8.0.; distgemm's kernels need a Hopper GPU",
    ):
        distgemm.all_gather_linear(FakeTensor((16, 128)), FakeTensor((64, 128)))
    env(initialized=False)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        distgemm.linear_reduce_scatter(FakeTensor((16, 128)), FakeTensor((64, 128)))


def test_fused_all_gather_matmul_matches_torchs_signature_and_results(env):
    torch = env(backend="nccl")
    a = FakeTensor((16, 128))
    w1, w2 = FakeTensor((64, 128)), FakeTensor((32, 128))
    gathered, outs = distgemm.fused_all_gather_matmul(a, [w1.t(), w2.t()], 0, "0")
    assert gathered.shape == (32, 128)
    assert [o.shape for o in outs] == [(32, 64), (32, 32)]
    # W.t() is distgemm's B layout already: the weights' own addresses are launched.
    assert [i.launches[0][2] for i in FakeRankGemm.built] == [w1.data_ptr(), w2.data_ptr()]
    none, [out] = distgemm.fused_all_gather_matmul(a, [w1.t()], -2, "0", return_A=False)
    assert none is None and out.shape == (32, 64)
    assert len(torch.distributed.gathered) == 1
    with pytest.raises(ValueError, match="gather_dim=1: distgemm supports gather_dim=0 only"):
        distgemm.fused_all_gather_matmul(a, [w1.t()], 1, "0")
    with pytest.raises(ValueError, match="group_name='tp'"):
        distgemm.fused_all_gather_matmul(a, [w1.t()], 0, "tp")
    with pytest.raises(ValueError, match="Bs must be a non-empty list"):
        distgemm.fused_all_gather_matmul(a, [], 0, "0")


def test_a_row_major_b_is_copied_with_a_warning(env):
    env()
    a, b = FakeTensor((16, 128)), FakeTensor((128, 64))  # K x N, row-major
    with pytest.warns(UserWarning, match="Bs.0. is not the transpose of a contiguous"):
        _, [out] = distgemm.fused_all_gather_matmul(a, [b], 0, "0", return_A=False)
    assert out.shape == (32, 64)
    assert FakeRankGemm.built[0].launches[0][2] != b.data_ptr()


def test_fused_matmul_reduce_scatter(env):
    env(world=2)
    a, w = FakeTensor((2, 8, 64)), FakeTensor((256, 64))
    out = distgemm.fused_matmul_reduce_scatter(a, w.t(), "sum", 0, "0")
    assert out.shape == (1, 8, 256)
    avg = distgemm.fused_matmul_reduce_scatter(a, w.t(), "avg", 0, "0")
    assert avg.shape == (1, 8, 256)
    assert [i.args["alpha"] for i in FakeRankGemm.built] == [1.0, 0.5]
    with pytest.raises(ValueError, match="reduce_op='max'"):
        distgemm.fused_matmul_reduce_scatter(a, w.t(), "max", 0, "0")
    with pytest.raises(ValueError, match="scatter_dim=2"):
        distgemm.fused_matmul_reduce_scatter(a, w.t(), "sum", 2, "0")


def test_synchronize_and_clear_cache(env, monkeypatch):
    env()
    distgemm.all_gather_linear(FakeTensor((16, 128)), FakeTensor((64, 128)))
    distgemm.synchronize()
    [inst] = FakeRankGemm.built
    monkeypatch.setattr(_cache, "CACHE", _ops.CACHE)
    distgemm.clear_cache()
    assert inst.closed


def test_autograd_and_graph_capture_are_refused(env):
    env()
    x, w = FakeTensor((16, 128)), FakeTensor((64, 128))
    w.requires_grad = True
    with pytest.raises(
        RuntimeError, match="weight requires grad, but distgemm's ops have no backward"
    ):
        distgemm.all_gather_linear(x, w)
    env(grad_enabled=False)  # under torch.no_grad(): fine
    assert distgemm.all_gather_linear(x, w).shape == (32, 64)
    env(capturing=True)
    with pytest.raises(RuntimeError, match="cannot be captured into a CUDA graph"):
        distgemm.linear_reduce_scatter(FakeTensor((16, 128)), FakeTensor((64, 128)))
    assert FakeRankGemm.built == []
