//! One module per lab. Each has `measure` (runs on the GPU), `model` (what
//! the numbers should be and what they mean), `exercise` (the checker),
//! `charts` (plotters), and its record type.

pub mod bandwidth;
pub mod overlap;
