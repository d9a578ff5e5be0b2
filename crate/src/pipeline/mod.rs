//! The pipeline vocabulary: one way for every lab to describe GPU work,
//! and everything that can be known of it with no GPU.
//!
//! A learner's loop calls the operations of [`issue::Issue`] (copies,
//! kernels, events, waits, CPU work, and allocating, freeing and pinning
//! memory as operations). The vocabulary has two executors, and the same
//! loop runs on either: the GPU's runner (`gpu::Runner`) and the dry run
//! ([`dry_run::DryRun`]: the executor with no GPU, which runs nothing and
//! tracks where every element's data came from). A lab with operations of
//! its own (a kernel of its own, host functions, CPU threads) writes each
//! once ([`lab_op::LabOp`]) and its loop against [`lab_op::LabIssue`], the
//! vocabulary's one hook for them: the dry run records them, and
//! `gpu::runner::LabRunner` (the runner with the lab's GPU side) records and
//! enqueues them. Both executors record the loop's operations ([`op`]) in
//! a [`schedule::Schedule`]: what happens before what, and the races it
//! allows. The queue model ([`predict`]), told the machine
//! ([`machine`]) and each op's cost, predicts the schedule's timeline;
//! [`timeline`] turns a measured or predicted schedule into lanes for
//! charts and Chrome traces. [`plan`] packs a loop with its streams and
//! buffers, so the GPU and the dry run run one description.
//!
//! May use: `error`, `measure` (statistics), `units`. Never `gpu`:
//! this part runs, and is tested, with no GPU.

pub mod cells;
pub mod dry_run;
pub mod issue;
pub mod lab_op;
pub mod machine;
pub mod op;
pub mod plan;
pub mod predict;
pub mod schedule;
pub mod timeline;
