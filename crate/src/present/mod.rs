//! How results are shown: plotters charts ([`chart`]), timelines drawn as
//! Gantt charts ([`gantt`]) and progress on long sweeps ([`progress`]).
//!
//! May use: `error`, `units`, `measure`, `pipeline` (the timelines it
//! draws). Never `gpu` or the labs: a chart is drawn from data alone.

pub mod chart;
pub mod gantt;
pub mod progress;
