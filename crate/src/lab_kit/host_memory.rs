//! Host memory a copy can use, priced: what each way of getting `bytes` of
//! it costs, and giving it back — pageable memory new to the process or
//! reused in a malloc loop, cuMemHostAlloc the first time and again,
//! cuMemHostRegister of memory you already have ([`price`], one
//! [`PinCostPoint`] a size); which of those costs a way of getting
//! page-locked memory is weighed against ([`Acquisition`]); and the table of
//! them by size ([`cost_table`]). Lab 1 prices its sweep's sizes with it,
//! lab 6 its own.
//!
//! May use: `gpu` (the host buffers it times, `trace`), `measure`,
//! `units`.

use crate::error::Result;
use crate::gpu::trace;
use crate::gpu::{Gpu, HostMemoryKind, PagesFrom, PinnedBuffer, RegisteredBuffer, TouchedPages};
use crate::measure::stats::Summary;
use crate::units::{fmt_ms, Bytes};
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use std::time::Instant;

/// What it costs to get `bytes` of memory a copy can use, and to give it back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcquireCost {
    /// Allocation, plus one write per page for pageable memory (ms).
    pub acquire_ms: Summary,
    pub release_ms: Summary,
}

impl AcquireCost {
    /// Median acquire + median release, ms.
    pub fn total_ms(&self) -> f64 {
        self.acquire_ms.median + self.release_ms.median
    }
}

/// What each way of getting `bytes` of host memory costs. Pageable memory is
/// priced the way a program first uses it (allocation plus one write per
/// 4 KiB page, which faults the page in), since a buffer you copy from must
/// be written first anyway; cuMemHostAlloc hands out pages already mapped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PinCostPoint {
    pub bytes: Bytes,
    /// Pageable memory new to the process: fresh pages from the OS (`mmap`),
    /// each faulted in by its first write (every repeat is fresh).
    pub pageable_first: AcquireCost,
    /// Pageable memory in a loop that mallocs and frees this size: below
    /// glibc's mmap threshold (at most 32 MiB) the pages come back still
    /// mapped, above it every malloc is fresh pages again. The first of the
    /// loop is left out.
    pub pageable_reused: AcquireCost,
    /// cuMemHostAlloc + cuMemFreeHost, the first of this size (one sample).
    pub pinned_first: AcquireCost,
    /// cuMemHostAlloc + cuMemFreeHost, the later ones.
    pub pinned_reused: AcquireCost,
    /// cuMemHostRegister + cuMemHostUnregister of memory that already exists
    /// and was written (its allocation is not counted: you had it anyway).
    pub registered: AcquireCost,
}

impl PinCostPoint {
    /// Host memory priced at 1 GiB (acquire + release, ms): pageable new
    /// 100 + 10, in a loop 1 + 0.1, pinned first 300 + 30, again 280 + 30,
    /// registered 50 + 10.
    pub fn made_up() -> PinCostPoint {
        let flat = |v: f64| Summary::of(&[v]).expect("a finite number");
        let cost = |acquire: f64, release: f64| AcquireCost { acquire_ms: flat(acquire), release_ms: flat(release) };
        PinCostPoint {
            bytes: Bytes(1 << 30),
            pageable_first: cost(100.0, 10.0),
            pageable_reused: cost(1.0, 0.1),
            pinned_first: cost(300.0, 30.0),
            pinned_reused: cost(280.0, 30.0),
            registered: cost(50.0, 10.0),
        }
    }
}

/// How page-locked memory is had, and which pageable memory it replaces:
/// the two costs of a [`PinCostPoint`] a comparison (lab 1's break-even)
/// weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Acquisition {
    /// Allocated once for a program's life: the size's first cuMemHostAlloc
    /// against pageable memory new to the process (fresh pages, each faulted
    /// in by its first write).
    Once,
    /// Allocated and freed around every use: cuMemHostAlloc again against
    /// malloc in the same loop (which may hand back pages still mapped).
    EveryUse,
    /// Memory you already have, pinned in place: cuMemHostRegister +
    /// unregister is all extra.
    Register,
}

impl Acquisition {
    pub const ALL: [Acquisition; 3] = [Acquisition::Once, Acquisition::EveryUse, Acquisition::Register];
    pub fn label(self) -> &'static str {
        match self {
            Acquisition::Once => "allocated once",
            Acquisition::EveryUse => "allocated per use",
            Acquisition::Register => "registered",
        }
    }
    /// Which costs of a [`PinCostPoint`] it weighs, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Acquisition::Once => "pinned_first against pageable_first",
            Acquisition::EveryUse => "pinned_reused against pageable_reused",
            Acquisition::Register => "registered alone",
        }
    }
    /// The page-locked kind it gives.
    pub fn kind(self) -> HostMemoryKind {
        if self == Acquisition::Register {
            HostMemoryKind::Registered
        } else {
            HostMemoryKind::Pinned
        }
    }
    /// The two costs it weighs at one size, each as getting and giving
    /// back: the page-locked memory's, and the pageable memory's it
    /// replaces (none for memory registered in place).
    pub fn costs(self, c: &PinCostPoint) -> (&AcquireCost, Option<&AcquireCost>) {
        match self {
            Acquisition::Once => (&c.pinned_first, Some(&c.pageable_first)),
            Acquisition::EveryUse => (&c.pinned_reused, Some(&c.pageable_reused)),
            Acquisition::Register => (&c.registered, None),
        }
    }
    /// (page-locked cost, pageable cost it replaces) at one size, ms.
    pub fn costs_ms(self, c: &PinCostPoint) -> (f64, f64) {
        let (locked, pageable) = self.costs(c);
        (locked.total_ms(), pageable.map_or(0.0, AcquireCost::total_ms))
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prices every way of getting memory a copy can use at `bytes`: `repeats`
/// samples of each, plus a first round kept apart (the first pinned
/// allocation of the size, and the allocator's first malloc of it).
pub fn price(gpu: &Gpu, bytes: Bytes, repeats: usize) -> Result<PinCostPoint> {
    let _r = trace::range(&format!("pinning cost {bytes}"));
    let n = bytes.as_usize();
    // Acquire and release times per way, over the repeats after the first round.
    let mut t = [(); 8].map(|_| Vec::with_capacity(repeats));
    let mut pinned_first = (0.0, 0.0);
    for round in 0..=repeats {
        let mut times = [0.0; 8];
        for (k, from) in [PagesFrom::Os, PagesFrom::Allocator].into_iter().enumerate() {
            let start = Instant::now();
            let pages = TouchedPages::new(from, n)?;
            times[2 * k] = ms(start.elapsed());
            let start = Instant::now();
            drop(pages);
            times[2 * k + 1] = ms(start.elapsed());
        }
        let start = Instant::now();
        let pinned = PinnedBuffer::new(gpu, n)?;
        times[4] = ms(start.elapsed());
        let start = Instant::now();
        drop(pinned);
        times[5] = ms(start.elapsed());
        let (reg, took) = RegisteredBuffer::new_timed(gpu, n)?;
        times[6] = ms(took);
        times[7] = ms(reg.release_timed());
        // The first round is the size's first pinned allocation (kept
        // apart) and the allocator's first malloc of it (left out).
        if round == 0 {
            pinned_first = (times[4], times[5]);
        } else {
            for (k, v) in times.iter().enumerate() {
                t[k].push(*v);
            }
        }
    }
    let cost = |a: &[f64], r: &[f64]| -> Result<AcquireCost> { Ok(AcquireCost { acquire_ms: Summary::of(a)?, release_ms: Summary::of(r)? }) };
    Ok(PinCostPoint {
        bytes,
        pageable_first: cost(&t[0], &t[1])?,
        pageable_reused: cost(&t[2], &t[3])?,
        pinned_first: cost(&[pinned_first.0], &[pinned_first.1])?,
        pinned_reused: cost(&t[4], &t[5])?,
        registered: cost(&t[6], &t[7])?,
    })
}

/// What getting memory a copy can use costs, per size, each way.
pub fn cost_table(points: &[PinCostPoint]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Getting memory a copy can use, and giving it back (median; pageable memory includes one write per 4 KiB page)");
    let _ = writeln!(s, "{:>9} {:>15} {:>15} {:>15} {:>15} {:>13}", "size", "pageable, new", "pageable, loop", "pinned, first", "pinned, again", "register");
    for c in points {
        let _ = writeln!(
            s,
            "{:>9} {:>15} {:>15} {:>15} {:>15} {:>13}",
            c.bytes.to_string(),
            fmt_ms(c.pageable_first.total_ms()),
            fmt_ms(c.pageable_reused.total_ms()),
            fmt_ms(c.pinned_first.total_ms()),
            fmt_ms(c.pinned_reused.total_ms()),
            fmt_ms(c.registered.total_ms())
        );
    }
    let _ = writeln!(
        s,
        "pageable, new: fresh pages from the OS (mmap), each faulted in by its first write. pageable, loop: malloc + write + free again and again.\n\
         pinned, first: the size's first cuMemHostAlloc + cuMemFreeHost; again: later ones. register: cuMemHostRegister + unregister of memory you have."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_acquisition_weighs_its_two_costs_and_the_table_shows_every_way() {
        let c = PinCostPoint::made_up();
        // Fixture: pageable new 100+10, loop 1+0.1, pinned first 300+30, again 280+30, register 50+10.
        assert_eq!(Acquisition::Once.costs_ms(&c), (330.0, 110.0));
        assert_eq!(Acquisition::EveryUse.costs_ms(&c), (310.0, 1.1));
        assert_eq!(Acquisition::Register.costs_ms(&c), (60.0, 0.0));
        let t = cost_table(&[c]);
        assert!(t.contains("1 GiB") && t.contains("110.00 ms") && t.contains("330.00 ms") && t.contains("310.00 ms") && t.contains("60.00 ms"), "{t}");
        assert_eq!(cost_table(&[]).lines().count(), 4, "a header and the key, no rows");
    }
}
