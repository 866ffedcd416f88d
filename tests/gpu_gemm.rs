//! The Hopper GEMM stage kernel against cuBLASLt (same process, same inputs) and against the
//! float64 reference on every element (computed on the GPU, `reference::gpu::products`), over
//! the shapes and views the schedules need and over shapes drawn at random (`random_cases`),
//! where the rule picks the configuration.
//!
//! Inputs are N(0, 1) (never zeros); D is poisoned with NaN before every run, and every element
//! of D's buffer, including the padding between rows of strided views and the elements before
//! a view that starts inside its buffer (which must stay NaN), is checked.
//! Error bound, with `u` the unit roundoff of the element type (bf16 2⁻⁸, f16 2⁻¹¹):
//! `|ours − ref| ≤ 2u·(|ref| + 10⁻²·√K) + 8·K·2⁻²⁴` per element. The first term is one
//! rounding of the output on each side; the second the difference of two f32 accumulations
//! of the same K products in different orders (tiles, split-K, cuBLAS's own): with N(0, 1)
//! inputs the partial sums grow to ~√K and each of the K additions rounds by up to
//! 2⁻²⁴ of its sum, a random walk of standard deviation ~0.6·K·2⁻²⁴ (measured: 3.4·10⁻³ at
//! K = 14336 against cuBLASLt, half this term). A wrong or missing k-block moves an element
//! by ~8 (64 products), far outside it. Against the float64 reference, the library's bound
//! (`reference::ErrorBound::new`, one rounding to the element type): relative to
//! `|alpha|·Σ|a·b| + |beta·c|`, so it holds whatever order the f32 sums take.
use distgemm::baseline::{CublasLtElement, CublasLtGemm, TnGemmShape};
use distgemm::dtype::{Dtype, Element};
use distgemm::gemm::{GemmArgs, GemmKernel, GemmLaunchError, GemmVariant, MatrixView, VARIANTS};
use distgemm::problem::Problem;
use distgemm::reference::gpu::{Operand, ReferenceOperand, products};
use distgemm::reference::{Products, check_products};
use distgemm::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module, enable_peer_access_between,
};
use distgemm_tests::gpu::{self, visible_line};
use distgemm_tests::shapes::log_uniform;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::sync::Arc;

/// One GEMM to check: shape, extra elements of row padding per operand, where the operands
/// start in their buffers, alpha and beta.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    m: u64,
    n: u64,
    k: u64,
    pad: u64,
    /// Elements (a multiple of 8: 16 bytes) before A, B, C and D in their buffers, NaN there
    /// (a read before a view's start poisons D; a write there is caught).
    offset: u64,
    alpha: f32,
    beta: f32,
}

const fn case(name: &'static str, m: u64, n: u64, k: u64) -> Case {
    Case {
        name,
        m,
        n,
        k,
        pad: 0,
        offset: 0,
        alpha: 1.0,
        beta: 0.0,
    }
}

fn random_matrix<T: Element>(rng: &mut SmallRng, len: u64) -> Vec<T> {
    (0..len)
        .map(|_| T::from_f32(rng.sample::<f32, _>(StandardNormal)))
        .collect()
}

/// `data` uploaded `offset` elements into a new buffer whose first `offset` elements are NaN.
fn upload_at<T: Element + DeviceCopy>(
    gpu: &Gpu,
    stream: &CudaStream,
    data: &[T],
    offset: u64,
) -> DeviceBuffer<T> {
    let mut host = vec![T::nan(); offset as usize];
    host.extend_from_slice(data);
    DeviceBuffer::from_host(gpu, stream, &host).expect("upload operand")
}

/// The `m × n` matrix of a buffer that holds it `offset` elements in, `ld` elements a row.
fn packed<T: Copy>(buffer: &[T], offset: u64, m: u64, n: u64, ld: u64) -> Vec<T> {
    (0..m)
        .flat_map(|row| {
            let start = (offset + row * ld) as usize;
            buffer[start..start + n as usize].iter().copied()
        })
        .collect()
}

/// Runs of a split-K configuration after the first, each compared bit for bit with it.
const SPLIT_K_REPEATS: usize = 5;

/// Grid sizes a split-K configuration also runs with (each checked on every element),
/// largest first since a cap only lowers the grid: other stream-K partitions of the same
/// tiles.
const SPLIT_K_GRID_CAPS: [u32; 3] = [37, 5, 1];

/// One case set up for checking: its operands on the GPU (C also in another GPU's memory
/// where asked), cuBLASLt's D for them, and the float64 sums of every element — all built
/// once, then each configuration is checked against them ([`CaseRun::check`]).
struct CaseRun<T: Element + DeviceCopy> {
    case: Case,
    /// Leading dimensions of A, B and of C and D.
    lda: u64,
    ldb: u64,
    ldd: u64,
    /// A and B for our kernel, each `case.offset` elements into its buffer.
    a: DeviceBuffer<T>,
    b: DeviceBuffer<T>,
    /// C where our kernel reads it: in another GPU's memory (read over NVLink, as the
    /// reduce-scatter schedules read the left neighbour's partial sums), or the local copy.
    c: Option<DeviceBuffer<T>>,
    /// Our D (`case.offset` elements into the buffer), poisoned with NaN before every run.
    ours: DeviceBuffer<T>,
    /// cuBLASLt's D, dense from the buffer's start (NaN in the padding between rows).
    theirs: Vec<T>,
    /// C packed (`m × n`), for the f64 check; `None` at beta 0.
    c_packed: Option<Vec<T>>,
    /// Each element's `Σ a·b` and `Σ |a·b|` in f64 (computed on the GPU).
    products: Products,
}

impl<T: Element + CublasLtElement + DeviceCopy + ReferenceOperand> CaseRun<T> {
    /// Random N(0, 1) operands for `c` (C in `c_owner`'s memory for our kernel, when given
    /// and beta ≠ 0), cuBLASLt's D and the f64 sums of every element (on `module`'s GPU).
    fn new(c_owner: Option<&Gpu>, module: &Arc<Module>, stream: &Arc<CudaStream>, c: Case) -> Self {
        let gpu = module.gpu();
        let Case {
            m,
            n,
            k,
            pad,
            offset,
            alpha,
            beta,
            ..
        } = c;
        let (lda, ldb, ldd) = (k + pad, k + pad, (n + pad).next_multiple_of(8));
        let mut rng = SmallRng::seed_from_u64(m ^ (n << 20) ^ (k << 40));
        let a_host: Vec<T> = random_matrix(&mut rng, m * lda);
        let b_host: Vec<T> = random_matrix(&mut rng, n * ldb);
        let c_host: Vec<T> = if beta != 0.0 {
            random_matrix(&mut rng, m * ldd)
        } else {
            Vec::new()
        };
        let a = upload_at(gpu, stream, &a_host, offset);
        let b = upload_at(gpu, stream, &b_host, offset);
        let c_local = (beta != 0.0).then(|| upload_at(gpu, stream, &c_host, offset));
        let c_remote = c_owner.filter(|_| beta != 0.0).map(|owner| {
            let owner_stream = owner.new_stream().expect("peer stream");
            let c = upload_at(owner, &owner_stream, &c_host, offset);
            owner.synchronize().expect("peer sync");
            c
        });
        let ours = DeviceBuffer::<T>::alloc(gpu, (offset + m * ldd) as usize).expect("alloc D");
        let mut theirs = DeviceBuffer::<T>::alloc(gpu, (m * ldd) as usize).expect("alloc D ref");
        theirs.fill(stream, T::nan()).expect("poison D ref");
        let shape = TnGemmShape {
            m,
            n,
            k,
            lda,
            ldb,
            ldc: ldd,
            ldd,
        };
        let lt = CublasLtGemm::<T>::new(gpu, stream.clone(), shape).expect("cuBLASLt");
        // cuBLASLt takes whole buffers: dense copies of the operands when ours start later.
        let dense = (offset != 0).then(|| {
            let upload = |data: &[T]| upload_at(gpu, stream, data, 0);
            let c = (beta != 0.0).then(|| upload(&c_host));
            (upload(&a_host), upload(&b_host), c)
        });
        let (lt_a, lt_b, lt_c) = match &dense {
            Some((a, b, c)) => (a, b, c.as_ref()),
            None => (&a, &b, c_local.as_ref()),
        };
        lt.run(lt_a, lt_b, lt_c, &mut theirs, alpha, beta)
            .expect("cuBLASLt run");
        let theirs = theirs.download(stream).expect("download D ref");
        let products = products(
            module,
            stream,
            Operand {
                data: &a_host,
                ld: lda as usize,
            },
            Operand {
                data: &b_host,
                ld: ldb as usize,
            },
            (m as usize, n as usize, k as usize),
        )
        .expect("f64 reference on the GPU");
        let c_packed = (beta != 0.0).then(|| packed(&c_host, 0, m, n, ldd));
        CaseRun {
            case: c,
            lda,
            ldb,
            ldd,
            a,
            b,
            c: c_remote.or(c_local),
            ours,
            theirs,
            c_packed,
            products,
        }
    }

    /// Runs the case on `variant` (the rule's pick for `None`) and checks every element
    /// against cuBLASLt and against the f64 reference; returns the worst errors relative to
    /// the bounds. Split-K configurations also run [`SPLIT_K_REPEATS`] more times
    /// and must give the same bits every time, then run on the smaller grids of
    /// [`SPLIT_K_GRID_CAPS`]. A short tile on more rows than it serves must be refused.
    fn check(
        &mut self,
        variant: Option<&GemmVariant>,
        kernel: &GemmKernel,
        stream: &Arc<CudaStream>,
    ) -> Verdict {
        let Case {
            m,
            n,
            k,
            offset,
            alpha,
            beta,
            ..
        } = self.case;
        let (lda, ldb, ldd) = (self.lda, self.ldb, self.ldd);
        let view = |buffer: &DeviceBuffer<T>, rows: u64, cols: u64, ld: u64| MatrixView {
            ptr: buffer.device_ptr() + offset * std::mem::size_of::<T>() as u64,
            rows,
            cols,
            ld,
        };
        let args = GemmArgs {
            dtype: T::DTYPE,
            a: view(&self.a, m, k, lda),
            b: view(&self.b, n, k, ldb),
            c: self.c.as_ref().map(|c| view(c, m, n, ldd)),
            d: view(&self.ours, m, n, ldd),
            alpha,
            beta,
        };
        if let Some(v) = variant.filter(|v| !serves(v, m)) {
            return refused(kernel.prepare_variant(stream, &args, v).err(), v);
        }
        let mut prepared = match variant {
            Some(v) => kernel.prepare_variant(stream, &args, v),
            None => kernel.prepare(stream, &args),
        }
        .expect("prepare GEMM");
        let name = format!("{} [{}]", self.case.name, prepared.variant().name);
        let u = T::DTYPE.unit_roundoff();
        let s = 1e-2 * (k as f64).sqrt();
        let accumulation = 8.0 * k as f64 * 2f64.powi(-24);
        let bound = |r: f64| 2.0 * u * (r.abs() + s) + accumulation;
        let theirs = &self.theirs;
        // Every element of `ours` (the buffer of D of run `label`) against cuBLASLt; the worst
        // error over the bound.
        let check_all = |ours: &[T], label: &str| {
            let (before, ours) = ours.split_at(offset as usize);
            if let Some(i) = before.iter().position(|x| !x.to_f32().is_nan()) {
                panic!("{name}{label}: element {i} of D's buffer, before D, was written");
            }
            let mut worst: f64 = 0.0;
            for row in 0..m {
                for col in 0..ldd {
                    let i = (row * ldd + col) as usize;
                    let (o, t) = (ours[i].to_f32() as f64, theirs[i].to_f32() as f64);
                    if col >= n {
                        assert!(
                            o.is_nan(),
                            "{name}{label}: padding D[{row}][{col}] was written ({o})"
                        );
                        continue;
                    }
                    let err = (o - t).abs();
                    assert!(
                        err <= bound(t),
                        "{name}{label}: D[{row}][{col}] = {o}, cuBLASLt {t} (|err| {err} > bound {})",
                        bound(t)
                    );
                    worst = worst.max(err / bound(t));
                }
            }
            worst
        };
        // Every element of `ours` against the f64 reference, with the library's bound; the
        // worst error over it.
        let problem = Problem::new(m as usize, n as usize, k as usize)
            .with_dtype(T::DTYPE)
            .with_scalars(alpha, beta);
        let (products, c_packed) = (&self.products, self.c_packed.as_deref());
        let check_f64 = |ours: &[T], label: &str| {
            let d = packed(ours, offset, m, n, ldd);
            let report = check_products(&problem, 1, 1, products, c_packed, &d)
                .unwrap_or_else(|e| panic!("{name}{label}: {e}"));
            let (row, col) = (
                report.worst_index / n as usize,
                report.worst_index % n as usize,
            );
            assert!(
                report.passed(),
                "{name}{label}: {} of {} elements outside the f64 bound; worst D[{row}][{col}] = {} at {:.3e} of the bound",
                report.mismatches,
                report.elements,
                d[report.worst_index].to_f32(),
                report.worst_ratio
            );
            report.worst_ratio
        };
        let check_both = |ours: &[T], label: &str| (check_all(ours, label), check_f64(ours, label));
        let ours = &mut self.ours;
        let mut run = |prepared: &distgemm::gemm::PreparedGemm| {
            ours.fill(stream, T::nan()).expect("poison D");
            // SAFETY: the operands are live buffers of the viewed sizes, read back after the
            // launch.
            unsafe { prepared.launch(stream, false) }.expect("launch GEMM");
            ours.download(stream).expect("download D")
        };
        let first = run(&prepared);
        let (mut worst, mut worst_f64) = check_both(&first, "");
        if prepared.variant().config.split_k {
            // Split-K adds a tile's partial sums in k order, whichever block finishes it, and
            // leaves its counters zero: every run on the same grid gives the same bits.
            for again in 1..=SPLIT_K_REPEATS {
                let same = run(&prepared)
                    .iter()
                    .zip(&first)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{name}: run {again} differs from the first run");
            }
            // Smaller grids cut the tiles elsewhere (stream-K ranges that start and end inside
            // tiles, several pieces per block, or one block for everything).
            for cap in SPLIT_K_GRID_CAPS {
                prepared.cap_grid(cap);
                let (lt, exact) = check_both(&run(&prepared), &format!(" on {cap} blocks"));
                (worst, worst_f64) = (worst.max(lt), worst_f64.max(exact));
            }
        }
        Verdict::Checked {
            variant: prepared.variant().name,
            worst,
            worst_f64,
        }
    }
}

/// What [`CaseRun::check`] found: every element within the bound (the configuration that ran
/// and the worst error over the bound), or the named refusal of a short tile on more rows than
/// it serves.
enum Verdict {
    Checked {
        variant: &'static str,
        worst: f64,
        worst_f64: f64,
    },
    Refused,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Checked {
                variant,
                worst,
                worst_f64,
            } => write!(
                f,
                "ok on {variant} (worst error {worst:.2} of the bound against cuBLASLt, \
                 {worst_f64:.2} against f64)"
            ),
            Verdict::Refused => write!(f, "refused as it should be (more rows than it serves)"),
        }
    }
}

/// Whether `variant` runs problems of `m` rows (a short tile serves at most `a_rows`).
fn serves(variant: &GemmVariant, m: u64) -> bool {
    m <= u64::from(variant.config.max_rows())
}

/// Checks that preparing a short tile on too many rows failed with the named error.
fn refused(err: Option<GemmLaunchError>, variant: &GemmVariant) -> Verdict {
    let err = err.unwrap_or_else(|| panic!("{} accepted more rows than it serves", variant.name));
    assert!(err.to_string().contains("serves at most"), "{err}");
    Verdict::Refused
}

/// Checks every case with the configuration the rule picks (`every_variant == false`) or with
/// every compiled configuration.
fn run_cases(test: &str, dtype: Dtype, cases: &[Case], every_variant: bool) {
    match dtype {
        Dtype::Bf16 => run_cases_of::<half::bf16>(test, cases, every_variant),
        Dtype::F16 => run_cases_of::<half::f16>(test, cases, every_variant),
    }
}

/// [`run_cases`] in element type `T`: each case is set up once ([`CaseRun::new`]) and checked
/// with every configuration asked for.
fn run_cases_of<T: Element + CublasLtElement + DeviceCopy + ReferenceOperand>(
    test: &str,
    cases: &[Case],
    every_variant: bool,
) {
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let module = session.module().expect("load PTX module");
    let kernel = GemmKernel::new(&module).expect("GEMM kernels");
    let stream = session.gpu.new_stream().expect("stream");
    let variants: Vec<Option<&GemmVariant>> = if every_variant {
        VARIANTS.iter().map(Some).collect()
    } else {
        vec![None]
    };
    for &c in cases {
        let mut run = CaseRun::<T>::new(None, &module, &stream, c);
        for &v in &variants {
            let verdict = run.check(v, &kernel, &stream);
            visible_line(&format!(
                "{test}: {} {}x{}x{} pad {} offset {} alpha {} beta {} {} [{}]: {}",
                c.name,
                c.m,
                c.n,
                c.k,
                c.pad,
                c.offset,
                c.alpha,
                c.beta,
                T::DTYPE,
                v.map_or("chosen", |v| v.name),
                verdict
            ));
        }
    }
}

/// Ragged and strided shapes, beta 0 and 1.
const EDGE_CASES: &[Case] = &[
    case("one tile", 128, 256, 64),
    case("tiny", 1, 8, 8),
    case("odd tails", 129, 257, 64),
    case("tails 1000", 1000, 1000, 1024),
    case("K not a multiple of 64", 300, 520, 200),
    Case {
        pad: 24,
        ..case("strided views", 300, 520, 200)
    },
    Case {
        beta: 1.0,
        ..case("beta 1", 513, 1000, 512)
    },
    Case {
        pad: 40,
        beta: 1.0,
        ..case("beta 1 strided", 257, 385, 136)
    },
    case("many tiles", 2048, 2048, 2048),
    // Several tiles per block with a k-block count (7) that no ring size divides: a block's
    // tiles start at different ring slots and parities.
    case("ring position across tiles", 4096, 4096, 392),
    // More tiles than SMs with C read through the staging buffers: a block's later tiles
    // continue the buffers' phase parities (odd chunk counts per tile with 224-wide tiles).
    Case {
        beta: 1.0,
        ..case("beta 1, several tiles per block", 2048, 2048, 256)
    },
];

/// Decode shapes (few rows, fewer tiles than SMs: where split-K splits), ragged M, N and K,
/// beta 0 and 1; run with every configuration.
const DECODE_CASES: &[Case] = &[
    case("decode M=1", 1, 8192, 4096),
    case("decode M=7, K not a multiple of 64", 7, 2048, 1000),
    case("decode M=65, wide K", 65, 4096, 14336),
    case("decode M=16, one tile", 16, 256, 8192),
    Case {
        beta: 1.0,
        ..case("decode M=33 beta 1", 33, 1024, 3000)
    },
    Case {
        pad: 24,
        beta: 1.0,
        ..case("decode M=9, N not a multiple of 8, strided", 9, 1001, 2048)
    },
    // An odd k-block count (21): the two-k-block tiles' last stage reads its second k-block
    // past K (zero-filled); a ragged last n-tile.
    Case {
        pad: 8,
        beta: 1.0,
        ..case("decode M=3, odd k-block count, strided", 3, 2000, 1304)
    },
];

/// 8192³ and the stage shapes of the seed's Llama presets (M = 16384 tokens).
const LARGE_CASES: &[Case] = &[
    case("8192^3", 8192, 8192, 8192),
    case("70B fc1 TP8 stage", 2048, 7168, 8192),
    case("70B fc2 TP8 stage", 2048, 8192, 3584),
    case("405B fc1 TP8 stage", 2048, 13312, 16384),
    case("405B fc2 TP8 stage", 2048, 16384, 6656),
    case("70B fc1 TP2 stage", 8192, 28672, 8192),
    case("70B fc2 TP2 stage", 8192, 8192, 14336),
];

#[test]
fn edge_cases_bf16() {
    run_cases("gpu_gemm::edge_cases_bf16", Dtype::Bf16, EDGE_CASES, true);
}

#[test]
fn edge_cases_f16() {
    run_cases("gpu_gemm::edge_cases_f16", Dtype::F16, EDGE_CASES, true);
}

#[test]
fn decode_shapes_bf16() {
    run_cases(
        "gpu_gemm::decode_shapes_bf16",
        Dtype::Bf16,
        DECODE_CASES,
        true,
    );
}

#[test]
fn decode_shapes_f16() {
    run_cases(
        "gpu_gemm::decode_shapes_f16",
        Dtype::F16,
        DECODE_CASES,
        true,
    );
}

#[test]
fn large_shapes_bf16() {
    run_cases(
        "gpu_gemm::large_shapes_bf16",
        Dtype::Bf16,
        LARGE_CASES,
        false,
    );
}

#[test]
fn large_shapes_f16() {
    run_cases(
        "gpu_gemm::large_shapes_f16",
        Dtype::F16,
        &LARGE_CASES[..3],
        false,
    );
}

/// Shapes nobody listed, drawn at random from a fixed seed (so a failure reproduces), each run
/// with the configuration the rule picks: M log-uniform over 1–256 for half the cases and
/// 257–4096 for the other half; N log-uniform over 8–16384, rounded up to a multiple of 128,
/// of 8 or left as drawn; K log-uniform over 512–16384 (over 8–512 for three cases in ten), a
/// multiple of 64 or of 8; rows padded or not; operands starting 16–64 bytes into their
/// buffers (off 32-byte sectors for the odd multiples of 16, which moves the rule) or not;
/// alpha 1, 0.5 or −1; beta 0, 1 or −0.5. A and B hold at most 40·2²⁰ elements together and D
/// at most 16·2²⁰ (the test's host time).
fn random_cases(seed: u64, count: usize) -> Vec<Case> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let mut m = if i % 2 == 0 {
                log_uniform(&mut rng, 1, 256)
            } else {
                log_uniform(&mut rng, 257, 4096)
            };
            let mut n = log_uniform(&mut rng, 8, 16384);
            n = match rng.random_range(0..10) {
                0..4 => n.next_multiple_of(128),
                4..7 => n.next_multiple_of(8),
                _ => n,
            };
            let mut k = if rng.random_bool(0.7) {
                log_uniform(&mut rng, 512, 16384)
            } else {
                log_uniform(&mut rng, 8, 512)
            };
            k = if rng.random_bool(0.5) {
                k.next_multiple_of(64)
            } else {
                k.next_multiple_of(8)
            };
            // Halve the largest dimension (keeping K a multiple of 8) until the case fits.
            while (m + n) * k > 40 << 20 || m * n > 16 << 20 {
                if k >= m.max(n) {
                    k = (k / 2).next_multiple_of(8);
                } else if m >= n {
                    m /= 2;
                } else {
                    n /= 2;
                }
            }
            let multiple_of_8_or_0 = |rng: &mut SmallRng, hi: u64| {
                if rng.random_bool(0.6) {
                    0
                } else {
                    8 * rng.random_range(1..=hi)
                }
            };
            let pad = multiple_of_8_or_0(&mut rng, 8);
            let offset = multiple_of_8_or_0(&mut rng, 4);
            let alpha = [1.0, 0.5, -1.0][rng.random_range(0..3)];
            let beta = [0.0, 0.0, 1.0, -0.5][rng.random_range(0..4)];
            Case {
                pad,
                offset,
                alpha,
                beta,
                ..case("random", m, n, k)
            }
        })
        .collect()
}

/// How many random shapes each dtype's test runs.
const RANDOM_CASES: usize = 40;

#[test]
fn random_shapes_bf16() {
    let cases = random_cases(0x05EE_DB16, RANDOM_CASES);
    run_cases("gpu_gemm::random_shapes_bf16", Dtype::Bf16, &cases, false);
}

#[test]
fn random_shapes_f16() {
    let cases = random_cases(0x05EE_DF16, RANDOM_CASES);
    run_cases("gpu_gemm::random_shapes_f16", Dtype::F16, &cases, false);
}

/// C in the other GPU's memory (NVLink peer access), beta = 1, every tile configuration.
/// Needs two Hopper GPUs with peer access; skips visibly otherwise (also on GPU runs).
#[test]
fn c_from_the_other_gpu() {
    let test = "gpu_gemm::c_from_the_other_gpu";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let peer = match Gpu::open(1) {
        Ok(peer) => peer,
        Err(e) => {
            visible_line(&format!("SKIPPED {test}: needs a second Hopper GPU ({e})"));
            return;
        }
    };
    if !session.gpu.can_access_peer(&peer).unwrap_or(false) {
        visible_line(&format!(
            "SKIPPED {test}: GPU 0 cannot access GPU 1's memory"
        ));
        return;
    }
    enable_peer_access_between(&session.gpu, &peer).expect("enable peer access");
    session.gpu.bind().expect("bind GPU 0");
    let module = session.module().expect("load PTX module");
    let kernel = GemmKernel::new(&module).expect("GEMM kernels");
    let stream = session.gpu.new_stream().expect("stream");
    let cases = [
        Case {
            beta: 1.0,
            ..case("peer C", 1000, 1000, 1024)
        },
        Case {
            pad: 24,
            beta: 1.0,
            ..case("peer C strided", 2048, 2048, 512)
        },
    ];
    for c in cases {
        let mut run = CaseRun::<half::bf16>::new(Some(&peer), &module, &stream, c);
        session.gpu.bind().expect("bind GPU 0");
        for v in &VARIANTS {
            let verdict = run.check(Some(v), &kernel, &stream);
            visible_line(&format!("{test}: {} [{}]: {verdict}", c.name, v.name));
        }
    }
}

/// One FP8 case: name, shape (dense operands) and beta.
type Fp8Case = (&'static str, u64, u64, u64, f32);

const FP8_CASES: &[Fp8Case] = &[
    ("decode M=1", 1, 4096, 4096, 0.0),
    // 544 pairs of e4m3: 9 k-blocks, an odd count (the two-k-block tiles' zero-filled half).
    ("decode M=5, odd k-block count, beta 1", 5, 1000, 1088, 1.0),
    ("ragged M and N", 129, 264, 528, 0.0),
    ("one tile", 128, 256, 1024, 0.0),
    ("beta 1", 200, 256, 256, 1.0),
    ("N not a multiple of the tile, beta 1", 65, 1000, 512, 1.0),
    ("many tiles", 2048, 2048, 2048, 0.0),
];

/// A and B in e4m3 with tensor-wise and with row-wise scales, bf16 C and D, on every
/// configuration compiled for e4m3: every element of D against the f64 reference of
/// `distgemm::reference::check_scaled_each`, one pass for every configuration's D
/// (`alpha·sa·sb·Σ a·b + beta·c`, e4m3 values and scales exact; the bound of
/// `ErrorBound::scaled`: the f32 accumulation, the scale products and the bf16 output). Inputs are N(0, 4²) rounded to e4m3 (never all zero), row-wise scales in
/// [0.25, 2), D poisoned with NaN before every run.
#[test]
fn fp8_every_configuration_and_scale_mode() {
    run_fp8_cases(
        "gpu_gemm::fp8_every_configuration_and_scale_mode",
        FP8_CASES,
        true,
    );
}

/// The shapes of [`random_cases`] in e4m3 (dense operands: K rounded up to a multiple of 16
/// and N to one of 8, D's and C's leading dimension; beta 0 or 1; at most 2²⁹ products a case
/// for the f64 reference), both scale modes, on the configuration the FP8 rule picks.
#[test]
fn fp8_random_shapes() {
    let cases: Vec<Fp8Case> = random_cases(0x005E_EDF8, 24)
        .into_iter()
        .map(|c| {
            let (mut m, mut n, mut k) = (c.m, c.n.next_multiple_of(8), c.k.next_multiple_of(16));
            while m * n * k > 1 << 29 {
                if k >= m.max(n) {
                    k = (k / 2).next_multiple_of(16);
                } else if m >= n {
                    m /= 2;
                } else {
                    n = (n / 2).next_multiple_of(8);
                }
            }
            ("random", m, n, k, if c.beta == 0.0 { 0.0 } else { 1.0 })
        })
        .collect();
    run_fp8_cases("gpu_gemm::fp8_random_shapes", &cases, false);
}

/// Checks every FP8 case in both scale modes with the configuration the FP8 rule picks
/// (`every_variant == false`) or with every configuration compiled for e4m3 (then also that a
/// configuration without an e4m3 entry point is a named error).
fn run_fp8_cases(test: &str, cases: &[Fp8Case], every_variant: bool) {
    use distgemm::fp8::{E4m3, Scales};
    use distgemm::gemm::{Fp8GemmArgs, Fp8Scales};
    use distgemm::problem::Problem;
    use distgemm::reference::{ScaledCheckInputs, check_scaled_each};

    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let module = session.module().expect("load PTX module");
    let kernel = GemmKernel::new(&module).expect("GEMM kernels");
    let stream = session.gpu.new_stream().expect("stream");
    let e4m3 = |rng: &mut SmallRng, len: u64| -> Vec<E4m3> {
        (0..len)
            .map(|_| E4m3::from_f32(4.0 * rng.sample::<f32, _>(StandardNormal)))
            .collect()
    };
    let variants: Vec<Option<&GemmVariant>> = if every_variant {
        VARIANTS
            .iter()
            .filter(|v| v.kernel_e4m3.is_some())
            .map(Some)
            .collect()
    } else {
        vec![None]
    };
    let alpha = 0.75f32;
    for &(name, m, n, k, beta) in cases {
        let mut rng = SmallRng::seed_from_u64(m ^ (n << 20) ^ (k << 40) ^ 0xF8);
        let (a_host, b_host) = (e4m3(&mut rng, m * k), e4m3(&mut rng, n * k));
        let c_host: Vec<half::bf16> = random_matrix(&mut rng, m * n);
        let sa: Vec<f32> = (0..m).map(|_| rng.random_range(0.25..2.0)).collect();
        let sb: Vec<f32> = (0..n).map(|_| rng.random_range(0.25..2.0)).collect();
        let bytes = |v: &[E4m3]| v.iter().map(|x| x.to_bits()).collect::<Vec<u8>>();
        let upload = |what: &str, v: &[u8]| {
            DeviceBuffer::from_host(&session.gpu, &stream, v)
                .unwrap_or_else(|e| panic!("{what}: {e}"))
        };
        let (a, b) = (upload("A", &bytes(&a_host)), upload("B", &bytes(&b_host)));
        let c = DeviceBuffer::from_host(&session.gpu, &stream, &c_host).expect("C");
        let sa_dev = DeviceBuffer::from_host(&session.gpu, &stream, &sa).expect("sa");
        let sb_dev = DeviceBuffer::from_host(&session.gpu, &stream, &sb).expect("sb");
        let problem = Problem::new(m as usize, n as usize, k as usize).with_scalars(alpha, beta);
        let modes = [
            (
                "tensor-wise",
                Fp8Scales::Tensorwise { a: 0.5, b: 0.125 },
                Scales::Tensorwise { a: 0.5, b: 0.125 },
            ),
            (
                "row-wise",
                Fp8Scales::Rowwise {
                    a: sa_dev.device_ptr(),
                    b: sb_dev.device_ptr(),
                },
                Scales::Rowwise {
                    a: sa.clone(),
                    b: sb.clone(),
                },
            ),
        ];
        for (mode, scales, reference_scales) in &modes {
            // Every configuration's D, checked together below: the f64 reference (M·N·K
            // products, most of this test's time at 2048³) is computed once for all of them.
            let mut outputs: Vec<(String, Vec<half::bf16>)> = Vec::new();
            for &v in &variants {
                let mut d =
                    DeviceBuffer::<half::bf16>::alloc(&session.gpu, (m * n) as usize).expect("D");
                d.fill(&stream, half::bf16::NAN).expect("poison D");
                let args = Fp8GemmArgs {
                    a: MatrixView::dense(a.device_ptr(), m, k),
                    b: MatrixView::dense(b.device_ptr(), n, k),
                    c: (beta != 0.0).then(|| MatrixView::dense(c.device_ptr(), m, n)),
                    d: MatrixView::dense(d.device_ptr(), m, n),
                    alpha,
                    beta,
                    scales: *scales,
                };
                if let Some(v) = v.filter(|v| !serves(v, m)) {
                    let verdict = refused(kernel.prepare_fp8_variant(&stream, &args, v).err(), v);
                    visible_line(&format!(
                        "{test}: {name} {m}x{n}x{k} beta {beta} {mode} [{}]: {verdict}",
                        v.name
                    ));
                    continue;
                }
                let prepared = match v {
                    Some(v) => kernel.prepare_fp8_variant(&stream, &args, v),
                    None => kernel.prepare_fp8(&stream, &args),
                }
                .unwrap_or_else(|e| panic!("{name} {m}x{n}x{k} {mode}: prepare: {e}"));
                let what = format!(
                    "{name} {m}x{n}x{k} beta {beta} {mode} [{}{}]",
                    if v.is_some() { "" } else { "chosen: " },
                    prepared.variant().name
                );
                // SAFETY: A, B, C, D and the scales are live buffers of the viewed sizes,
                // read back after.
                unsafe { prepared.launch(&stream, false) }.expect("launch");
                outputs.push((what, d.download(&stream).expect("download D")));
                if let Some(plain) = VARIANTS
                    .iter()
                    .find(|v| every_variant && v.kernel_e4m3.is_none())
                {
                    // A configuration without an e4m3 entry point is a named error.
                    let err = kernel
                        .prepare_fp8_variant(&stream, &args, plain)
                        .err()
                        .expect("no e4m3 entry point");
                    assert!(err.to_string().contains("not compiled for e4m3"), "{err}");
                }
            }
            let inputs = ScaledCheckInputs {
                a: &a_host,
                b: &b_host,
                scales: reference_scales,
                c: (beta != 0.0).then_some(&c_host[..]),
            };
            let ds: Vec<&[half::bf16]> = outputs.iter().map(|(_, d)| &d[..]).collect();
            let reports = check_scaled_each(&problem, 1, 1, inputs, &ds).expect("reference");
            assert_eq!(reports.len(), outputs.len());
            for ((what, _), report) in outputs.iter().zip(&reports) {
                assert_eq!(report.mismatches, 0, "{what}: {report:?}");
                visible_line(&format!(
                    "{test}: {what}: ok (worst {:.2} of the bound)",
                    report.worst_ratio
                ));
            }
        }
    }
}
