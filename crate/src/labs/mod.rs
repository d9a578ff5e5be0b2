//! The labs: one folder per lab, each listed once in [`ALL`] through its
//! table entry (`lab_kit::Entry`). A lab keeps what is its own: its plans
//! and runs (`measure`), its closed forms (`model`), its exercise and
//! checker (`exercise`), its charts, its settings, its record type and its
//! table entry. What every lab is made of is in `lab_kit`.
//!
//! May use: the safe types of `gpu` (never `gpu::driver`), `pipeline`,
//! `measure`, `present`, `units` and `lab_kit`.

pub mod bandwidth;
pub mod callback;
pub mod double_buffer;
pub mod kernel_pipeline;
pub mod memory;
pub mod multi_gpu;
pub mod overlap;
pub mod streams;

use crate::lab_kit::Lab;

/// Every lab, in course order.
pub static ALL: [&dyn Lab; 8] =
    [&bandwidth::ENTRY, &overlap::ENTRY, &double_buffer::ENTRY, &callback::ENTRY, &streams::ENTRY, &memory::ENTRY, &kernel_pipeline::ENTRY, &multi_gpu::ENTRY];

/// The lab called `name`.
pub fn find(name: &str) -> Option<&'static dyn Lab> {
    ALL.iter().copied().find(|l| l.name() == name)
}
