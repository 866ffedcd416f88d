//! Grid dependency control: the device half of Programmatic Dependent Launch (PDL).
//!
//! A kernel launched with programmatic stream serialization (or reached through a
//! programmatic graph edge) may start before the previous kernel in the stream finishes.
//! Both instructions are no-ops when the kernel was not launched that way.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.griddepcontrol.wait"]
    fn griddepcontrol_wait();
    #[link_name = "llvm.nvvm.griddepcontrol.launch.dependents"]
    fn griddepcontrol_launch_dependents();
}

/// `griddepcontrol.wait`: blocks until every prerequisite grid has completed and its memory
/// operations are performed and visible to this grid. Put it before the first read of
/// anything a predecessor writes, and before the first write of anything it reads.
#[inline(always)]
pub fn wait_for_prerequisites() {
    unsafe { griddepcontrol_wait() }
}

/// `griddepcontrol.launch_dependents`: lets the dependent grid be scheduled once every block of
/// this grid has executed it or exited. It gives no memory-visibility guarantee: dependents
/// still call [`wait_for_prerequisites`].
#[inline(always)]
pub fn launch_dependents() {
    unsafe { griddepcontrol_launch_dependents() }
}
