//! One error type for the whole crate: every failure a learner or instructor can
//! hit (no driver, out of memory, bad sizes, missing data) becomes a one-line
//! message, never a panic.

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
    /// Wrong bytes: a buffer holds something other than what the CPU
    /// reference says it should.
    #[error("data verification failed: {buffer}, element {element}: {detail}")]
    Verification { buffer: String, element: usize, detail: String },
    /// Timing could not be established (a kernel whose time does not grow with
    /// its work, a cost that will not settle): not a data error.
    #[error("calibration failed: {what}. {advice}")]
    Calibration { what: String, advice: String },
    /// A schedule that cannot run correctly: an access not ordered after a
    /// conflicting one, a slot reused too early, work never issued.
    #[error("schedule error: {0}")]
    Schedule(String),
    /// A thread the lab started (a worker, a waiter) stopped unexpectedly.
    #[error("{0}")]
    Thread(String),
    /// `path` as outputs show it (repo-relative where it can be).
    #[error("no recorded data: {path} does not exist (run `overlap-lab all` on a GPU machine to record it)")]
    MissingData { path: String },
    #[error("recorded data {path} is unreadable: {reason}")]
    BadData { path: String, reason: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("kernel {0}")]
    Kernel(String),
    /// What this GPU cannot do (a kernel written for a later architecture).
    #[error("not supported on this GPU: {0}")]
    Unsupported(String),
    #[error("chart: {0}")]
    Chart(String),
    /// A figure asked of results that do not hold what it draws (a part
    /// of the lab that was skipped, or had no timeline): says why.
    #[error("nothing to draw: {0}")]
    NothingToDraw(String),
    /// A script the lab runs (lab 10's PyTorch programs) that could not
    /// start or failed, in its own last words.
    #[error("{0}")]
    Script(String),
    /// A lab that cannot run on this machine and says why (lab 10 where
    /// Python has no PyTorch): within `overlap-lab all` a line, not the end
    /// of the run.
    #[error("{0}")]
    Skipped(String),
    /// A library loaded at run time that is not there (NCCL).
    #[error("{library} could not be loaded: {why}")]
    MissingLibrary { library: &'static str, why: String },
}

pub type Result<T, E = LabError> = std::result::Result<T, E>;

impl LabError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io { context: context.into(), source }
    }
    pub fn config(msg: impl Into<String>) -> Self {
        LabError::Config(msg.into())
    }
    /// `buffer`'s element `element` is wrong; `detail` says got/expected.
    pub fn wrong_data(buffer: impl Into<String>, element: usize, detail: impl Into<String>) -> Self {
        LabError::Verification { buffer: buffer.into(), element, detail: detail.into() }
    }
    pub fn schedule(msg: impl Into<String>) -> Self {
        LabError::Schedule(msg.into())
    }
    pub fn calibration(what: impl Into<String>, advice: impl Into<String>) -> Self {
        LabError::Calibration { what: what.into(), advice: advice.into() }
    }
}

/// The text of a panic payload (what `panic!` was given).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}
