"""The package imports with no GPU and no torch, and says clearly what a call needs."""

import subprocess
import sys
import textwrap

import pytest

import distgemm


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_public_names():
    for name in (
        "all_gather_linear",
        "linear_reduce_scatter",
        "fused_all_gather_matmul",
        "fused_all_gather_scaled_matmul",
        "fused_matmul_reduce_scatter",
        "fused_scaled_matmul_reduce_scatter",
        "clear_cache",
        "synchronize",
        "DistGemmError",
    ):
        assert name in distgemm.__all__
        assert callable(getattr(distgemm, name))
    assert distgemm.__version__.count(".") == 2


def test_error_class_is_a_runtime_error():
    assert issubclass(distgemm.DistGemmError, RuntimeError)
    assert distgemm.DistGemmError.__module__ == "distgemm"
    try:
        raise distgemm.DistGemmError("peer timed out")
    except RuntimeError as e:
        assert str(e) == "peer timed out"


def test_import_does_not_import_torch():
    r = run_python(
        """
        import sys
        import distgemm
        print("torch" in sys.modules)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_call_without_torch_raises_import_error():
    # Block torch even where it is installed: a None entry makes `import torch` fail.
    r = run_python(
        """
        import sys
        sys.modules["torch"] = None
        import distgemm
        for op, args in ((distgemm.all_gather_linear, (1, 2)), (distgemm.linear_reduce_scatter, (1, 2)),
                         (distgemm.fused_all_gather_matmul, (1, [2], 0, "0")),
                         (distgemm.fused_matmul_reduce_scatter, (1, 2, "sum", 0, "0"))):
            try:
                op(*args)
            except ImportError as e:
                assert "PyTorch" in str(e), e
            else:
                raise SystemExit(f"{op.__name__} did not raise")
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_building_without_a_gpu_raises_distgemm_error():
    """The extension's constructor, reached on a machine without a GPU (CI), raises
    DistGemmError with a message instead of crashing the interpreter."""
    from distgemm._distgemm import RankGemm

    from distgemm._rendezvous import GroupRendezvous

    def gather(out, obj):
        out[0] = obj

    with pytest.raises(distgemm.DistGemmError) as e:
        RankGemm(GroupRendezvous(0, 1, gather), 0, "ag-a", False, 64, 64, 64, "bf16")
    assert str(e.value)


def test_extension_rejects_unknown_names():
    from distgemm._distgemm import RankGemm

    from distgemm._rendezvous import GroupRendezvous

    rdv = GroupRendezvous(0, 1, lambda out, obj: None)
    for kwargs, word in (
        ({"schedule": "ag-z", "dtype": "bf16"}, "schedule"),
        ({"schedule": "ag-a", "dtype": "f32"}, "dtype"),
        ({"schedule": "rs-a", "dtype": "bf16", "rs_partials": "pull"}, "rs_partials"),
    ):
        extra = {k: v for k, v in kwargs.items() if k == "rs_partials"}
        try:
            RankGemm(rdv, 0, kwargs["schedule"], False, 64, 64, 64, kwargs["dtype"], **extra)
        except ValueError as e:
            assert word in str(e)
        else:
            raise AssertionError(f"{kwargs} accepted")


def test_the_wheel_carries_the_kernels():
    """The extension embeds the kernels' PTX (a wheel built without it could only run with
    DISTGEMM_PTX set, which the GPU machines' users will not know to do)."""
    from distgemm import _distgemm

    assert _distgemm.embedded_ptx_bytes > 100_000


def test_extension_checks_fp8_scales_before_any_gpu():
    """FP8 scales reach the extension's builder: missing for e4m3, given for bf16, or out of
    range is a ValueError (raised on every rank, after the build's collective failure
    report); valid ones get as far as the GPU (none in CI: DistGemmError)."""
    from distgemm._distgemm import RankGemm

    from distgemm._rendezvous import GroupRendezvous

    def gather(out, obj):
        out[0] = obj

    for dtype, scales, says in (
        ("e4m3", None, "give the tensor-wise scales"),
        ("bf16", (1.0, 1.0), "is not FP8: it takes no scales"),
        ("e4m3", (float("nan"), 1.0), "the tensor-wise scale of A is NaN"),
    ):
        rdv = GroupRendezvous(0, 1, gather)
        with pytest.raises(ValueError, match=says):
            RankGemm(rdv, 0, "ag-a", False, 64, 64, 64, dtype, fp8_scales=scales)
    with pytest.raises(distgemm.DistGemmError):
        rdv = GroupRendezvous(0, 1, gather)
        RankGemm(rdv, 0, "ag-a", False, 64, 64, 64, "e4m3", fp8_scales=(0.5, 2.0))
    assert callable(RankGemm.set_fp8_scales)
