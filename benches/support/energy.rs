//! Board energy, power and SM clock from NVML: joules per GEMM beside milliseconds, and
//! what clock and power a GPU ran at while a contender ran ([`PowerSampler`]).
//!
//! `nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded (Volta and
//! later). Read around a block of launches (after the stream is synchronised) it gives the
//! energy of that block, idle gaps included. It is coarse: blocks of a fraction of a second
//! vary by several percent (`benches/results/gemm-2026-11-30-2886ee3-energy.json`), so take
//! blocks of several seconds. NVML is loaded at run time through `nvml-wrapper`
//! (`libnvidia-ml.so.1`, installed with the driver): without it, or on a GPU without the
//! counter, the meter is absent and benchmarks leave the energy columns out.
//!
//! Under a power cap the clock follows power, so energy per GEMM is what decides speed on
//! long runs (kernels-gpu/NOTES.md, step 8).
use distgemm::runtime::Gpu;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{field_id, nvmlFieldValue_t, nvmlReturn_enum_NVML_SUCCESS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// The least metered time behind an energy figure: NVML's counter advances in steps too coarse
/// for shorter windows. `benches/gemm --grid`'s 40 ms blocks read zero in some blocks and 2–4×
/// the board's power in others (8B o-proj at 512 rows: 25.8 mJ a 30.6 µs launch, 843 W on a
/// 700 W board; gemm-grid-2026-12-03-e6fedea-whole-m512-settle100-rounds5), where 0.6 s blocks
/// read within ±8 % of each other (gemm-2026-11-30-2886ee3-energy). A benchmark reports no
/// energy for a contender metered for less.
pub const MIN_METERED: Duration = Duration::from_secs(1);

/// NVML, initialised once per process on first use (or why it could not be).
fn nvml() -> Result<&'static Nvml, String> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| format!("cannot initialise NVML: {e}")))
        .as_ref()
        .map_err(Clone::clone)
}

/// NVML's handle on one GPU.
pub struct EnergyMeter {
    device: Device<'static>,
}

impl EnergyMeter {
    /// NVML's handle on `gpu` (matched by PCI address), or why there is none.
    pub fn open(gpu: &Gpu) -> Result<Self, String> {
        Self::open_bus_id(gpu.pci_bus_id())
    }

    /// NVML's handle on the GPU at PCI address `bus_id`, or why there is none.
    pub fn open_bus_id(bus_id: &str) -> Result<Self, String> {
        let device = nvml()?
            .device_by_pci_bus_id(bus_id)
            .map_err(|e| format!("nvmlDeviceGetHandleByPciBusId_v2({bus_id}): {e}"))?;
        let meter = EnergyMeter { device };
        meter.read_mj()?;
        Ok(meter)
    }

    /// The board's energy counter in millijoules.
    pub fn read_mj(&self) -> Result<u64, String> {
        self.device
            .total_energy_consumption()
            .map_err(|e| format!("nvmlDeviceGetTotalEnergyConsumption: {e}"))
    }

    /// The SM clock now, MHz, and the board's power draw, milliwatts.
    pub fn read_clock_and_power(&self) -> Result<(u32, u32), String> {
        let mhz = self
            .device
            .clock_info(Clock::SM)
            .map_err(|e| format!("nvmlDeviceGetClockInfo: {e}"))?;
        let mw = self
            .device
            .power_usage()
            .map_err(|e| format!("nvmlDeviceGetPowerUsage: {e}"))?;
        Ok((mhz, mw))
    }

    /// How many of the GPU's NVLinks are in the high-speed power state now, out of how many
    /// report one (`NVML_FI_DEV_NVLINK_GET_POWER_STATE`: 0 = high speed, 1 = low speed; a link
    /// idle for the low-power threshold, `nvidia-smi nvlink -gLowPwrInfo`, drops to low speed).
    ///
    /// The one raw NVML call here: `nvml-wrapper`'s `Device::field_values_for` sets only the
    /// field id, and this field is per link, selected by `nvmlFieldValue_t::scopeId`.
    pub fn nvlinks_at_high_speed(&self) -> Result<(u32, u32), String> {
        let get = nvml()?
            .lib()
            .nvmlDeviceGetFieldValues
            .as_ref()
            .map_err(|e| format!("nvmlDeviceGetFieldValues: {e}"))?;
        // SAFETY: nvmlFieldValue_t is plain data (integers and a union of integers), for
        // which all zeros is a valid value.
        let mut fields: [nvmlFieldValue_t; NVML_NVLINK_MAX_LINKS] = unsafe { std::mem::zeroed() };
        for (link, f) in fields.iter_mut().enumerate() {
            f.fieldId = field_id::NVML_FI_DEV_NVLINK_GET_POWER_STATE;
            f.scopeId = link as u32;
        }
        // SAFETY: `nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t, int, nvmlFieldValue_t*)`
        // over `fields` (nvml.h's layout, from the sys crate); the handle comes from the
        // process-wide NVML, which is never shut down.
        let rc = unsafe {
            get(
                self.device.handle(),
                fields.len() as i32,
                fields.as_mut_ptr(),
            )
        };
        if rc != nvmlReturn_enum_NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetFieldValues returned NVML error {rc}"));
        }
        let (mut high, mut total) = (0, 0);
        for f in fields
            .iter()
            .filter(|f| f.nvmlReturn == nvmlReturn_enum_NVML_SUCCESS)
        {
            total += 1;
            // SAFETY: the power state is the union's `unsigned int`.
            if unsafe { f.value.uiVal } == 0 {
                high += 1;
            }
        }
        Ok((high, total))
    }
}

/// `NVML_NVLINK_MAX_LINKS`: the field query asks for links `0..MAX_LINKS`.
const NVML_NVLINK_MAX_LINKS: usize = 18;

/// How long after a timed block starts a [`PowerSampler`] should begin: past the block's
/// settling launches (`settle_ms` of estimated GPU time, enqueued at once), with a margin.
#[must_use]
pub fn power_skip(settle_ms: f64) -> Duration {
    Duration::from_millis(settle_ms as u64 + 30)
}

/// A GPU's mean SM clock and board power over a sampled stretch of time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClockPower {
    pub sm_mhz: f64,
    pub watts: f64,
    pub samples: usize,
}

impl ClockPower {
    /// The sample-weighted mean of `self` and `other`.
    #[must_use]
    pub fn merged(self, other: ClockPower) -> ClockPower {
        let n = self.samples + other.samples;
        if n == 0 {
            return self;
        }
        let mean = |a: f64, b: f64| (a * self.samples as f64 + b * other.samples as f64) / n as f64;
        ClockPower {
            sm_mhz: mean(self.sm_mhz, other.sm_mhz),
            watts: mean(self.watts, other.watts),
            samples: n,
        }
    }
}

/// Samples the SM clock and board power of some GPUs every `period` on a thread of its own,
/// from `skip` after [`PowerSampler::start`] until [`PowerSampler::finish`] (the skip leaves
/// out a block's untimed settling launches). The SM clock is read as it is at the moment; the
/// power, on Ampere and later, is NVML's average over the last second, so it smears blocks
/// shorter than that into their neighbours.
pub struct PowerSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<ClockPower>, String>>,
}

impl PowerSampler {
    /// Starts sampling the GPUs at PCI addresses `bus_ids`, `skip` from now.
    #[must_use]
    pub fn start(bus_ids: Vec<String>, period: Duration, skip: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let begin = std::time::Instant::now() + skip;
        let thread = std::thread::spawn(move || {
            let meters = bus_ids
                .iter()
                .map(|id| EnergyMeter::open_bus_id(id))
                .collect::<Result<Vec<_>, _>>()?;
            let mut sums = vec![(0.0, 0.0); meters.len()];
            let mut samples = 0;
            while std::time::Instant::now() < begin {
                if flag.load(Ordering::Relaxed) {
                    // Finished before sampling began: no samples.
                    return Ok(vec![ClockPower::default(); meters.len()]);
                }
                std::thread::sleep(period);
            }
            loop {
                for (meter, sum) in meters.iter().zip(&mut sums) {
                    let (mhz, mw) = meter.read_clock_and_power()?;
                    sum.0 += f64::from(mhz);
                    sum.1 += f64::from(mw) / 1000.0;
                }
                samples += 1;
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(period);
            }
            Ok(sums
                .into_iter()
                .map(|(mhz, w)| ClockPower {
                    sm_mhz: mhz / samples as f64,
                    watts: w / samples as f64,
                    samples,
                })
                .collect())
        });
        Self { stop, thread }
    }

    /// Stops sampling; every GPU's means, or why there are none.
    pub fn finish(self) -> Result<Vec<ClockPower>, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the power sampler panicked".to_owned())?
    }
}

#[cfg(test)]
mod tests {
    use super::ClockPower;

    #[test]
    fn a_gpu_that_is_not_there_is_an_error_not_a_panic() {
        // Without NVML (CI) the library does not load; with it, no GPU has this address.
        let e = super::EnergyMeter::open_bus_id("00000000:FF:1F.7").err();
        assert!(e.is_some_and(|e| e.contains("NVML") || e.contains("nvml")));
    }

    #[test]
    fn merged_means_weigh_by_samples() {
        let a = ClockPower {
            sm_mhz: 1400.0,
            watts: 600.0,
            samples: 1,
        };
        let b = ClockPower {
            sm_mhz: 1500.0,
            watts: 700.0,
            samples: 3,
        };
        let m = a.merged(b);
        assert_eq!(m.samples, 4);
        assert!((m.sm_mhz - 1475.0).abs() < 1e-9 && (m.watts - 675.0).abs() < 1e-9);
        assert_eq!(
            ClockPower::default().merged(ClockPower::default()).samples,
            0
        );
    }
}
