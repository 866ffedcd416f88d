//! Pure layout math shared by the kernels (on the GPU) and by the host (tests, tensor maps).
//!
//! Nothing here touches hardware, so every function has host unit tests.
pub mod descriptor;
pub mod fragment;
pub mod raster;
pub mod stream_k;
pub mod swizzle;
