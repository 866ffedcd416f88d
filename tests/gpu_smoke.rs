//! GPU smoke tests of the Rust → PTX path and the host runtime: each kernel feature the GEMM
//! relies on (plain launch, TMA with 128-byte swizzle, wgmma, PDL) checked on its own, element
//! by element, against a CPU reference. Inputs are random (never zero), outputs are poisoned
//! before every run. Without a Hopper GPU each test prints `SKIPPED …` and passes (see
//! `distgemm_tests::gpu`); the error-path tests that need no GPU always run.

use distgemm::runtime::module::{self, PtxSource};
use distgemm::runtime::stream::{self, DependencyKind, PORT_PROGRAMMATIC};
use distgemm::runtime::{
    CudaStream, DeviceBuffer, Kernel, KernelArgs, LaunchConfig, Module, PtxOrigin, RuntimeError,
    TensorMap2d, TensorMapDtype, TensorMapSpec, hopper_gpus, launch,
};
use distgemm_tests::gpu::{self, GpuSession};
use half::{bf16, f16};
use kernels_gpu::layout::swizzle::sw128_offset_16bit;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// Unwraps a runtime result, panicking with the error's message (not its `Debug`).
macro_rules! t {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => panic!("{} failed: {e}", stringify!($e)),
        }
    };
}

/// Counts the indices where `check` reports a mismatch and fails listing the first few.
fn assert_all(what: &str, count: usize, check: impl Fn(usize) -> Option<String>) {
    let mut bad = 0usize;
    let mut first = Vec::new();
    for i in 0..count {
        if let Some(msg) = check(i) {
            bad += 1;
            if first.len() < 8 {
                first.push(msg);
            }
        }
    }
    assert_eq!(
        bad, 0,
        "{what}: {bad} of {count} elements wrong; first: {first:#?}"
    );
}

/// `n` samples of N(0, 1), none of them zero.
fn normal_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let normal = Normal::new(0.0f32, 1.0).expect("valid normal distribution");
    (0..n)
        .map(|_| {
            loop {
                let x = normal.sample(rng);
                if x != 0.0 {
                    break x;
                }
            }
        })
        .collect()
}

/// A 16-bit float format of the wgmma tests: its bit pattern and exact value of an f32.
trait Half16: Copy {
    const NAME: &'static str;
    fn round(x: f32) -> Self;
    fn bits(self) -> u16;
    fn value(self) -> f64;
}

impl Half16 for bf16 {
    const NAME: &'static str = "bf16";
    fn round(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn value(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Half16 for f16 {
    const NAME: &'static str = "f16";
    fn round(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn value(self) -> f64 {
        f64::from(self.to_f32())
    }
}

/// `n` random values rounded to `T`, none of them (±)zero.
fn normal_half<T: Half16>(rng: &mut StdRng, n: usize) -> Vec<T> {
    let normal = Normal::new(0.0f32, 1.0).expect("valid normal distribution");
    (0..n)
        .map(|_| {
            loop {
                let x = T::round(normal.sample(rng));
                if x.bits() & 0x7fff != 0 {
                    break x;
                }
            }
        })
        .collect()
}

struct Setup {
    session: GpuSession,
    module: Arc<Module>,
    stream: Arc<CudaStream>,
}

impl Setup {
    fn new(session: GpuSession) -> Self {
        let module = t!(session.module());
        let stream = t!(session.gpu.new_stream());
        Setup {
            session,
            module,
            stream,
        }
    }

    fn kernel(&self, name: &str) -> Kernel {
        t!(self.module.kernel(name))
    }

    fn gpu(&self) -> &distgemm::runtime::Gpu {
        &self.session.gpu
    }
}

#[test]
fn vector_add() {
    let Some(session) = gpu::hopper_gpu("gpu_smoke::vector_add") else {
        return;
    };
    let s = Setup::new(session);
    let kernel = s.kernel("smoke_vector_add");
    let n = 1_000_003usize;
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    let a = normal_f32(&mut rng, n);
    let b = normal_f32(&mut rng, n);
    let da = t!(DeviceBuffer::from_host(s.gpu(), &s.stream, &a));
    let db = t!(DeviceBuffer::from_host(s.gpu(), &s.stream, &b));
    let mut dc = t!(DeviceBuffer::<f32>::alloc(s.gpu(), n));
    t!(dc.fill_bytes(&s.stream, 0xFF)); // NaN

    let cfg = LaunchConfig::for_items(n as u32, 256);
    let mut args = KernelArgs::new().ptr(&da).ptr(&db).ptr(&dc).u32(n as u32);
    // SAFETY: (a, b, c, n) match smoke_vector_add; each buffer holds n f32.
    t!(unsafe { launch(&kernel, &s.stream, &cfg, &mut args) });
    let c = t!(dc.download(&s.stream));
    assert_all("c = a + b", n, |i| {
        let want = a[i] + b[i];
        (c[i].to_bits() != want.to_bits()).then(|| format!("c[{i}] = {} != {want}", c[i]))
    });
}

const TMA_ROWS: u64 = 256;
const TMA_COLS: u64 = 192;
const TMA_LD: u64 = 192;
const TMA_BOX: u32 = 64;

/// One TMA round trip of the 64×64 box at element coordinates (`col`, `row`).
fn tma_roundtrip_case(s: &Setup, kernel: &Kernel, col: u32, row: u32, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let count = (TMA_ROWS * TMA_LD) as usize;
    let src: Vec<u16> = normal_half::<bf16>(&mut rng, count)
        .iter()
        .map(|x| x.bits())
        .collect();
    let dsrc = t!(DeviceBuffer::from_host(s.gpu(), &s.stream, &src));
    let mut ddst = t!(DeviceBuffer::<u16>::alloc(s.gpu(), count));
    t!(ddst.fill_bytes(&s.stream, 0xFF));
    let box_elems = (TMA_BOX * TMA_BOX) as usize;
    let mut draw = t!(DeviceBuffer::<u16>::alloc(s.gpu(), box_elems));
    t!(draw.fill_bytes(&s.stream, 0xFF));

    let spec = TensorMapSpec::new(
        TensorMapDtype::Bf16,
        TMA_ROWS,
        TMA_COLS,
        TMA_LD,
        TMA_BOX,
        TMA_BOX,
    );
    let src_map = t!(TensorMap2d::for_buffer(s.gpu(), &s.stream, &dsrc, spec));
    let dst_map = t!(TensorMap2d::for_buffer(s.gpu(), &s.stream, &ddst, spec));

    let cfg = LaunchConfig::linear(1, 128).with_dynamic_smem(16384);
    let mut args = KernelArgs::new()
        .u64(src_map.device_address())
        .u64(dst_map.device_address())
        .ptr(&draw)
        .u32(col)
        .u32(row);
    // SAFETY: (src_map, dst_map, raw, col, row) match smoke_tma_roundtrip; the maps describe
    // live 256×192 bf16 buffers and raw holds 4096 u16.
    t!(unsafe { launch(kernel, &s.stream, &cfg, &mut args) });
    let raw = t!(draw.download(&s.stream));
    let dst = t!(ddst.download(&s.stream));

    let (col, row) = (u64::from(col), u64::from(row));
    let b = u64::from(TMA_BOX);
    let at = format!("box at (col {col}, row {row})");
    assert_all(&format!("swizzled shared memory, {at}"), box_elems, |i| {
        let (r, c) = ((i as u64) / b, (i as u64) % b);
        let (gr, gc) = (row + r, col + c);
        let want = if gr < TMA_ROWS && gc < TMA_COLS {
            src[(gr * TMA_LD + gc) as usize]
        } else {
            0
        };
        let got = raw[(sw128_offset_16bit(r as u32, c as u32) / 2) as usize];
        (got != want).then(|| format!("tile ({r}, {c}): {got:#06x} != {want:#06x}"))
    });
    assert_all(&format!("TMA store, {at}"), count, |i| {
        let (r, c) = ((i as u64) / TMA_LD, (i as u64) % TMA_LD);
        let inside = (row..row + b).contains(&r) && (col..col + b).contains(&c) && c < TMA_COLS;
        let want = if inside { src[i] } else { 0xFFFF };
        (dst[i] != want).then(|| format!("dst ({r}, {c}): {:#06x} != {want:#06x}", dst[i]))
    });
}

#[test]
fn tma_roundtrip() {
    let Some(session) = gpu::hopper_gpu("gpu_smoke::tma_roundtrip") else {
        return;
    };
    let s = Setup::new(session);
    let kernel = s.kernel("smoke_tma_roundtrip");
    tma_roundtrip_case(&s, &kernel, 64, 128, 0x5eed_0002);
    // Partly out of bounds: 32 columns and 32 rows inside; the rest loads as zero and the
    // store clips.
    tma_roundtrip_case(&s, &kernel, 160, 224, 0x5eed_0003);
}

/// One warpgroup computes D (64×N, f32) = A (64×64) · Bᵀ (B is N×64), both K-major.
fn wgmma_case<T: Half16>(test: &str, name: &str, n: usize, seed: u64) {
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let s = Setup::new(session);
    let kernel = s.kernel(name);
    const M: usize = 64;
    const K: usize = 64;
    let mut rng = StdRng::seed_from_u64(seed);
    let a = normal_half::<T>(&mut rng, M * K);
    let b = normal_half::<T>(&mut rng, n * K);
    let bits = |v: &[T]| v.iter().map(|x| x.bits()).collect::<Vec<u16>>();
    let da = t!(DeviceBuffer::from_host(s.gpu(), &s.stream, &bits(&a)));
    let db = t!(DeviceBuffer::from_host(s.gpu(), &s.stream, &bits(&b)));
    let mut dd = t!(DeviceBuffer::<f32>::alloc(s.gpu(), M * n));
    t!(dd.fill_bytes(&s.stream, 0xFF));

    let smem = 49152;
    t!(kernel.reserve_dynamic_smem(smem));
    let cfg = LaunchConfig::linear(1, 128).with_dynamic_smem(smem);
    let mut args = KernelArgs::new().ptr(&da).ptr(&db).ptr(&dd);
    // SAFETY: (a, b, d) match the wgmma smoke kernels; A is 64×64, B n×64, D 64×n.
    t!(unsafe { launch(&kernel, &s.stream, &cfg, &mut args) });
    let d = t!(dd.download(&s.stream));
    assert_all(&format!("{name} ({}): D = A·Bᵀ", T::NAME), M * n, |i| {
        let (r, c) = (i / n, i % n);
        let want: f64 = (0..K)
            .map(|k| a[r * K + k].value() * b[c * K + k].value())
            .sum();
        let got = f64::from(d[i]);
        let ok = (got - want).abs() <= 1e-3 * (1.0 + want.abs());
        (!ok).then(|| format!("D[{r}][{c}] = {got} != {want}"))
    });
}

#[test]
fn wgmma_m64n64k16_bf16() {
    wgmma_case::<bf16>(
        "gpu_smoke::wgmma_m64n64k16_bf16",
        "smoke_wgmma_m64n64k16_bf16",
        64,
        0x5eed_0010,
    );
}

#[test]
fn wgmma_m64n64k16_f16() {
    wgmma_case::<f16>(
        "gpu_smoke::wgmma_m64n64k16_f16",
        "smoke_wgmma_m64n64k16_f16",
        64,
        0x5eed_0011,
    );
}

#[test]
fn wgmma_m64n256k16_bf16() {
    wgmma_case::<bf16>(
        "gpu_smoke::wgmma_m64n256k16_bf16",
        "smoke_wgmma_m64n256k16_bf16",
        256,
        0x5eed_0012,
    );
}

#[test]
fn wgmma_m64n256k16_f16() {
    wgmma_case::<f16>(
        "gpu_smoke::wgmma_m64n256k16_f16",
        "smoke_wgmma_m64n256k16_f16",
        256,
        0x5eed_0013,
    );
}

#[test]
fn pdl_pair() {
    let Some(session) = gpu::hopper_gpu("gpu_smoke::pdl_pair") else {
        return;
    };
    let s = Setup::new(session);
    let primary = s.kernel("smoke_pdl_primary");
    let secondary = s.kernel("smoke_pdl_secondary");
    let n: u32 = 100_003;
    let spin_ns: u32 = 200_000;
    let len = n as usize;
    let mut mid = t!(DeviceBuffer::<u32>::alloc(s.gpu(), len));
    let mut out = t!(DeviceBuffer::<u32>::alloc(s.gpu(), len));
    let primary_cfg = LaunchConfig::for_items(n, 256);
    let secondary_cfg = LaunchConfig::for_items(n, 256).with_programmatic_serialization(true);
    let mut primary_args = KernelArgs::new().ptr(&mid).u32(n).u32(spin_ns);
    let mut secondary_args = KernelArgs::new().ptr(&mid).ptr(&out).u32(n);

    let enqueue_pair = |stream: &CudaStream,
                        pa: &mut KernelArgs,
                        sa: &mut KernelArgs|
     -> Result<(), RuntimeError> {
        // SAFETY: (out, n, spin_ns) and (inp, out, n) match the PDL kernels; both buffers
        // hold n u32.
        unsafe {
            launch(&primary, stream, &primary_cfg, pa)?;
            launch(&secondary, stream, &secondary_cfg, sa)
        }
    };
    let check = |mid: &DeviceBuffer<u32>, out: &DeviceBuffer<u32>, how: &str| {
        let mid = t!(mid.download(&s.stream));
        let out = t!(out.download(&s.stream));
        assert_all(&format!("primary output ({how})"), len, |i| {
            let want = 3 * i as u32 + 1;
            (mid[i] != want).then(|| format!("mid[{i}] = {:#x} != {want}", mid[i]))
        });
        assert_all(&format!("secondary output ({how})"), len, |i| {
            let want = 3 * i as u32 + 8;
            (out[i] != want).then(|| format!("out[{i}] = {:#x} != {want}", out[i]))
        });
    };

    t!(mid.fill_bytes(&s.stream, 0xFF));
    t!(out.fill_bytes(&s.stream, 0xFF));
    t!(enqueue_pair(
        &s.stream,
        &mut primary_args,
        &mut secondary_args
    ));
    check(&mid, &out, "stream launch");

    t!(mid.fill_bytes(&s.stream, 0xFF));
    t!(out.fill_bytes(&s.stream, 0xFF));
    t!(stream::synchronize(&s.stream));
    let graph = t!(stream::capture_graph(&s.stream, |st| enqueue_pair(
        st,
        &mut primary_args,
        &mut secondary_args
    )));
    let topology = t!(stream::graph_topology(&graph));
    assert_eq!(topology.node_count, 2, "{topology:?}");
    assert_eq!(topology.edges.len(), 1, "{topology:?}");
    let edge = topology.edges[0];
    assert_ne!(edge.from, edge.to);
    assert_eq!(edge.kind, DependencyKind::Programmatic, "{edge:?}");
    assert_eq!(edge.from_port, PORT_PROGRAMMATIC, "{edge:?}");
    assert_eq!(edge.to_port, 0, "{edge:?}");
    t!(stream::launch_graph(&graph));
    t!(stream::synchronize(&s.stream));
    check(&mid, &out, "captured graph");
}

/// cuBLASLt TN GEMM with padded leading dimensions and beta ≠ 0 against an f64 reference.
fn cublaslt_case<T: Half16 + distgemm::baseline::CublasLtElement>(test: &str, seed: u64) {
    use distgemm::baseline::{BaselineError, CublasLtGemm, TnGemmShape};
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let gpu = &session.gpu;
    let stream = t!(gpu.new_stream());
    let (m, n, k) = (192usize, 320usize, 136usize);
    let shape = TnGemmShape {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        lda: 144,
        ldb: 152,
        ldc: 328,
        ldd: 336,
    };
    let gemm = match CublasLtGemm::<T>::new(gpu, stream.clone(), shape) {
        Ok(g) => g,
        Err(e @ BaselineError::CublasLtNotFound { .. }) => {
            gpu::visible_line(&format!("SKIPPED {test}: {e}"));
            return;
        }
        Err(e) => panic!("CublasLtGemm::new failed: {e}"),
    };
    let [na, nb, nc, nd] = shape.required_elements().map(|v| v as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let a = normal_half::<T>(&mut rng, na);
    let b = normal_half::<T>(&mut rng, nb);
    let c = normal_half::<T>(&mut rng, nc);
    let da = t!(DeviceBuffer::from_host(gpu, &stream, &a));
    let db = t!(DeviceBuffer::from_host(gpu, &stream, &b));
    let dc = t!(DeviceBuffer::from_host(gpu, &stream, &c));
    let mut dd = t!(DeviceBuffer::<T>::alloc(gpu, nd));
    t!(dd.fill_bytes(&stream, 0xFF));
    let (alpha, beta) = (0.75f32, -0.5f32);
    t!(gemm.run(&da, &db, Some(&dc), &mut dd, alpha, beta));
    let d = t!(dd.download(&stream));
    assert_all(
        &format!("cuBLASLt {} TN GEMM", <T as Half16>::NAME),
        m * n,
        |i| {
            let (r, col) = (i / n, i % n);
            let dot: f64 = (0..k)
                .map(|kk| a[r * 144 + kk].value() * b[col * 152 + kk].value())
                .sum();
            let want = f64::from(alpha) * dot + f64::from(beta) * c[r * 328 + col].value();
            let got = d[r * 336 + col].value();
            // Output rounded to 8 (bf16) or 11 (f16) significant bits.
            let tol = if <T as Half16>::NAME == "bf16" {
                1e-2
            } else {
                2e-3
            } * (1.0 + want.abs());
            ((got - want).abs() > tol).then(|| format!("D[{r}][{col}] = {got} != {want}"))
        },
    );
}

#[test]
fn cublaslt_tn_gemm_bf16() {
    cublaslt_case::<bf16>("gpu_smoke::cublaslt_tn_gemm_bf16", 0x5eed_0020);
}

#[test]
fn cublaslt_tn_gemm_f16() {
    cublaslt_case::<f16>("gpu_smoke::cublaslt_tn_gemm_f16", 0x5eed_0021);
}

/// One reference-products case: `m × n × k` with leading dimensions `lda`, `ldb`.
#[derive(Clone, Copy, Debug)]
struct ProductsCase {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
}

/// Shapes of the reference kernel's test: one element; tails of the 64 × 64 tile and the
/// 32-element k step on every side with padded rows; K = 1; and a D of 4100 × 8200 whose two
/// f64 outputs (538 MB) take two chunks of `CHUNK_BYTES`.
const PRODUCTS_CASES: [ProductsCase; 5] = [
    ProductsCase {
        m: 1,
        n: 1,
        k: 1,
        lda: 1,
        ldb: 1,
    },
    ProductsCase {
        m: 67,
        n: 130,
        k: 45,
        lda: 48,
        ldb: 53,
    },
    ProductsCase {
        m: 200,
        n: 64,
        k: 700,
        lda: 700,
        ldb: 704,
    },
    ProductsCase {
        m: 197,
        n: 257,
        k: 1,
        lda: 3,
        ldb: 1,
    },
    ProductsCase {
        m: 4100,
        n: 8200,
        k: 16,
        lda: 16,
        ldb: 24,
    },
];

/// `reference::gpu::products` against the host's f64 sums of the same values, bit for bit,
/// on every element of [`PRODUCTS_CASES`] (`random` draws an operand element, `value` is its
/// exact value); then a leading dimension below K and a short operand are errors.
fn products_case<O: distgemm::reference::gpu::ReferenceOperand>(
    test: &str,
    seed: u64,
    random: impl Fn(&mut StdRng) -> O,
    value: impl Fn(O) -> f64,
) {
    use distgemm::reference::gpu::{GpuReferenceError, Operand, products};
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let s = Setup::new(session);
    let mut rng = StdRng::seed_from_u64(seed);
    for case in PRODUCTS_CASES {
        let ProductsCase { m, n, k, lda, ldb } = case;
        let a: Vec<O> = (0..(m - 1) * lda + k).map(|_| random(&mut rng)).collect();
        let b: Vec<O> = (0..(n - 1) * ldb + k).map(|_| random(&mut rng)).collect();
        let (a_op, b_op) = (Operand { data: &a, ld: lda }, Operand { data: &b, ld: ldb });
        let got = t!(products(&s.module, &s.stream, a_op, b_op, (m, n, k)));
        assert_all(&format!("{test} {case:?}"), m * n, |idx| {
            let (i, j) = (idx / n, idx % n);
            let (mut exact, mut magnitude) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let p = value(a[i * lda + kk]) * value(b[j * ldb + kk]);
                exact += p;
                magnitude += p.abs();
            }
            let same = got.exact[idx].to_bits() == exact.to_bits()
                && got.magnitude[idx].to_bits() == magnitude.to_bits();
            (!same).then(|| {
                format!(
                    "({i}, {j}): GPU ({}, {}), host ({exact}, {magnitude})",
                    got.exact[idx], got.magnitude[idx]
                )
            })
        });
    }
    let (a, b): (Vec<O>, Vec<O>) = (
        (0..64).map(|_| random(&mut rng)).collect(),
        (0..64).map(|_| random(&mut rng)).collect(),
    );
    let narrow = products(
        &s.module,
        &s.stream,
        Operand { data: &a, ld: 7 },
        Operand { data: &b, ld: 8 },
        (8, 8, 8),
    );
    assert!(
        matches!(
            narrow,
            Err(GpuReferenceError::LeadingDimension {
                operand: "A",
                ld: 7,
                k: 8
            })
        ),
        "{narrow:?}"
    );
    let short = products(
        &s.module,
        &s.stream,
        Operand { data: &a, ld: 8 },
        Operand { data: &b, ld: 8 },
        (8, 9, 8),
    );
    assert!(
        matches!(short, Err(GpuReferenceError::Size(_))),
        "{short:?}"
    );
}

/// A random finite value of magnitude 2^-12 … 2^12 (bf16) or 2^-8 … 2^4 (f16), never zero.
fn spread_half<T: Half16>(rng: &mut StdRng, low: i32, high: i32) -> T {
    let x = normal_half::<T>(rng, 1)[0];
    T::round(x.value() as f32 * 2f32.powi(rng.random_range(low..=high)))
}

#[test]
fn reference_products_bf16() {
    products_case(
        "gpu_smoke::reference_products_bf16",
        0x5eed_0030,
        |rng| spread_half::<bf16>(rng, -12, 12),
        |x| f64::from(x.to_f32()),
    );
}

#[test]
fn reference_products_f16() {
    products_case(
        "gpu_smoke::reference_products_f16",
        0x5eed_0031,
        |rng| spread_half::<f16>(rng, -8, 4),
        |x| f64::from(x.to_f32()),
    );
}

#[test]
fn reference_products_e4m3() {
    use distgemm::fp8::E4m3;
    products_case(
        "gpu_smoke::reference_products_e4m3",
        0x5eed_0032,
        // Every finite code (the NaN codes 0x7F and 0xFF excluded), subnormals included.
        |rng| loop {
            let code = E4m3::from_bits(rng.random());
            if !code.is_nan() {
                break code;
            }
        },
        |x| f64::from(x.to_f32()),
    );
}

#[test]
fn corrupt_ptx_is_rejected_with_the_jit_log() {
    let Some(session) = gpu::hopper_gpu("gpu_smoke::corrupt_ptx_is_rejected_with_the_jit_log")
    else {
        return;
    };
    let ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n\n\
               .visible .entry broken()\n{\n\tthis_is_not_an_instruction.u32 %r1;\n\tret;\n}\n";
    let origin = PtxOrigin::Custom("a deliberately corrupt PTX text".into());
    match Module::from_ptx(&session.gpu, ptx, origin) {
        Err(e @ RuntimeError::PtxRejected { .. }) => {
            let RuntimeError::PtxRejected { log, .. } = &e else {
                unreachable!()
            };
            assert!(
                !log.is_empty() && log != "(the JIT wrote no log)",
                "empty JIT log: {e}"
            );
            assert!(e.to_string().contains(log.as_str()));
            gpu::visible_line(&format!("corrupt PTX error (expected): {e}"));
        }
        Err(e) => panic!("expected PtxRejected, got: {e}"),
        Ok(_) => panic!("corrupt PTX was accepted"),
    }
}

#[test]
fn unknown_kernel_name_is_reported_with_the_known_names() {
    let Some(session) =
        gpu::hopper_gpu("gpu_smoke::unknown_kernel_name_is_reported_with_the_known_names")
    else {
        return;
    };
    let module = t!(session.module());
    match module.kernel("smoke_no_such_kernel") {
        Err(e @ RuntimeError::KernelNotInModule { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("smoke_no_such_kernel") && msg.contains("smoke_vector_add"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected KernelNotInModule, got: {e}"),
        Ok(_) => panic!("a kernel that does not exist was found"),
    }
}

/// Child side of [`missing_ptx_path_in_env_var_is_reported`]: only does something when run by
/// it (with `DISTGEMM_SMOKE_CHILD=1` and `DISTGEMM_PTX` set).
#[test]
fn env_child_reads_distgemm_ptx() {
    if std::env::var("DISTGEMM_SMOKE_CHILD").as_deref() != Ok("1") {
        return;
    }
    match module::default_ptx() {
        Err(e @ RuntimeError::PtxUnreadable { .. }) => println!("CHILD-ERROR: {e}"),
        Err(e) => panic!("expected PtxUnreadable, got: {e}"),
        Ok((_, origin)) => panic!("a missing PTX file was read ({origin})"),
    }
}

#[test]
fn missing_ptx_path_in_env_var_is_reported() {
    // Environment changes are process-wide; run the check in a child process of this binary.
    let path = "/nonexistent/distgemm-smoke/kernels_gpu.ptx";
    let exe = t!(std::env::current_exe());
    let output = t!(std::process::Command::new(exe)
        .args([
            "--exact",
            "env_child_reads_distgemm_ptx",
            "--nocapture",
            "--test-threads=1"
        ])
        .env("DISTGEMM_SMOKE_CHILD", "1")
        .env(module::PTX_ENV_VAR, path)
        .output());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD-ERROR: ").map(|(_, e)| e))
        .unwrap_or_else(|| {
            panic!("child printed no error:\n{stdout}");
        });
    assert!(
        line.contains(path) && line.contains("DISTGEMM_PTX"),
        "{line}"
    );
}

#[test]
fn no_ptx_anywhere_says_how_to_build_it() {
    let e = module::select_ptx_source(None, None).unwrap_err();
    assert!(matches!(e, RuntimeError::PtxMissing));
    assert!(e.to_string().contains("cargo xtask build-ptx"));
    let given = module::select_ptx_source(Some("/x/k.ptx".into()), None).unwrap();
    assert_eq!(given, PtxSource::File("/x/k.ptx".into()));
}

/// The kernels these tests launch.
const SMOKE_KERNELS: &[&str] = &[
    "smoke_vector_add",
    "smoke_tma_roundtrip",
    "smoke_wgmma_m64n64k16_bf16",
    "smoke_wgmma_m64n64k16_f16",
    "smoke_wgmma_m64n256k16_bf16",
    "smoke_wgmma_m64n256k16_f16",
    "smoke_pdl_primary",
    "smoke_pdl_secondary",
];

#[test]
fn smoke_kernels_are_declared_and_embedded() {
    // Runs without a GPU: every kernel these tests launch must be in kernels-gpu's table and,
    // when PTX was embedded at build time, defined in it — otherwise the GPU run would fail
    // with "not in module".
    let undeclared: Vec<&str> = SMOKE_KERNELS
        .iter()
        .copied()
        .filter(|n| kernels_gpu::meta::kernel(n).is_none())
        .collect();
    assert!(
        undeclared.is_empty(),
        "kernels-gpu does not declare {undeclared:?}"
    );
    let Some(ptx) = module::embedded_ptx() else {
        gpu::visible_line(
            "SKIPPED gpu_smoke::smoke_kernels_are_declared_and_embedded (PTX part): no PTX \
             embedded (run `cargo xtask build-ptx` before building the tests)",
        );
        return;
    };
    let missing: Vec<&str> = SMOKE_KERNELS
        .iter()
        .copied()
        .filter(|n| !ptx.contains(&format!(".entry {n}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "the embedded PTX lacks {missing:?}: run `cargo xtask build-ptx` and rebuild"
    );
}

#[test]
fn discovery_reports_instead_of_panicking() {
    // Runs everywhere: on a machine without libcuda or without a Hopper GPU this must be an
    // error with a message, never a panic inside cudarc.
    match hopper_gpus() {
        Ok(gpus) => {
            assert!(!gpus.is_empty() && gpus.iter().all(|g| g.compute_capability() == (9, 0)))
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            gpu::visible_line(&format!("gpu_smoke::discovery: {msg}"));
        }
    }
}

#[test]
fn poison_and_random_inputs_are_never_zero() {
    let mut rng = StdRng::seed_from_u64(7);
    assert!(normal_f32(&mut rng, 10_000).iter().all(|&x| x != 0.0));
    assert!(
        normal_half::<bf16>(&mut rng, 10_000)
            .iter()
            .all(|x| x.bits() & 0x7fff != 0)
    );
    assert!(
        normal_half::<f16>(&mut rng, 10_000)
            .iter()
            .all(|x| x.bits() & 0x7fff != 0)
    );
    let _: u32 = rng.random();
    assert!(f32::from_bits(0xFFFF_FFFF).is_nan());
}
