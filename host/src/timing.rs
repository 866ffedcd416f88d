//! Timing GPU work with CUDA events: the measurement core shared by `distgemm bench`,
//! `distgemm tune` and the benchmarks (`benches/`); [`interleaved`] rounds compare contenders
//! under the same drift.
//!
//! Method: `warmup` untimed repetitions, then `reps` repetitions, each bracketed by a pair of
//! timing events recorded on **every** stream of the work. The host does not wait between
//! repetitions, so launch overhead overlaps with GPU work as in a real pipeline, and a device
//! that starts early and waits for a peer counts that wait.
//!
//! The reported time ([`Timing::median_ms`]) is the **slowest device's median** repetition.
//! Not the median of each repetition's slowest device (CUTLASS's convention, kept as
//! [`Timing::per_rep_max_median_ms`]): when the devices meet at a barrier every run, the
//! device that was slower in run r makes the others wait at the start of run r + 1, so its
//! excess appears twice — in its own run r and in the others' run r + 1 — and the per-run
//! maximum overstates the period of back-to-back runs by about the typical imbalance between
//! devices. Each device's own times add up to the true period (its waits included), so their
//! median does not (see the test `coupled_runs_are_not_double_counted`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::runtime::{CudaEvent, CudaStream, Gpu, RuntimeError, stream};

/// Why a measurement could not be made (bad parameters, or a driver call failed).
#[derive(Debug, Error)]
pub enum TimingError {
    /// A driver call (event creation, record, synchronize, elapsed time) failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// `reps` was 0.
    #[error("0 timed repetitions requested; time at least 1")]
    NoRepetitions,
    /// The GPUs and streams do not pair up one to one (or there are none).
    #[error(
        "timing needs one stream per GPU and at least one GPU, got {gpus} GPU(s) and {streams} stream(s)"
    )]
    DeviceStreamMismatch {
        /// GPUs given.
        gpus: usize,
        /// Streams given.
        streams: usize,
    },
    /// Statistics of an empty sample set were asked for.
    #[error("no timed samples")]
    NoSamples,
    /// [`max_over_devices`] got no devices.
    #[error("no devices recorded samples")]
    NoDevices,
    /// [`max_over_devices`] got devices with different numbers of samples.
    #[error("devices recorded different numbers of samples: {0:?}")]
    UnequalSamples(Vec<usize>),
}

/// Warm-up and repetition counts of one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimingConfig {
    /// Untimed repetitions first (JIT, clocks, TLBs, lazy allocations).
    pub warmup: usize,
    /// Timed repetitions (at least 1).
    pub reps: usize,
}

/// Statistics of the timed repetitions, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The slowest device's median repetition (see the module documentation).
    pub median_ms: f64,
    /// Median over repetitions of each repetition's slowest device (equal to `median_ms` on
    /// one device; larger when devices wait for each other).
    pub per_rep_max_median_ms: f64,
    /// Fastest repetition (slowest device of that repetition).
    pub min_ms: f64,
    /// Slowest repetition.
    pub max_ms: f64,
    /// Every repetition's slowest device, in launch order.
    pub samples_ms: Vec<f64>,
    /// Every device's repetitions, in launch order: `per_device_ms[device][rep]`.
    pub per_device_ms: Vec<Vec<f64>>,
}

/// Median of a non-empty sample set (an even count's is the mean of the two middle samples).
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

impl Timing {
    /// Statistics of one device's `samples_ms` (must be non-empty).
    pub fn from_samples(samples_ms: Vec<f64>) -> Result<Self, TimingError> {
        Self::from_devices(vec![samples_ms])
    }

    /// Statistics of every device's samples, `per_device_ms[device][rep]` (at least one device,
    /// all with the same non-zero number of samples).
    pub fn from_devices(per_device_ms: Vec<Vec<f64>>) -> Result<Self, TimingError> {
        let samples_ms = max_over_devices(&per_device_ms)?;
        if samples_ms.is_empty() {
            return Err(TimingError::NoSamples);
        }
        let median_ms = per_device_ms
            .iter()
            .map(|d| median(d))
            .fold(f64::NEG_INFINITY, f64::max);
        Ok(Timing {
            median_ms,
            per_rep_max_median_ms: median(&samples_ms),
            min_ms: samples_ms.iter().copied().fold(f64::INFINITY, f64::min),
            max_ms: samples_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            samples_ms,
            per_device_ms,
        })
    }

    /// Every device's median repetition (`median_ms` is the largest).
    #[must_use]
    pub fn device_medians_ms(&self) -> Vec<f64> {
        self.per_device_ms.iter().map(|d| median(d)).collect()
    }
}

/// Times work that spans one or more GPUs (one stream each, `streams[i]` on `gpus[i]`).
///
/// Calls `enqueue(i)` for `i` in `0..warmup` untimed, then for every timed repetition records a
/// start event on every stream, calls `enqueue(warmup + rep)` (which puts one repetition's work
/// on all streams; the index lets a caller rotate input sets), and records an end event on
/// every stream. The host never waits between repetitions; it synchronises every stream once
/// at the end. Statistics as [`Timing::from_devices`] of every device's start-to-end times.
///
/// Errors from `enqueue` are returned as they are; parameter and driver errors arrive as
/// [`TimingError`] converted into `E`.
pub fn time_on_streams<E, F>(
    gpus: &[Gpu],
    streams: &[Arc<CudaStream>],
    config: TimingConfig,
    mut enqueue: F,
) -> Result<Timing, E>
where
    E: From<TimingError>,
    F: FnMut(usize) -> Result<(), E>,
{
    if config.reps == 0 {
        return Err(TimingError::NoRepetitions.into());
    }
    if gpus.is_empty() || gpus.len() != streams.len() {
        return Err(TimingError::DeviceStreamMismatch {
            gpus: gpus.len(),
            streams: streams.len(),
        }
        .into());
    }
    let driver = |e: RuntimeError| E::from(TimingError::Runtime(e));
    for i in 0..config.warmup {
        enqueue(i)?;
    }
    // events[device][rep] = (start, end)
    let events: Vec<Vec<(CudaEvent, CudaEvent)>> = gpus
        .iter()
        .map(|gpu| {
            (0..config.reps)
                .map(|_| Ok((stream::timing_event(gpu)?, stream::timing_event(gpu)?)))
                .collect::<Result<Vec<_>, RuntimeError>>()
        })
        .collect::<Result<_, _>>()
        .map_err(driver)?;
    for rep in 0..config.reps {
        for (dev, s) in streams.iter().enumerate() {
            stream::record(&events[dev][rep].0, s).map_err(driver)?;
        }
        enqueue(config.warmup + rep)?;
        for (dev, s) in streams.iter().enumerate() {
            stream::record(&events[dev][rep].1, s).map_err(driver)?;
        }
    }
    for s in streams {
        stream::synchronize(s).map_err(driver)?;
    }
    let per_device = events
        .iter()
        .map(|dev| {
            dev.iter()
                .map(|(start, end)| Ok(f64::from(stream::elapsed_ms(start, end)?)))
                .collect::<Result<Vec<_>, RuntimeError>>()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(driver)?;
    Ok(Timing::from_devices(per_device)?)
}

/// Per repetition, the slowest device: `per_device[d][rep]` → `out[rep] = max_d`. There must
/// be at least one device, and all devices must have the same number of samples.
pub fn max_over_devices(per_device: &[Vec<f64>]) -> Result<Vec<f64>, TimingError> {
    let Some(first) = per_device.first() else {
        return Err(TimingError::NoDevices);
    };
    if per_device.iter().any(|d| d.len() != first.len()) {
        return Err(TimingError::UnequalSamples(
            per_device.iter().map(Vec::len).collect(),
        ));
    }
    Ok((0..first.len())
        .map(|rep| {
            per_device
                .iter()
                .map(|d| d[rep])
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect())
}

/// Times `contenders` contenders in `rounds` interleaved rounds: `block(c, round)` times one
/// block of contender `c` and returns its samples per device (`Timing::per_device_ms`). The
/// order is reversed every round (A B C, C B A, …), so that drift over the measurement — the
/// GPU heating up and settling at its power cap, neighbours coming and going — hits every
/// contender alike instead of favouring whoever runs first. Returns every contender's samples
/// of all rounds, per device, or its first error (a contender that failed sits out the later
/// rounds).
pub fn interleaved<E>(
    contenders: usize,
    rounds: usize,
    mut block: impl FnMut(usize, usize) -> Result<Vec<Vec<f64>>, E>,
) -> Vec<Result<Vec<Vec<f64>>, E>> {
    let mut out: Vec<Result<Vec<Vec<f64>>, E>> = (0..contenders).map(|_| Ok(Vec::new())).collect();
    for round in 0..rounds {
        for j in 0..contenders {
            let c = if round % 2 == 0 {
                j
            } else {
                contenders - 1 - j
            };
            if out[c].is_err() {
                continue;
            }
            match block(c, round) {
                Ok(samples) => {
                    if let Ok(all) = &mut out[c] {
                        all.resize_with(all.len().max(samples.len()), Vec::new);
                        for (device, s) in all.iter_mut().zip(samples) {
                            device.extend(s);
                        }
                    }
                }
                Err(e) => out[c] = Err(e),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_rounds_alternate_the_order_and_drop_failed_contenders() {
        let mut order = Vec::new();
        let out = interleaved(3, 3, |c, round| {
            order.push(c);
            if c == 1 && round == 1 {
                Err(format!("contender {c} failed"))
            } else {
                // Two devices, the second 0.5 ms slower.
                let t = (10 * round + c) as f64;
                Ok(vec![vec![t], vec![t + 0.5]])
            }
        });
        // Round 0 forward, round 1 reversed (1 fails there), round 2 forward without 1.
        assert_eq!(order, [0, 1, 2, 2, 1, 0, 0, 2]);
        assert_eq!(
            out[0],
            Ok(vec![vec![0.0, 10.0, 20.0], vec![0.5, 10.5, 20.5]])
        );
        assert_eq!(out[1], Err("contender 1 failed".to_owned()));
        assert_eq!(
            out[2],
            Ok(vec![vec![2.0, 12.0, 22.0], vec![2.5, 12.5, 22.5]])
        );
    }

    #[test]
    fn median_min_max() {
        let t = Timing::from_samples(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (2.0, 1.0, 3.0));
        assert_eq!(
            t.samples_ms,
            vec![3.0, 1.0, 2.0],
            "samples keep launch order"
        );
        let t = Timing::from_samples(vec![4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(t.median_ms, 2.5);
        let t = Timing::from_samples(vec![7.5]).unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (7.5, 7.5, 7.5));
        assert!(matches!(
            Timing::from_samples(vec![]),
            Err(TimingError::NoSamples)
        ));
    }

    #[test]
    fn the_slowest_devices_median_is_reported() {
        let t = Timing::from_devices(vec![vec![1.0, 3.0, 2.0], vec![2.5, 1.0, 2.4]]).unwrap();
        assert_eq!(t.median_ms, 2.4);
        assert_eq!(t.device_medians_ms(), vec![2.0, 2.4]);
        assert_eq!(t.samples_ms, vec![2.5, 3.0, 2.4]);
        assert_eq!(t.per_rep_max_median_ms, 2.5);
        assert_eq!((t.min_ms, t.max_ms), (2.4, 3.0));
        assert!(matches!(
            Timing::from_devices(vec![vec![], vec![]]),
            Err(TimingError::NoSamples)
        ));
    }

    /// Two devices meet at a barrier at the start of every run, back to back. Device 1
    /// alternates 10 and 11 ms of work, device 0 always takes 10, so runs take 10.5 ms on
    /// average. Each device's start-to-end times (waits included) have that mean; the
    /// per-run maximum reads 11 every run.
    #[test]
    fn coupled_runs_are_not_double_counted() {
        let work = |d: usize, r: usize| if d == 1 && r % 2 == 1 { 11.0 } else { 10.0 };
        let runs = 40;
        let mut end = [0.0f64; 2];
        let mut per_device = vec![Vec::new(), Vec::new()];
        for r in 0..runs {
            let start = end;
            let barrier = start[0].max(start[1]);
            for d in 0..2 {
                end[d] = barrier + work(d, r);
                per_device[d].push(end[d] - start[d]);
            }
        }
        let period = end[0].max(end[1]) / runs as f64;
        let t = Timing::from_devices(per_device).unwrap();
        assert!((period - 10.5).abs() < 1e-9);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        for d in &t.per_device_ms {
            assert!((mean(d) - period).abs() < 0.05, "{d:?}");
        }
        assert!((t.median_ms - period).abs() <= 0.5, "{}", t.median_ms);
        assert_eq!(t.per_rep_max_median_ms, 11.0);
    }

    #[test]
    fn timing_round_trips_through_json() {
        let t = Timing::from_samples(vec![1.5, 0.5, 1.0]).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"median_ms\":1.0"), "{json}");
        assert_eq!(serde_json::from_str::<Timing>(&json).unwrap(), t);
    }

    #[test]
    fn slowest_device_per_repetition() {
        let v = max_over_devices(&[vec![1.0, 5.0, 2.0], vec![3.0, 4.0, 2.5]]).unwrap();
        assert_eq!(v, vec![3.0, 5.0, 2.5]);
        assert_eq!(max_over_devices(&[vec![2.0, 1.0]]).unwrap(), vec![2.0, 1.0]);
        assert!(matches!(max_over_devices(&[]), Err(TimingError::NoDevices)));
        assert!(matches!(
            max_over_devices(&[vec![1.0], vec![1.0, 2.0]]),
            Err(TimingError::UnequalSamples(v)) if v == vec![1, 2]
        ));
    }

    /// The parameter checks come before any driver call, so they hold without a GPU.
    #[test]
    fn bad_parameters_are_refused_without_touching_a_gpu() {
        let r: Result<Timing, TimingError> =
            time_on_streams(&[], &[], TimingConfig { warmup: 0, reps: 5 }, |_| Ok(()));
        assert!(
            matches!(
                r,
                Err(TimingError::DeviceStreamMismatch {
                    gpus: 0,
                    streams: 0
                })
            ),
            "{r:?}"
        );
        assert!(
            r.unwrap_err().to_string().contains("one stream per GPU"),
            "message names the mismatch"
        );
        let r: Result<Timing, TimingError> =
            time_on_streams(&[], &[], TimingConfig { warmup: 3, reps: 0 }, |_| {
                panic!("nothing is enqueued when the parameters are bad")
            });
        assert!(matches!(r, Err(TimingError::NoRepetitions)), "{r:?}");
        assert_eq!(
            r.unwrap_err().to_string(),
            "0 timed repetitions requested; time at least 1"
        );
    }
}
