//! `RankGemm`: one rank's tensor-parallel GEMM, built collectively and launched on a caller's
//! stream with raw device addresses.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distgemm::cuda::{DistGemmError as DistGemmErrorKind, RankArgs, RankGemm, Rendezvous};
use distgemm::dtype::Dtype;
use distgemm::fp8::ScaleMode;
use distgemm::problem::Problem;
use distgemm::runtime::{Gpu, Module, RawStream};
use distgemm::schedule::{BufferKind, RsPartials, ScheduleKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::rendezvous::PyRendezvous;
use crate::{DistGemmError, guard, to_py_err};

/// The kernels' module of each GPU (by ordinal), loaded once per process and shared by every
/// instance: loading compiles the PTX, which every new token count's build would pay again.
static MODULES: Mutex<Vec<(usize, Arc<Module>)>> = Mutex::new(Vec::new());

/// The loaded kernels of `gpu` (loading them on first use).
fn module_of(gpu: &Gpu) -> distgemm::runtime::Result<Arc<Module>> {
    let mut modules = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, module)) = modules.iter().find(|(o, _)| *o == gpu.ordinal()) {
        return Ok(Arc::clone(module));
    }
    let module = Module::load(gpu)?;
    modules.push((gpu.ordinal(), Arc::clone(&module)));
    Ok(module)
}

/// One rank of a distgemm GEMM in a group of processes (one process per GPU).
///
/// Private to the package: `distgemm._ops` builds and caches these, checks the tensors and
/// passes their addresses. Building and `close()` are collective: every rank of the group
/// calls them, in the same order.
#[pyclass(name = "RankGemm", module = "distgemm._distgemm")]
pub struct PyRankGemm {
    /// `None` after `close()`.
    inner: Option<RankGemm>,
    rank: usize,
    tp: usize,
    /// An FP8 instance's tensor-wise scales `(sa, sb)` as last set; `None` for bf16/f16 and
    /// for row-wise FP8.
    fp8_scales: Option<(f32, f32)>,
    /// An FP8 instance's scale mode; `None` for bf16/f16.
    scale_mode: Option<ScaleMode>,
}

fn parse_schedule(name: &str) -> PyResult<ScheduleKind> {
    ScheduleKind::ALL
        .into_iter()
        .find(|k| k.cli_name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.cli_name()).collect();
            PyValueError::new_err(format!(
                "unknown schedule {name:?}; known: {}",
                known.join(", ")
            ))
        })
}

fn parse_partials(name: &str) -> PyResult<RsPartials> {
    [RsPartials::Read, RsPartials::Push]
        .into_iter()
        .find(|p| p.cli_name() == name)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown rs_partials {name:?}; known: read, push (how a reduce-scatter stage gets \
                 its neighbour's partial sum)"
            ))
        })
}

/// The problem's output type and whether A and B are e4m3: `"bf16"`/`"f16"` are 16-bit
/// GEMMs, `"e4m3"` is A and B in e4m3 with bf16 C and D (the only FP8 output the kernels write).
fn parse_dtype(name: &str) -> PyResult<(Dtype, bool)> {
    if name == "e4m3" {
        return Ok((Dtype::Bf16, true));
    }
    Dtype::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .map(|d| (d, false))
        .ok_or_else(|| {
            PyValueError::new_err(format!("unknown dtype {name:?}; known: bf16, f16, e4m3"))
        })
}

/// The FP8 scale mode of a problem of dtype `e4m3` (`fp8`): `"tensor"` (the default) or
/// `"row"`; bf16/f16 take none.
fn parse_scale_mode(fp8: bool, name: Option<&str>) -> PyResult<Option<ScaleMode>> {
    match (fp8, name) {
        (false, None) => Ok(None),
        (false, Some(name)) => Err(PyValueError::new_err(format!(
            "scale_mode={name:?} applies to dtype \"e4m3\" only"
        ))),
        (true, None) => Ok(Some(ScaleMode::Tensorwise)),
        (true, Some(name)) => ScaleMode::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .map(Some)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "unknown scale_mode {name:?}; known: tensor (one scale per operand), row \
                     (one per row of A and of B)"
                ))
            }),
    }
}

fn parse_buffer(name: &str) -> PyResult<BufferKind> {
    match name {
        "A" => Ok(BufferKind::A),
        "B" => Ok(BufferKind::B),
        "C" => Ok(BufferKind::C),
        "D" => Ok(BufferKind::D),
        _ => Err(PyValueError::new_err(format!(
            "unknown operand {name:?}; known: A, B, C, D"
        ))),
    }
}

impl PyRankGemm {
    fn live(&mut self) -> PyResult<&mut RankGemm> {
        self.inner
            .as_mut()
            .ok_or_else(|| DistGemmError::new_err("this RankGemm was closed"))
    }
}

#[pymethods]
impl PyRankGemm {
    /// Builds this rank's GEMM of the GLOBAL problem `D = alpha·A·Bᵀ + beta·C` (M×N×K) on CUDA
    /// device `device`, exchanging handles through `rendezvous` (an object with `rank`,
    /// `world_size` and `all_gather(bytes) -> list[bytes]`). `auto=True` lets distgemm pick
    /// the pipelined or single-stage schedule of `schedule`'s family. `dtype` is `"bf16"`,
    /// `"f16"` or `"e4m3"` (A and B e4m3, C and D bf16). An e4m3 problem's `scale_mode` is
    /// `"tensor"` (the default), which needs `fp8_scales=(sa, sb)`:
    /// `D = alpha·(sa·A)·(sb·B)ᵀ + beta·C` (change them later with `set_fp8_scales`), or
    /// `"row"`, which takes no `fp8_scales`: every `launch` passes the device addresses of the
    /// M and N f32 scales of the global A's and B's rows (`a_scales`, `b_scales`),
    /// `D[i, j] = alpha·sa[i]·sb[j]·(A·Bᵀ)[i, j] + beta·C[i, j]`. Collective; the GIL is
    /// released except while the rendezvous runs.
    #[new]
    #[pyo3(signature = (rendezvous, device, schedule, auto, m, n, k, dtype, alpha=1.0, beta=0.0, timeout_s=None, allow_shared_gpu=false, rs_partials=None, fp8_scales=None, scale_mode=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rendezvous: &Bound<'_, PyAny>,
        device: usize,
        schedule: &str,
        auto: bool,
        m: usize,
        n: usize,
        k: usize,
        dtype: &str,
        alpha: f32,
        beta: f32,
        timeout_s: Option<f64>,
        allow_shared_gpu: bool,
        rs_partials: Option<&str>,
        fp8_scales: Option<(f32, f32)>,
        scale_mode: Option<&str>,
    ) -> PyResult<Self> {
        guard("build", || {
            let kind = parse_schedule(schedule)?;
            let partials = rs_partials.map(parse_partials).transpose()?;
            let (dtype, fp8) = parse_dtype(dtype)?;
            let scale_mode = parse_scale_mode(fp8, scale_mode)?;
            let timeout = timeout_s
                .map(|s| {
                    Duration::try_from_secs_f64(s).map_err(|_| {
                        PyValueError::new_err(format!(
                            "timeout_s={s} is not a finite, non-negative number of seconds"
                        ))
                    })
                })
                .transpose()?;
            let rdv = PyRendezvous::new(rendezvous)?;
            let (rank, tp) = (rdv.rank(), rdv.world_size());
            let rdv: Arc<dyn Rendezvous> = Arc::new(rdv);
            let mut problem = Problem::new(m, n, k)
                .with_dtype(dtype)
                .with_scalars(alpha, beta);
            if let Some(mode) = scale_mode {
                problem = problem.with_fp8(mode);
            }
            let built = py.detach(move || {
                let mut builder = RankGemm::builder().problem(problem);
                // Unset: an Auto schedule runs a tuning table's measured choice, else read.
                if let Some(partials) = partials {
                    builder = builder.rs_partials(partials);
                }
                // Checked by the builder: required for tensor-wise e4m3, refused for row-wise
                // e4m3 and bf16/f16, in range.
                if let Some((sa, sb)) = fp8_scales {
                    builder = builder.fp8_scales(sa, sb);
                }
                builder = if auto {
                    builder.auto_schedule(kind)
                } else {
                    builder.schedule(kind)
                };
                if let Some(t) = timeout {
                    builder = builder.timeout(t);
                }
                // A rank whose GPU cannot be opened still joins the collective build (which
                // then fails on every rank, instead of leaving the peers waiting), and
                // reports why its GPU failed.
                let gpu = Gpu::open(device);
                let gpu_error = match gpu {
                    Ok(gpu) => {
                        // On a load error the builder loads again and fails, collectively.
                        if let Ok(module) = module_of(&gpu) {
                            builder = builder.module(module);
                        }
                        builder = builder.gpu(gpu);
                        None
                    }
                    Err(e) => Some(e),
                };
                let built = builder.allow_shared_gpu(allow_shared_gpu).build(rdv);
                match (built, gpu_error) {
                    (Err(DistGemmErrorKind::Missing(_)), Some(e)) => Err(e.into()),
                    (built, _) => built,
                }
            });
            let inner = built.map_err(to_py_err)?;
            Ok(PyRankGemm {
                inner: Some(inner),
                rank,
                tp,
                fp8_scales,
                scale_mode,
            })
        })
    }

    /// This process's rank in the group.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The group's size (TP).
    #[getter]
    fn tp(&self) -> usize {
        self.tp
    }

    /// The schedule that runs (its command-line name, e.g. `ag-a` or `rs-a-single`).
    #[getter]
    fn schedule(&mut self) -> PyResult<&'static str> {
        Ok(self.live()?.schedule().cli_name())
    }

    /// An FP8 instance's tensor-wise scales `(sa, sb)` (as built or last set; the f32 values
    /// the kernels use), `None` for bf16/f16 and row-wise FP8.
    #[getter]
    fn fp8_scales(&self) -> Option<(f32, f32)> {
        self.fp8_scales
    }

    /// An FP8 instance's scale mode, `"tensor"` or `"row"`; `None` for bf16/f16.
    #[getter]
    fn scale_mode(&self) -> Option<&'static str> {
        self.scale_mode.map(ScaleMode::name)
    }

    /// Sets an FP8 instance's tensor-wise scales for its launches from now on (every rank
    /// should set the same): the next launch rewrites the stage GEMMs' alpha in stream order,
    /// without a rebuild. Scales that are not finite or below 2^-63, or scales for a bf16/f16
    /// or row-wise instance, raise `ValueError` and change nothing.
    fn set_fp8_scales(&mut self, sa: f32, sb: f32) -> PyResult<()> {
        guard("set_fp8_scales", || {
            self.live()?.set_fp8_scales(sa, sb).map_err(to_py_err)?;
            self.fp8_scales = Some((sa, sb));
            Ok(())
        })
    }

    /// `(rows, cols)` of this rank's packed row-major shard of operand `which` ("A".."D").
    fn shard_shape(&mut self, which: &str) -> PyResult<(usize, usize)> {
        let kind = parse_buffer(which)?;
        guard("shard_shape", || Ok(self.live()?.shard_shape(kind)))
    }

    /// The distgemm-owned, peer-mapped input buffer a rank may write its shard into
    /// (zero-copy path), as `(operand, address, bytes)`, or `None` for this schedule.
    fn input_slot(&mut self) -> PyResult<Option<(&'static str, u64, usize)>> {
        guard("input_slot", || {
            Ok(self
                .live()?
                .input_slot()
                .map(|s| (s.kind.name(), s.ptr, s.bytes)))
        })
    }

    /// Enqueues one run on the CUDA stream `stream` (a `cudaStream_t` as int), reading A, B
    /// (and C when given) and writing D at the given device addresses. Returns at once.
    /// A row-wise FP8 instance also reads `a_scales` (M f32, one per row of the global A) and
    /// `b_scales` (N f32, one per row of the global B), every rank the full vectors, of which
    /// each stage GEMM reads the rows it multiplies; they are 0 (none) for every other
    /// instance.
    #[pyo3(signature = (stream, a, b, c, d, a_scales=0, b_scales=0))]
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        py: Python<'_>,
        stream: u64,
        a: u64,
        b: u64,
        c: Option<u64>,
        d: u64,
        a_scales: u64,
        b_scales: u64,
    ) -> PyResult<()> {
        guard("launch", || {
            let dg = self.live()?;
            let args = RankArgs {
                a,
                b,
                c: c.unwrap_or(0),
                d,
                a_scales,
                b_scales,
            };
            // SAFETY: this module is private to the `distgemm` package, whose `_ops` layer
            // calls it only with `torch.cuda.current_stream(device).cuda_stream` — a stream of
            // this rank's GPU in its primary context, which PyTorch uses too, live during
            // this call (RankGemm keeps no stream handle after it returns: later launches
            // order themselves after this one with an event) — and with the `data_ptr()` of
            // torch tensors it has
            // checked to be on this rank's GPU, contiguous, 16-byte aligned and exactly the
            // shard shapes (`shard_shape`), with an output that does not overlap the inputs;
            // for a row-wise instance, `a_scales` and `b_scales` the `data_ptr()` of contiguous
            // float32 tensors of M and N elements on this rank's GPU (the caller's own, or
            // temporaries `_ops` fills on `stream` before this launch).
            // The tensors come from PyTorch's caching allocator, which hands their memory out
            // again only to work ordered behind `stream` (the stream they are used on), so
            // they stay alive and unwritten by other streams until `stream` has passed this
            // launch; distgemm's end-of-run release covers the peers' reads of this rank's
            // shards. Every rank launches once per op call, the op being collective.
            //
            // The GIL is released: a launch with new addresses may wait while the driver
            // stages the re-encoded tensor maps (pageable host memory).
            py.detach(move || unsafe { dg.launch_raw(RawStream::from_raw(stream), args) })
                .map_err(to_py_err)
        })
    }

    /// Raises the error of a finished launch, if any (non-blocking).
    fn check(&mut self) -> PyResult<()> {
        guard("check", || self.live()?.check_errors().map_err(to_py_err))
    }

    /// Waits for this rank's last launch (GIL released), then raises its error, if any.
    fn synchronize(&mut self, py: Python<'_>) -> PyResult<()> {
        guard("synchronize", || {
            let dg = self.live()?;
            py.detach(move || dg.synchronize()).map_err(to_py_err)
        })
    }

    /// Releases the instance. With `collective=True` (the default) this is distgemm's
    /// collective teardown: every rank closes its instances in the same order. With
    /// `collective=False` the instance is abandoned without a rendezvous — its GPU memory,
    /// mappings and handles stay until the process exits — which is what interpreter exit
    /// does when other ranks may never arrive. Idempotent; the instance cannot be used
    /// afterwards.
    #[pyo3(signature = (collective=true))]
    fn close(&mut self, py: Python<'_>, collective: bool) -> PyResult<()> {
        guard("close", || {
            if let Some(dg) = self.inner.take() {
                if collective {
                    py.detach(move || dg.close()).map_err(to_py_err)?;
                } else {
                    std::mem::forget(dg);
                }
            }
            Ok(())
        })
    }

    /// Whether `close()` has run.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    fn __repr__(&mut self) -> String {
        let schedule = self
            .inner
            .as_ref()
            .map_or("closed", |dg| dg.schedule().cli_name());
        format!(
            "RankGemm(rank={}, tp={}, schedule={schedule})",
            self.rank, self.tp
        )
    }
}

impl Drop for PyRankGemm {
    /// An instance dropped without `close()` (garbage-collected) is abandoned, not torn down:
    /// the teardown is collective, and a garbage collector runs at a different point on every
    /// rank. Its GPU memory, mappings and handles stay until the process exits. The package's
    /// cache always closes its instances explicitly.
    fn drop(&mut self) {
        if let Some(dg) = self.inner.take() {
            std::mem::forget(dg);
        }
    }
}
