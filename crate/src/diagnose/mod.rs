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
//! stream; issue-bound stretches; every idle stretch put down to one cause
//! (launches, a sync, a copy, another stream, the gaps between ops, the
//! host's own work, or unattributed), and each stream's idle split the way
//! HTA splits it. Its [`diagnosis::Diagnosis`] serializes
//! for `--json` and prints as text ([`render`]). [`replay`] turns the trace
//! into a schedule of the pipeline vocabulary (each GPU op on its stream
//! with its measured duration and what it waited for) that the queue model
//! replays, with the changes a fix makes priced by the machine's
//! recordings ([`prediction`]); [`whatif`] picks the fixes the findings
//! suggest and predicts each.
//!
//! The rooms, from the bottom up; each uses only rooms listed before it
//! (its own `//!` says which), so the imports run one way:
//!
//! - [`events`]: what a read trace holds. [`intervals`]: unions of time
//!   spans. [`text`]: how the report writes a time, a rate, a count.
//! - [`queries`]: what more than one room asks of a trace (launching
//!   calls, syncs, the CPU ops around a call, the legacy default stream).
//! - [`host_work`]: the CPU ops that launch nothing, the host's own work,
//!   with the profiler's cost per recorded op taken out where handed in.
//! - [`link`]: lab 1's rates, handed in; where none is of the trace's GPU,
//!   rates assumed from its own pinned copies or its link's typical rate.
//! - Reading: `raw` (an event as the JSON writes it), `course` (the
//!   course's own timelines), `kineto` (torch.profiler's format, as the
//!   events stream past), then [`read`] (the file, gzip, progress, errors).
//! - [`side_streams`]: what a copy stream moves, uploads' and downloads',
//!   and the orders each copy keeps. [`event_joins`]: where the program's
//!   events joined its streams (a graph's fork and join), read from the
//!   trace's CUDA sync events where it has them, else inferred. [`waits`]:
//!   what each GPU op waited for, from the trace's times.
//! - [`fixes`]: the changes a fix makes and what they are priced by.
//!   [`replay`]: the trace as a schedule the queue model replays, with a
//!   fix's changes ([`traced_schedule`]: that schedule and its replay;
//!   `prepared_ahead`: a batch a DataLoader's workers prepare ahead, laid
//!   out on it). [`busy_clock`]: a fix's kernels at the clock of a GPU
//!   as busy as the fix keeps it, from one GPU's calibration.
//!   [`prediction`]: fixes priced on it, the what-if table.
//! - [`diagnosis`]: what a diagnosis says, as data (findings, summaries,
//!   the what-if table it carries).
//! - The analysis: `callers` (the call behind a GPU op, as a finding names
//!   it), `busy` (busy and idle time, idle gaps), `copies` (copies by kind
//!   and their findings), `syncs` (the idle each sync caused),
//!   `issue_bound` (stretches the GPU waited on launches), `idle` (every
//!   idle stretch put down to one cause, the unattributed kept apart),
//!   then [`analyze`] ([`diagnose`], which runs them).
//! - [`render`]: the diagnosis as text. [`whatif`]: the fixes a diagnosis
//!   suggests, predicted: the top.
//! - [`ranks`]: several ranks' traces of one data-parallel step side by
//!   side (communication hidden and exposed, the rank the others waited
//!   for), from the traces alone.
//!
//! May use: `error`, `units`, `measure`, `pipeline` (the schedule and the
//! queue model the replay runs on). Never `gpu`, `present` or the
//! labs: reading a trace needs no GPU and no CUDA, so this runs and is
//! tested anywhere. Progress is reported through a callback, and the link
//! rates and the graph gap are handed in by whoever sits above (lab 10's
//! `labs::pytorch_trace::recording`, from this machine's recordings, for
//! the command line's `diagnose` too).

pub mod events;
pub mod intervals;
pub mod text;

pub mod queries;

pub mod host_work;

pub mod link;

mod course;
mod kineto;
mod raw;
pub mod read;

pub mod event_joins;
pub mod fixes;
pub mod side_streams;

pub mod waits;

pub mod busy_clock;
pub mod prediction;
mod prepared_ahead;
pub mod replay;
pub mod traced_schedule;

pub mod diagnosis;

pub mod analyze;
mod busy;
mod callers;
mod copies;
mod idle;
mod issue_bound;
mod syncs;

pub mod render;
pub mod whatif;

pub mod ranks;

pub use analyze::diagnose;
pub use diagnosis::{Cause, Diagnosis, Finding, IdleCause, IdleShare, StreamIdleKinds, DIAGNOSIS_SCHEMA};
pub use events::Trace;
pub use link::{LinkPoint, LinkRates};
pub use read::{read_trace, read_trace_text};
