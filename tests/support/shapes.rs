//! Valid shapes per schedule: the units a schedule's M, N and K must be multiples of, and
//! problems drawn at random from them for the GPU tests' shapes nobody listed.

use distgemm::problem::Problem;
use distgemm::schedule::{Collective, ScheduleKind};
use rand::Rng;

/// The units (M, N, K) of `kind`'s shapes at `tp`: each dimension must be a multiple of its
/// unit. A dimension TP splits is a multiple of TP (of 8·TP where its TP-slice is a view
/// offset or leading dimension); K and every leading dimension a multiple of 8.
pub fn shape_units(kind: ScheduleKind, tp: usize) -> (usize, usize, usize) {
    let splits_m = kind.collective() == Collective::AllGather || kind.tiles_rows();
    let m_unit = if splits_m { tp } else { 1 };
    let n_unit = match kind {
        ScheduleKind::ReduceScatterTilingA | ScheduleKind::ReduceScatterSingleStageA => 8,
        ScheduleKind::AllGatherSingleStageB => num_lcm(tp, 8),
        _ => 8 * tp,
    };
    let k_unit = if kind.collective() == Collective::ReduceScatter {
        8 * tp
    } else {
        8
    };
    (m_unit, n_unit, k_unit)
}

/// Least common multiple of `tp` and 8: the smallest multiple of 8 that `tp` divides.
fn num_lcm(tp: usize, eight: usize) -> usize {
    (1..=tp)
        .map(|i| i * eight)
        .find(|x| x.is_multiple_of(tp))
        .unwrap_or(tp * eight)
}

/// A whole number drawn from `rng`, log-uniform over `lo..=hi` (`1 ≤ lo ≤ hi`).
pub fn log_uniform(rng: &mut impl Rng, lo: u64, hi: u64) -> u64 {
    let x = rng.random_range((lo as f64).ln()..=(hi as f64).ln()).exp();
    (x.round() as u64).clamp(lo, hi)
}

/// A problem for `kind` at `tp` drawn from `rng`: M log-uniform over 1–4096, N and K over
/// 8–8192, the largest halved until M·N·K ≤ `max_products` (the f64 check's time), each then
/// rounded up to a multiple of its [`shape_units`]; alpha 1, 0.5 or −1.25; beta 0 or 0.75 in
/// the all-gathers (the reduce-scatters keep their partial sums in C and take no C).
pub fn random_problem(
    kind: ScheduleKind,
    tp: usize,
    rng: &mut impl Rng,
    max_products: usize,
) -> Problem {
    let mut draw = |lo: u64, hi: u64| log_uniform(rng, lo, hi) as usize;
    let (mut m, mut n, mut k) = (draw(1, 4096), draw(8, 8192), draw(8, 8192));
    while m * n * k > max_products {
        let largest = m.max(n).max(k);
        if k == largest {
            k /= 2;
        } else if m == largest {
            m /= 2;
        } else {
            n /= 2;
        }
    }
    let (mu, nu, ku) = shape_units(kind, tp);
    let alpha = [1.0, 0.5, -1.25][rng.random_range(0..3)];
    let beta = match kind.collective() {
        Collective::AllGather if rng.random_bool(0.5) => 0.75,
        _ => 0.0,
    };
    Problem::new(
        m.next_multiple_of(mu),
        n.next_multiple_of(nu),
        k.next_multiple_of(ku),
    )
    .with_scalars(alpha, beta)
}
