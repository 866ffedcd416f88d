//! Timing GPU work with CUDA events: the measurement core shared by `distgemm bench` and the
//! benchmarks (`benches/`).
//!
//! Method: `warmup` untimed repetitions, then `reps` repetitions, each bracketed by a pair of
//! timing events recorded on **every** stream of the work. The host does not wait between
//! repetitions, so launch overhead overlaps with GPU work as in a real pipeline. A
//! repetition's time is the **slowest device's** start-to-end time (the convention of
//! CUTLASS's distributed GEMM benchmark: a device that starts early and waits for a peer counts
//! that wait). The median is reported with min and max ([`Timing`]).

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
    /// Median.
    pub median_ms: f64,
    /// Fastest repetition.
    pub min_ms: f64,
    /// Slowest repetition.
    pub max_ms: f64,
    /// Every repetition, in launch order.
    pub samples_ms: Vec<f64>,
}

impl Timing {
    /// Statistics of `samples_ms` (must be non-empty; an even count's median is the mean of
    /// the two middle samples).
    pub fn from_samples(samples_ms: Vec<f64>) -> Result<Self, TimingError> {
        if samples_ms.is_empty() {
            return Err(TimingError::NoSamples);
        }
        let mut sorted = samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median_ms = if sorted.len() % 2 == 1 {
            sorted[mid]
        } else {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        };
        Ok(Timing {
            median_ms,
            min_ms: sorted[0],
            max_ms: sorted[sorted.len() - 1],
            samples_ms,
        })
    }
}

/// Times work that spans one or more GPUs (one stream each, `streams[i]` on `gpus[i]`).
///
/// Calls `enqueue(i)` for `i` in `0..warmup` untimed, then for every timed repetition records a
/// start event on every stream, calls `enqueue(warmup + rep)` (which puts one repetition's work
/// on all streams; the index lets a caller rotate input sets), and records an end event on
/// every stream. The host never waits between repetitions; it synchronises every stream once
/// at the end. A repetition's time is the maximum over devices of its start-to-end time.
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
    Ok(Timing::from_samples(max_over_devices(&per_device)?)?)
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

#[cfg(test)]
mod tests {
    use super::*;

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
