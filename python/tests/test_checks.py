"""The pure argument checks: the exception type and the argument each error names."""

import pytest
from fakes import F16, F32, Device, FakeTensor

from distgemm import _checks


def test_schedules_per_op():
    assert _checks.resolve_schedule("all_gather", "auto") == ("ag-a", True)
    assert _checks.resolve_schedule("all_gather", "ag-a-single") == ("ag-a-single", False)
    assert _checks.resolve_schedule("reduce_scatter", "auto") == ("rs-a", True)
    assert _checks.resolve_schedule("reduce_scatter", "rs-a") == ("rs-a", False)
    with pytest.raises(ValueError, match="shard the operands differently"):
        _checks.resolve_schedule("all_gather", "ag-b")
    with pytest.raises(ValueError, match="schedule='rs-a'"):
        _checks.resolve_schedule("all_gather", "rs-a")
    with pytest.raises(TypeError, match="schedule must be a str"):
        _checks.resolve_schedule("reduce_scatter", 3)


def test_tensor_checks_name_the_argument():
    assert _checks.check_tensor("x", FakeTensor((4, 8)), 0) == "bf16"
    assert _checks.check_tensor("x", FakeTensor((4, 8), F16), 0) == "f16"
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        _checks.check_tensor("x", FakeTensor((4, 8), F32), 0)
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        _checks.check_tensor("w", [1, 2], 0)
    with pytest.raises(ValueError, match="x is on cpu"):
        _checks.check_tensor("x", FakeTensor((4, 8), device=Device("cpu", None)), 0)
    with pytest.raises(
        ValueError, match="x is on cuda:1, but this rank's current CUDA device is cuda:0"
    ):
        _checks.check_tensor("x", FakeTensor((4, 8), device=Device("cuda", 1)), 0)
    with pytest.raises(ValueError, match="w is not contiguous"):
        _checks.check_tensor("w", FakeTensor((8, 4)).t(), 0)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        _checks.check_tensor("x", FakeTensor((4, 8), ptr=(1 << 30) + 2), 0)


def test_same_dtype():
    _checks.same_dtype(("x", "w"), ("bf16", "bf16"))
    with pytest.raises(TypeError, match="x is bf16 but w is f16"):
        _checks.same_dtype(("x", "w"), ("bf16", "f16"))


def test_all_gather_shapes():
    s = _checks.all_gather_shapes((64, 128), (256, 128), 2)
    assert s == _checks.Shapes(m=128, n=512, k=128, out=(128, 256))
    # Leading dimensions flatten into tokens; the gather is along dim 0.
    s = _checks.all_gather_shapes((2, 3, 128), (16, 128), 4)
    assert (s.m, s.n, s.k, s.out) == (24, 64, 128, (8, 3, 16))
    with pytest.raises(
        ValueError, match=r"x_shard.shape\[-1\]=128 must equal weight.shape\[1\]=64"
    ):
        _checks.all_gather_shapes((4, 128), (8, 64), 2)
    with pytest.raises(ValueError, match="A_shard must have at least 2 dimensions"):
        _checks.all_gather_shapes((128,), (8, 128), 2, ("A_shard", "Bs[0]"))
    with pytest.raises(ValueError, match="Bs.0. must be a matrix"):
        _checks.all_gather_shapes((4, 128), (1, 8, 128), 2, ("A_shard", "Bs[0]"))


def test_reduce_scatter_shapes():
    s = _checks.reduce_scatter_shapes((64, 256), (512, 256), 2)
    assert s == _checks.Shapes(m=64, n=512, k=512, out=(32, 512))
    s = _checks.reduce_scatter_shapes((4, 3, 64), (32, 64), 2)
    assert (s.m, s.n, s.k, s.out) == (12, 32, 128, (2, 3, 32))
    with pytest.raises(ValueError, match=r"x.shape\[0\]=5 is not divisible by the group size 2"):
        _checks.reduce_scatter_shapes((5, 64), (32, 64), 2)
    with pytest.raises(ValueError, match="this rank's K/TP"):
        _checks.reduce_scatter_shapes((4, 64), (32, 32), 2)


@pytest.mark.parametrize(
    "schedule,m,n,k,tp,message",
    [
        ("ag-a", 64, 64, 64, 9, "TP from 1 to 8"),
        ("ag-a", 64, 65, 64, 2, "N=65 is not divisible by the group size 2"),
        ("ag-a", 64, 64, 60, 2, "K=60 is not a multiple of 8"),
        ("ag-a", 64, 24, 64, 2, "N/TP=12 is not a multiple of 8"),
        ("ag-a-single", 0, 64, 64, 2, "M .tokens.=0"),
        ("rs-a", 63, 64, 64, 2, "M .tokens.=63 is not divisible"),
        ("rs-a", 64, 64, 72, 2, "K/TP=36 is not a multiple of 8"),
        ("rs-a-single", 64, 60, 64, 2, "N=60 is not a multiple of 8"),
        ("rs-a", 64, 64, 1 << 31, 2, "too large"),
    ],
)
def test_problem_rules(schedule, m, n, k, tp, message):
    with pytest.raises(ValueError, match=message):
        _checks.check_problem(schedule, m, n, k, tp)


def test_problem_rules_accept_the_presets():
    # Llama-3 70B/405B fc1 (fused gate+up) and fc2 at TP 2 and 8, ragged token counts.
    for n, k in ((57344, 8192), (8192, 28672), (106496, 16384), (16384, 53248)):
        for tp in (2, 8):
            _checks.check_problem("ag-a", tp * 3, n, k, tp)
            _checks.check_problem("rs-a-single", tp * 7, n, k, tp)


def test_dims_and_overlap():
    assert _checks.normalize_dim("gather_dim", 0, 2) == 0
    assert _checks.normalize_dim("gather_dim", -3, 3) == 0
    with pytest.raises(ValueError, match="gather_dim=1: distgemm supports gather_dim=0 only"):
        _checks.normalize_dim("gather_dim", 1, 2)
    with pytest.raises(ValueError, match="out of range"):
        _checks.normalize_dim("scatter_dim", 2, 2)
    with pytest.raises(TypeError, match="scatter_dim must be an int"):
        _checks.normalize_dim("scatter_dim", True, 2)
    assert _checks.overlaps((0, 16), (8, 16))
    assert not _checks.overlaps((0, 16), (16, 16))
    assert not _checks.overlaps((0, 0), (0, 16))
