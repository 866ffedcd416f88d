//! Device code of distgemm.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        asm_experimental_arch,
        stdarch_nvptx,
        link_llvm_intrinsics,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    )
)]

pub mod collective_abi;
pub mod gemm_abi;
pub mod layout;
pub mod meta;
pub mod reference_abi;
pub mod widen;

#[cfg(target_arch = "nvptx64")]
pub mod device;
#[cfg(target_arch = "nvptx64")]
pub mod kernels;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A device-side panic has nowhere to go: trap, which the host sees as a launch error.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}
