//! Kernel entry points (`extern "ptx-kernel"`). Each one is listed in [`crate::meta::KERNELS`].
pub mod collective;
pub mod fill;
pub mod gemm;
pub mod reference;
pub mod smoke;
