//! What keeps a number honest: [`stats`] (median, spread, efficiency
//! against a bound), [`pattern`] (seeded data that proves a copy or a kernel
//! happened, verified against a CPU reference), [`fingerprint`] (what a
//! result was measured on) and [`record`] (a lab's results as JSON with the
//! device's fingerprint and the command that made them, and where
//! recordings live).
//!
//! May use: `error`, `units`. Never `gpu`: the GPU fills a fingerprint in,
//! a record only carries it.

pub mod fingerprint;
pub mod pattern;
pub mod record;
pub mod stats;
