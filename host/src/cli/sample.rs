//! Which elements of D a sampled `run --check` compares (when the full check, 2·M·N·K in f64
//! on the CPU, is above the CPU cap).
//!
//! Errors in a distributed GEMM are rarely in one element: a wrong stage, peer, tile or shard
//! spoils a whole rectangle, and an off-by-one in a view spoils its edges. So the sample is
//! - on every rectangle a device writes — D as a whole, every device's shard of D, and every
//!   stage's output tile that lands in D (a GEMM's or a reduction's destination) — its four
//!   corners and up to [`EDGE_POINTS`] evenly spaced points along each of its four edges;
//! - plus `random` elements drawn uniformly from all of D (seeded, so a failure reproduces).
//!
//! A wrong rectangle is found whenever it is one of these (all of them are); a wrong element
//! inside one is found with probability `random / (M·N)` per element.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::plan::{Node, Plan};
use crate::schedule::{BufferKind, View};

/// Points sampled along each edge of a rectangle (its two corners included).
pub(super) const EDGE_POINTS: usize = 8;

/// Random elements of a sampled check.
pub(super) const RANDOM_SAMPLES: usize = 4096;

/// A rectangle of the global D: first row and column, rows, columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rect {
    row0: usize,
    col0: usize,
    rows: usize,
    cols: usize,
}

/// The flat indices (`i·N + j`, sorted, distinct) of the sample (module documentation).
pub(super) fn sample_indices(plan: &Plan, random: usize, seed: u64) -> Vec<usize> {
    let (m, n) = (plan.problem.m, plan.problem.n);
    let mut indices = BTreeSet::new();
    for rect in rectangles(plan) {
        for (i, j) in edge_points(rect) {
            if i < m && j < n {
                indices.insert(i * n + j);
            }
        }
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..random {
        indices.insert(rng.random_range(0..m * n));
    }
    indices.into_iter().collect()
}

/// D, every device's shard of D, and every stage output written into a D shard, in global
/// coordinates.
fn rectangles(plan: &Plan) -> Vec<Rect> {
    let mut rects = vec![Rect {
        row0: 0,
        col0: 0,
        rows: plan.problem.m,
        cols: plan.problem.n,
    }];
    for dev in &plan.devices {
        let shard = dev.shards.d;
        rects.push(Rect {
            row0: shard.row0,
            col0: shard.col0,
            rows: shard.rows,
            cols: shard.cols,
        });
        let outputs = dev.nodes.iter().filter_map(|node| match node {
            Node::Gemm(g) => Some(g.d),
            Node::Reduce(r) => Some(r.dst),
            _ => None,
        });
        for v in outputs {
            if let Some(rect) = in_global_d(&v, dev.device, shard.cols) {
                rects.push(Rect {
                    row0: shard.row0 + rect.row0,
                    col0: shard.col0 + rect.col0,
                    ..rect
                });
            }
        }
    }
    rects
}

/// The rectangle of device `device`'s D shard (packed, `shard_cols` wide) that `v` covers,
/// relative to the shard; `None` when `v` is not in that shard (a workspace partial, say).
fn in_global_d(v: &View, device: usize, shard_cols: usize) -> Option<Rect> {
    (v.device == device && v.buffer == BufferKind::D && v.ld == shard_cols && shard_cols > 0).then(
        || Rect {
            row0: v.offset / shard_cols,
            col0: v.offset % shard_cols,
            rows: v.rows,
            cols: v.cols,
        },
    )
}

/// Up to `EDGE_POINTS` evenly spaced values in `start..start + len`, both ends included.
fn spaced(start: usize, len: usize) -> Vec<usize> {
    if len == 0 {
        return Vec::new();
    }
    let points = EDGE_POINTS.min(len);
    (0..points)
        .map(|p| {
            start
                + if points == 1 {
                    0
                } else {
                    p * (len - 1) / (points - 1)
                }
        })
        .collect()
}

/// The corners of `r` and the spaced points along its four edges, as (row, col).
fn edge_points(r: Rect) -> Vec<(usize, usize)> {
    if r.rows == 0 || r.cols == 0 {
        return Vec::new();
    }
    let (last_row, last_col) = (r.row0 + r.rows - 1, r.col0 + r.cols - 1);
    let mut points = Vec::new();
    for j in spaced(r.col0, r.cols) {
        points.extend([(r.row0, j), (last_row, j)]);
    }
    for i in spaced(r.row0, r.rows) {
        points.extend([(i, r.col0), (i, last_col)]);
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;

    #[test]
    fn every_stage_tile_of_every_device_has_its_corners_sampled() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            4,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let sample = sample_indices(&plan, 0, 1);
        let n = 64;
        // ag-a at TP 4: device d's D is column block d (16 columns), stage tiles are row
        // blocks of 16: every 16×16 tile's four corners are in the sample.
        for d in 0..4 {
            for t in 0..4 {
                let (r0, c0) = (16 * t, 16 * d);
                for (i, j) in [(r0, c0), (r0 + 15, c0), (r0, c0 + 15), (r0 + 15, c0 + 15)] {
                    assert!(sample.binary_search(&(i * n + j)).is_ok(), "({i}, {j})");
                }
            }
        }
        assert!(sample.windows(2).all(|w| w[0] < w[1]));
        let with_random = sample_indices(&plan, 100, 1);
        assert!(with_random.len() > sample.len() && with_random.iter().all(|&i| i < 64 * 64));
        assert_eq!(with_random, sample_indices(&plan, 100, 1), "seeded");
    }

    #[test]
    fn spaced_points_include_both_ends() {
        assert_eq!(spaced(10, 1), vec![10]);
        assert_eq!(spaced(0, 3), vec![0, 1, 2]);
        let s = spaced(0, 100);
        assert_eq!((s.len(), s[0], s[s.len() - 1]), (EDGE_POINTS, 0, 99));
    }
}
