//! Reading a profiler trace and saying where the overlap is lost: the room
//! `overlap-lab diagnose TRACE` (and lab 10) stands on.
//!
//! A learner's own program is traced with `torch.profiler` (or a lab's
//! timeline is saved as a Chrome trace); [`read`] reads the file, `.json`
//! or `.json.gz`, streaming, into a [`events::Trace`]: the GPU's kernels,
//! copies and memsets on their streams, the CPU's CUDA calls and the CPU
//! ops around them, tied together by correlation ids. [`analyze`] measures
//! the traced window: each GPU's and stream's busy and idle time
//! ([`intervals`]), each kind of copy and how much of it hid under kernels,
//! set beside this machine's lab 1 rates ([`link`]); the synchronizing
//! calls and the GPU idle each one caused; work on the legacy default
//! stream; issue-bound stretches. Its [`analyze::Diagnosis`] serializes for
//! `--json` and prints as text ([`render`]). [`replay`] turns the trace
//! into a schedule of the pipeline vocabulary (each GPU op on its stream
//! with its measured duration and what it waited for) that the queue model
//! replays, with the changes a fix makes priced by the machine's recordings;
//! [`whatif`] picks the fixes the findings suggest and predicts each.
//!
//! May use: `error`, `units`, `measure`, `pipeline` (the schedule and the
//! queue model the replay runs on). Never `gpu`, `present` or the
//! labs: reading a trace needs no GPU and no CUDA, so this runs and is
//! tested anywhere. Progress is reported through a callback, and the link
//! rates and the graph gap are handed in by whoever sits above (lab 10's
//! `labs::pytorch_trace::recording`, from this machine's recordings, for
//! the command line's `diagnose` too).

pub mod analyze;
pub mod events;
pub mod intervals;
pub mod link;
pub mod read;
pub mod render;
pub mod replay;
pub mod whatif;

pub use analyze::{diagnose, Diagnosis, Finding};
pub use events::Trace;
pub use link::{LinkPoint, LinkRates};
pub use read::{read_trace, read_trace_text};
