//! Shared helpers of the integration tests.
pub mod cpu;
pub mod gpu;
pub mod shapes;
