//! Kernel entry points.
use crate::device::index;

/// `c[i] = a[i] + b[i]` for `i < n`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_vector_add(a: *const f32, b: *const f32, c: *mut f32, n: u32) {
    let i = index::block_x() * index::block_dim_x() + index::thread_x();
    if i < n {
        unsafe { *c.add(i as usize) = *a.add(i as usize) + *b.add(i as usize) };
    }
}
