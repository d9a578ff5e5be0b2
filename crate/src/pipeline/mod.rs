//! The pipeline vocabulary: one way for every lab to describe GPU work.
//!
//! A learner's loop calls the operations of [`issue::Issue`] (copies,
//! kernels, events, waits, CPU work, and allocating, freeing and pinning
//! memory as operations). The same loop runs on the GPU
//! (`gpu::Pipeline`, the executor) or on [`model::ModelPipeline`] (no GPU),
//! and both record a [`schedule::Schedule`]: what happens before what, the
//! races it allows, and the queue model's prediction ([`schedule::predict`]).
//! [`timeline`] turns a measured or predicted schedule into lanes for charts
//! and Chrome traces. [`plan`] packs a loop with its streams and buffers, so
//! the GPU and the model run one description (labs 5 and 6).
//!
//! May use: `error`, `measure` (statistics), `present::units`. Never `gpu`:
//! this part runs, and is tested, with no GPU.

pub mod issue;
pub mod model;
pub mod plan;
pub mod schedule;
pub mod timeline;
