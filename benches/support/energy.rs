//! Board energy from NVML, for joules per GEMM beside milliseconds.
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
use std::ffi::{CString, c_char, c_int, c_ulonglong, c_void};

/// `nvmlDevice_t`.
type NvmlDevice = *mut c_void;
/// `NVML_SUCCESS`.
const NVML_SUCCESS: c_int = 0;

/// An open NVML handle on one GPU.
pub struct EnergyMeter {
    lib: Library,
    device: NvmlDevice,
}

impl EnergyMeter {
    /// NVML's handle on `gpu` (matched by PCI address), or why there is none.
    pub fn open(gpu: &Gpu) -> Result<Self, String> {
        // SAFETY: loading the driver's NVML runs its (trusted) initialisers only.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("cannot load libnvidia-ml.so.1: {e}"))?;
        let bus_id = CString::new(gpu.pci_bus_id()).map_err(|e| e.to_string())?;
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
