//! The shapes `benches/gemm` measures: the seed's set (8192³ and the Llama presets' full,
//! TP-local and stage GEMMs), the `--grid` of the shapes a model runs, and `--shape MxNxK`.

use distgemm::problem::Preset;

/// Tokens of the `--grid` rows: decode batches up to 128, then prefill chunks.
pub(crate) const GRID_TOKENS: [u64; 7] = [1, 16, 64, 128, 512, 2048, 8192];

/// The benchmark's shapes: (name, m, n, k).
pub(crate) fn shapes() -> Vec<(String, u64, u64, u64)> {
    let mut v = vec![("square 8192".to_owned(), 8192, 8192, 8192)];
    let tokens = 16384u64;
    for preset in Preset::ALL {
        let (n, k) = preset.n_k();
        let (n, k) = (n as u64, k as u64);
        let name = preset.name();
        let fc1 = name.ends_with("fc1");
        v.push((format!("{name} full"), tokens, n, k));
        for tp in [2u64, 8] {
            if fc1 {
                // All-gather of A: local GEMM M×(N/P)×K, stage (M/P)×(N/P)×K.
                v.push((format!("{name} TP{tp} local"), tokens, n / tp, k));
                v.push((format!("{name} TP{tp} stage"), tokens / tp, n / tp, k));
            } else {
                // Reduce-scatter: local GEMM M×N×(K/P), stage (M/P)×N×(K/P).
                v.push((format!("{name} TP{tp} local"), tokens, n, k / tp));
                v.push((format!("{name} TP{tp} stage"), tokens / tp, n, k / tp));
            }
        }
    }
    v
}

/// A model's dimensions and the tensor-parallel degree its grid rows use.
struct Model {
    name: &'static str,
    tp: u64,
    hidden: u64,
    /// Width of one of the two MLP projections (the fused fc1 is twice this).
    intermediate: u64,
    heads: u64,
    kv_heads: u64,
}

/// Head width of every Llama-3 model.
const HEAD_DIM: u64 = 128;

/// The models of `--grid`, each at the TP it is usually served with.
const GRID_MODELS: [Model; 3] = [
    Model {
        name: "llama3-8b",
        tp: 1,
        hidden: 4096,
        intermediate: 14336,
        heads: 32,
        kv_heads: 8,
    },
    Model {
        name: "llama3-70b",
        tp: 2,
        hidden: 8192,
        intermediate: 28672,
        heads: 64,
        kv_heads: 8,
    },
    Model {
        name: "llama3-405b",
        tp: 8,
        hidden: 16384,
        intermediate: 53248,
        heads: 128,
        kv_heads: 8,
    },
];

/// The `--grid` shapes: per model, one rank's shard of its four GEMMs (`D = A·Bᵀ`, B the
/// N × K weight) at every [`GRID_TOKENS`] M. Column-parallel layers (QKV, fc1) split N by TP,
/// row-parallel ones (output projection, fc2) split K; the KV heads are split like the query
/// heads (every TP here divides 8).
pub(crate) fn grid_shapes() -> Vec<(String, u64, u64, u64)> {
    let mut v = Vec::new();
    for model in &GRID_MODELS {
        let tp = model.tp;
        let qkv = (model.heads + 2 * model.kv_heads) * HEAD_DIM;
        let layers = [
            ("qkv", qkv / tp, model.hidden),
            ("o-proj", model.hidden, model.heads * HEAD_DIM / tp),
            ("fc1", 2 * model.intermediate / tp, model.hidden),
            ("fc2", model.hidden, model.intermediate / tp),
        ];
        for (layer, n, k) in layers {
            for m in GRID_TOKENS {
                v.push((format!("{} tp{tp} {layer} m{m}", model.name), m, n, k));
            }
        }
    }
    v
}

/// One `--shape`: `MxNxK`, three whole numbers of at least 1.
pub(crate) fn parse_shape(s: &str) -> Result<(u64, u64, u64), String> {
    let dims: Vec<u64> = s
        .split('x')
        .map(|d| d.trim().parse::<u64>().ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!("'{s}': give M, N and K as whole numbers of at least 1, e.g. 3000x5000x4096")
        })?;
    match dims[..] {
        [m, n, k] => Ok((m, n, k)),
        _ => Err(format!(
            "'{s}': give three dimensions, MxNxK (e.g. 3000x5000x4096)"
        )),
    }
}

/// A `--shape`'s name in reports and file names: `MxNxK`.
pub(crate) fn shape_name((m, n, k): (u64, u64, u64)) -> String {
    format!("{m}x{n}x{k}")
}
