//! overlap-lab: measure on your own GPU how CUDA host<->device transfers work
//! and how to hide them behind compute.
//!
//! The parts, each in its own folder, from the ground up:
//!
//! * [`pipeline`]: the vocabulary of a copy/compute pipeline (what a
//!   learner's issue loop may call), the schedule it makes (happens-before,
//!   races), the queue model that predicts it, and timelines. No CUDA.
//! * [`gpu`]: the only place with raw CUDA ([`gpu::driver`], every call on a
//!   raw handle an `unsafe fn`); safe types own the handles, and
//!   [`gpu::Runner`] executes the vocabulary on real streams, and
//!   [`gpu::PlanRig`] runs plans on fresh, verified data.
//! * [`measure`]: what keeps a number honest: statistics, verified data
//!   patterns, records with the device's fingerprint.
//! * [`labs`]: the lab table and one module per lab, speaking only in the
//!   parts above; exercise checking ([`labs::check`]).
//! * [`present`]: charts, units, progress and the report.
//! * [`notebook`]: live-or-recorded runs for the Jupyter notebooks.

pub mod error;
pub mod gpu;
pub mod labs;
pub mod measure;
pub mod notebook;
pub mod pipeline;
pub mod present;
#[doc(hidden)]
pub mod testing;

pub use error::{LabError, Result};
pub use present::units::Bytes;
