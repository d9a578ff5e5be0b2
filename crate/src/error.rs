//! One error type for the whole crate: every failure a learner or instructor can
//! hit (no driver, out of memory, bad sizes, missing data) becomes a one-line
//! message, never a panic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("no CUDA driver found (libcuda.so could not be loaded): this machine has no usable NVIDIA GPU")]
    NoDriver,
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA call {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    #[error("out of {what} memory: {call} could not allocate {bytes}")]
    OutOfMemory { what: &'static str, call: &'static str, bytes: crate::units::Bytes },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("data verification failed: {0}")]
    Verification(String),
    #[error("no recorded data: {path} does not exist (run `overlap-lab all` on a GPU machine to record it)")]
    MissingData { path: PathBuf },
    #[error("recorded data {path} is unreadable: {reason}")]
    BadData { path: PathBuf, reason: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("kernel {0}")]
    Kernel(String),
    #[error("chart: {0}")]
    Chart(String),
}

pub type Result<T, E = LabError> = std::result::Result<T, E>;

impl LabError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io { context: context.into(), source }
    }
    pub fn config(msg: impl Into<String>) -> Self {
        LabError::Config(msg.into())
    }
}
