//! Thread indices.
#[inline(always)]
pub fn thread_x() -> u32 {
    unsafe { core::arch::nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn block_x() -> u32 {
    unsafe { core::arch::nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    unsafe { core::arch::nvptx::_block_dim_x() as u32 }
}
