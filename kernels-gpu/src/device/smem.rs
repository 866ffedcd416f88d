//! Dynamic shared memory and 32-bit shared-window addresses.
use core::arch::asm;

/// Alignment of the dynamic shared-memory base: the 128-byte swizzle repeats every 1024 bytes,
/// and `wgmma` descriptors assume a swizzled tile starts on that boundary (base offset 0).
pub const DYNAMIC_SMEM_ALIGN: usize = 1024;

#[repr(C, align(1024))]
struct Aligned1024([u8; 0]);

/// Generic pointer to the start of the block's dynamic shared memory (the `extern __shared__`
/// array of CUDA), aligned to [`DYNAMIC_SMEM_ALIGN`] bytes. Its size is the launch's dynamic
/// shared-memory size.
#[inline(always)]
pub fn dynamic_smem() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Aligned1024>() as *mut u8
}

/// `cvta.to.shared.u64` + `cvt.u32.u64`: the 32-bit shared-window address of a generic pointer
/// into shared memory, the form TMA, mbarrier, `stmatrix` and `wgmma` descriptors take.
#[inline(always)]
pub fn shared_addr<T>(ptr: *const T) -> u32 {
    let r: u32;
    unsafe {
        asm!(
            "{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {r}, t; }}",
            p = in(reg64) ptr,
            r = out(reg32) r,
            options(pure, nomem, nostack),
        )
    };
    r
}

/// Reads the 32-bit word at a shared-window address.
///
/// Lowers to `ld.shared.u32 v, [addr]`.
///
/// # Safety
/// `addr` must be 4-byte aligned and inside this block's shared memory (static, or the
/// launch's dynamic size); a word written by another thread must have been made visible (a
/// barrier, or an mbarrier phase) before it is read.
#[inline(always)]
pub unsafe fn load_u32(addr: u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack))
    };
    v
}

/// Writes the 32-bit word at a shared-window address.
///
/// Lowers to `st.shared.u32 [addr], v`.
///
/// # Safety
/// As [`load_u32`]; also, no other thread and no asynchronous proxy (TMA, `wgmma`) may be
/// reading or writing the word at the same time.
#[inline(always)]
pub unsafe fn store_u32(addr: u32, value: u32) {
    unsafe {
        asm!("st.shared.u32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) value, options(nostack))
    };
}

/// Reads two consecutive f32 at a shared-window address.
///
/// Lowers to `ld.shared.v2.f32 {x, y}, [addr]`.
///
/// # Safety
/// As [`load_u32`], with `addr` 8-byte aligned.
#[inline(always)]
pub unsafe fn load_f32x2(addr: u32) -> [f32; 2] {
    let (x, y): (f32, f32);
    unsafe {
        asm!(
            "ld.shared.v2.f32 {{{x}, {y}}}, [{a}];",
            x = out(reg32) x,
            y = out(reg32) y,
            a = in(reg32) addr,
            options(nostack),
        )
    };
    [x, y]
}

/// Reads the f32 at a shared-window address ([`load_u32`]'s bits).
///
/// # Safety
/// As [`load_u32`].
#[inline(always)]
pub unsafe fn load_f32(addr: u32) -> f32 {
    f32::from_bits(unsafe { load_u32(addr) })
}
