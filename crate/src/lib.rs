//! overlap-lab: measure on your own GPU how CUDA host<->device transfers work
//! and how to hide them behind compute.
//!
//! The parts, from the ground up (each may use only those below it):
//!
//! * [`error`], [`units`]: one error type; sizes, times and their formats.
//! * [`measure`]: what keeps a number honest: statistics, verified data
//!   patterns, the machine's fingerprint, records.
//! * [`pipeline`]: the vocabulary of a copy/compute pipeline (what a
//!   learner's issue loop may call), the schedule it makes (happens-before,
//!   races), the dry run that runs it with no GPU, the queue model that
//!   predicts it, and timelines. No CUDA.
//! * [`diagnose`]: reading a profiler trace (`torch.profiler`'s, or a
//!   lab's timeline) and saying where the overlap is lost: busy and idle
//!   time, copies hidden and exposed, the syncs and what each costs. No CUDA.
//! * [`trace`]: any program traced, in any language (`overlap-lab trace --
//!   COMMAND`): the command run with the course's CUPTI injection library,
//!   each CUDA process's records made a Chrome trace [`diagnose`] reads. No
//!   CUDA (the library records inside the traced program).
//! * [`gpu`]: the only place with raw CUDA ([`gpu::driver`], every call on a
//!   raw handle an `unsafe fn`; a function whose soundness rests on its
//!   caller is an `unsafe fn` with `# Safety`, and every `unsafe` block says
//!   why it is sound, as `[lints]` in crate/Cargo.toml enforces); safe
//!   types own the handles, the
//!   [`gpu::Runner`] executes the vocabulary on real streams, and
//!   [`gpu::PlanRig`] runs plans on fresh, verified data.
//! * [`present`]: charts, Gantt timelines, progress.
//! * [`lab_kit`]: what every lab is made of: the lab table's entry,
//!   exercise verdicts, experiments, live-or-recorded runs for the notebooks.
//! * [`labs`]: one folder per lab and the lab table ([`labs::ALL`]).
//! * [`report`]: every lab's figures and headline from the recordings.
//! * [`course`]: the course around the labs: the set-up check, the course
//!   map, the glossary, the primer's picture (the start-here notebook).

pub mod course;
pub mod diagnose;
pub mod error;
pub mod gpu;
pub mod lab_kit;
pub mod labs;
pub mod measure;
pub mod pipeline;
pub mod present;
pub mod report;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod units;

pub use error::{LabError, Result};
pub use units::Bytes;
