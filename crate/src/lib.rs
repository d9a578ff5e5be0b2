//! overlap-lab: measure on your own GPU how CUDA host<->device transfers work
//! and how to hide them behind compute.
//!
//! Layers, as in cudarc: [`gpu::driver`] makes every raw CUDA call; [`gpu`]
//! wraps them in safe types; the labs in [`labs`] speak only in those. Each
//! lab keeps measurement, model, exercise checking and charts apart, and its
//! results travel as a [`record::Record`] with the device's fingerprint.

pub mod chart;
pub mod check;
pub mod error;
pub mod gpu;
pub mod issue;
pub mod kernels;
pub mod labs;
pub mod notebook;
pub mod pattern;
pub mod progress;
pub mod record;
pub mod report;
pub mod schedule;
pub mod stats;
#[doc(hidden)]
pub mod testing;
pub mod timeline;
pub mod trace;
pub mod units;

pub use error::{LabError, Result};
pub use units::Bytes;
