//! Board energy, power and SM clock from NVML: joules per GEMM beside milliseconds, and
//! what clock and power a GPU ran at while a contender ran ([`PowerSampler`]).
//!
//! `nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded (Volta and
//! later). Read around a block of launches (after the stream is synchronised) it gives the
//! energy of that block, idle gaps included. It is coarse: on an H200, blocks of 0.6 s of one
//! kernel read 3.6 and 4.1 J per launch in the same run, so take blocks of several seconds
//! (`benches/results/gemm-2026-11-30-2886ee3-energy.json`). NVML is loaded at run
//! time (`libnvidia-ml.so.1`, installed with the driver): without it, or on a GPU without the
//! counter, the meter is absent and benchmarks leave the energy columns out.
//!
//! Under a power cap the clock follows power, so energy per GEMM is what decides speed on
//! long runs (kernels-gpu/NOTES.md, step 8).
use distgemm::runtime::Gpu;
use libloading::{Library, Symbol};
use std::ffi::{CString, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// `nvmlDevice_t`.
type NvmlDevice = *mut c_void;
/// `NVML_SUCCESS`.
const NVML_SUCCESS: c_int = 0;
/// `NVML_CLOCK_SM` (`nvmlClockType_t`).
const NVML_CLOCK_SM: c_int = 1;

/// An open NVML handle on one GPU.
pub struct EnergyMeter {
    lib: Library,
    device: NvmlDevice,
}

impl EnergyMeter {
    /// NVML's handle on `gpu` (matched by PCI address), or why there is none.
    pub fn open(gpu: &Gpu) -> Result<Self, String> {
        Self::open_bus_id(gpu.pci_bus_id())
    }

    /// NVML's handle on the GPU at PCI address `bus_id`, or why there is none.
    pub fn open_bus_id(bus_id: &str) -> Result<Self, String> {
        // SAFETY: loading the driver's NVML runs its (trusted) initialisers only.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
        let bus_id = CString::new(bus_id).map_err(|e| e.to_string())?;
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: signatures as in nvml.h: `nvmlReturn_t nvmlInit_v2(void)`,
        // `nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char*, nvmlDevice_t*)`; the
        // string outlives the call and `device` is a valid out-pointer.
        unsafe {
            let init: Symbol<unsafe extern "C" fn() -> c_int> =
                lib.get(b"nvmlInit_v2").map_err(|e| e.to_string())?;
            check("nvmlInit_v2", init())?;
            let by_bus: Symbol<unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int> = lib
                .get(b"nvmlDeviceGetHandleByPciBusId_v2")
                .map_err(|e| e.to_string())?;
            check(
                "nvmlDeviceGetHandleByPciBusId_v2",
                by_bus(bus_id.as_ptr(), &mut device),
            )?;
        }
        let meter = EnergyMeter { lib, device };
        meter.read_mj()?;
        Ok(meter)
    }

    /// The board's energy counter in millijoules.
    pub fn read_mj(&self) -> Result<u64, String> {
        let mut mj: c_ulonglong = 0;
        // SAFETY: `nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t,
        // unsigned long long*)`; `self.device` came from NVML and NVML stays initialised
        // while `self` lives.
        unsafe {
            let total: Symbol<unsafe extern "C" fn(NvmlDevice, *mut c_ulonglong) -> c_int> = self
                .lib
                .get(b"nvmlDeviceGetTotalEnergyConsumption")
                .map_err(|e| e.to_string())?;
            check(
                "nvmlDeviceGetTotalEnergyConsumption",
                total(self.device, &mut mj),
            )?;
        }
        Ok(mj)
    }

    /// The SM clock now, MHz, and the board's power draw, milliwatts.
    pub fn read_clock_and_power(&self) -> Result<(u32, u32), String> {
        let (mut mhz, mut mw): (c_uint, c_uint) = (0, 0);
        // SAFETY: `nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t, nvmlClockType_t,
        // unsigned int*)` and `nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t,
        // unsigned int*)`; the handle is valid while `self` lives (see `read_mj`).
        unsafe {
            let clock: Symbol<unsafe extern "C" fn(NvmlDevice, c_int, *mut c_uint) -> c_int> = self
                .lib
                .get(b"nvmlDeviceGetClockInfo")
                .map_err(|e| e.to_string())?;
            check(
                "nvmlDeviceGetClockInfo",
                clock(self.device, NVML_CLOCK_SM, &mut mhz),
            )?;
            let power: Symbol<unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_int> = self
                .lib
                .get(b"nvmlDeviceGetPowerUsage")
                .map_err(|e| e.to_string())?;
            check("nvmlDeviceGetPowerUsage", power(self.device, &mut mw))?;
        }
        Ok((mhz, mw))
    }
}

/// `NVML_FI_DEV_NVLINK_GET_POWER_STATE`: a link's power state, 0 = high speed, 1 = low speed
/// (a link idle for the low-power threshold, `nvidia-smi nvlink -gLowPwrInfo`, drops to low
/// speed).
const NVML_FI_DEV_NVLINK_GET_POWER_STATE: c_uint = 167;
/// `NVML_NVLINK_MAX_LINKS`: the field queries below ask for links `0..MAX_LINKS`.
const NVML_NVLINK_MAX_LINKS: usize = 18;

/// `nvmlFieldValue_t` (nvml.h): a field's id and scope (the link) in, its value out.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NvmlFieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_int,
    nvml_return: c_int,
    /// `nvmlValue_t`, a union of 8 bytes; the power state is its `unsigned int`.
    value: u64,
}

impl EnergyMeter {
    /// How many of the GPU's NVLinks are in the high-speed power state now, out of how many
    /// report one.
    pub fn nvlinks_at_high_speed(&self) -> Result<(u32, u32), String> {
        let mut fields = [NvmlFieldValue::default(); NVML_NVLINK_MAX_LINKS];
        for (link, f) in fields.iter_mut().enumerate() {
            f.field_id = NVML_FI_DEV_NVLINK_GET_POWER_STATE;
            f.scope_id = link as c_uint;
        }
        // SAFETY: `nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t, int, nvmlFieldValue_t*)`
        // over `fields`, whose layout is nvml.h's; the handle is valid while `self` lives.
        unsafe {
            let get: Symbol<unsafe extern "C" fn(NvmlDevice, c_int, *mut NvmlFieldValue) -> c_int> =
                self.lib
                    .get(b"nvmlDeviceGetFieldValues")
                    .map_err(|e| e.to_string())?;
            check(
                "nvmlDeviceGetFieldValues",
                get(self.device, fields.len() as c_int, fields.as_mut_ptr()),
            )?;
        }
        let reported = fields.iter().filter(|f| f.nvml_return == NVML_SUCCESS);
        let (mut high, mut total) = (0, 0);
        for f in reported {
            total += 1;
            // The unsigned int of the union: its low 4 bytes (little-endian).
            if f.value as u32 == 0 {
                high += 1;
            }
        }
        Ok((high, total))
    }
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

impl Drop for EnergyMeter {
    fn drop(&mut self) {
        // SAFETY: `nvmlReturn_t nvmlShutdown(void)`, balancing the `nvmlInit_v2` of `open`.
        unsafe {
            if let Ok(shutdown) = self
                .lib
                .get::<unsafe extern "C" fn() -> c_int>(b"nvmlShutdown")
            {
                shutdown();
            }
        }
    }
}

fn check(call: &str, code: c_int) -> Result<(), String> {
    if code == NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} returned NVML error {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::ClockPower;

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
