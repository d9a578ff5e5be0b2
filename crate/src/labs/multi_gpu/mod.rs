//! Lab 8: several GPUs — peer copies, cross-GPU events, communication
//! overlapping compute.
//!
//! Built so far, in the pipeline vocabulary and run by its executors (the
//! GPU's over several GPUs, `gpu::PlanRig::over`):
//!
//! * [`pipeline_parallel`]: the two-stage pipeline over two GPUs, its
//!   plan, the bubble a run leaves and the model of that bubble;
//! * [`exercise`]: the exercise's checker on the queue model;
//! * [`four_way`]: an upload, a download, a copy to the other GPU and a
//!   kernel at once on one GPU, and their bound.
//!
//! Still to come, with the two-GPU machine to measure on: peer bandwidth
//! by size against PyTorch's, NCCL's all-reduce beside compute
//! (`gpu::nccl`), the lab table's entry, its recording and notebook 08.
//!
//! May use: what every lab may (see `labs`).

pub mod exercise;
pub mod four_way;
pub mod measure;
pub mod peer;
pub mod pipeline_parallel;
pub mod reference;
