//! Device layer.
pub mod index;
