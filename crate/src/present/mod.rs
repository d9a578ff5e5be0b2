//! How results are shown: plotters charts ([`chart`]), units and number
//! formats ([`units`]), progress on long sweeps ([`progress`]) and the report
//! every figure comes from ([`report`], `overlap-lab report`).
//!
//! May use: `error`, `measure`, `pipeline::timeline`; the report also walks
//! the lab table (`labs`).

pub mod chart;
pub mod progress;
pub mod report;
pub mod units;
