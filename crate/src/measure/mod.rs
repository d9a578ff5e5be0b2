//! What keeps a number honest: [`stats`] (median, spread, efficiency
//! against a bound), [`pattern`] (seeded data that proves a copy or a kernel
//! happened, verified against a CPU reference) and [`record`] (a lab's
//! results as JSON with the device's fingerprint and the command that made
//! them, and where recordings live).
//!
//! May use: `error`, `present::units`, `gpu::Fingerprint` (records carry it).

pub mod pattern;
pub mod record;
pub mod stats;
