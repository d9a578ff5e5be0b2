//! Lab 6's pipelines, written as [`Plan`]s so the GPU and the model run
//! the same loop: the two-stream pipeline that allocates scratch memory per
//! batch in four ways.

use super::MemoryConfig;
use crate::lab_kit::experiment::{Effect, Experiment};
use crate::pipeline::issue::DevRef;
use crate::pipeline::op::StreamKind;
use crate::pipeline::plan::{chunk, Plan, StreamSpec};

/// How the pipeline gets each batch's scratch memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scratch {
    /// cuMemAllocAsync / cuMemFreeAsync on the compute stream.
    StreamOrdered,
    /// cuMemAlloc per batch; every cuMemFree after the loop.
    AllocOnly,
    /// cuMemAlloc per batch; the CPU waits for the batch's kernel (as a
    /// cuMemFree would need), frees after the loop.
    AllocAndWait,
    /// cuMemAlloc + cuMemFree per batch (the CPU waits for the batch's
    /// kernel first: its memory must be free of work).
    AllocAndFree,
}

impl Scratch {
    pub const ALL: [Scratch; 4] = [Scratch::StreamOrdered, Scratch::AllocOnly, Scratch::AllocAndWait, Scratch::AllocAndFree];
    pub fn label(self) -> &'static str {
        match self {
            Scratch::StreamOrdered => "cuMemAllocAsync + cuMemFreeAsync per batch",
            Scratch::AllocOnly => "cuMemAlloc per batch, cuMemFree after the loop",
            Scratch::AllocAndWait => "cuMemAlloc per batch, the CPU waits for each batch",
            Scratch::AllocAndFree => "cuMemAlloc + cuMemFree per batch (after waiting for it)",
        }
    }
}

/// The two-stream pipeline: per batch, scratch memory on the compute
/// stream, the batch uploaded into it and computed from it; the result
/// downloaded on the second stream while the next batch uploads. `scratch`
/// says how the scratch memory comes and goes.
pub fn two_streams(name: &str, elements: usize, batches: usize, scratch: Scratch) -> Plan {
    let specs = vec![StreamSpec::new("compute", StreamKind::NonBlocking, 0), StreamSpec::new("download", StreamKind::NonBlocking, 0)];
    Plan::new(name, specs, elements, 2, move |p, r| {
        let (compute, download) = (r.streams[0], r.streams[1]);
        let mut held: Vec<DevRef> = Vec::new();
        for b in 0..batches {
            let (at, n) = chunk(r.elements, batches, b);
            let name = format!("scratch {b}");
            let s = match scratch {
                Scratch::StreamOrdered => p.alloc_async(compute, n, &name)?,
                _ => p.alloc(n, &name)?,
            };
            p.h2d(compute, s, 0, r.input, at, n, &format!("H2D {b}"))?;
            p.compute(compute, s, 0, r.devices[0], at, n, &format!("kernel {b}"))?;
            let computed = p.event()?;
            p.record(computed, compute)?;
            p.wait(download, computed)?;
            p.d2h(download, r.output, at, r.devices[0], at, n, &format!("D2H {b}"))?;
            match scratch {
                Scratch::StreamOrdered => p.free_async(compute, s)?,
                Scratch::AllocOnly => held.push(s),
                Scratch::AllocAndWait => {
                    p.host_wait(computed)?;
                    held.push(s);
                }
                Scratch::AllocAndFree => {
                    p.host_wait(computed)?;
                    p.free(s)?;
                }
            }
        }
        if !held.is_empty() {
            p.sync_device()?;
            for s in held {
                p.free(s)?;
            }
        }
        Ok(())
    })
}

/// The stall experiment: the two-stream pipeline with each kind of scratch.
pub fn stall(cfg: &MemoryConfig) -> Experiment {
    Experiment {
        name: "alloc-stall",
        shows: "cuMemFree waits for all work on the device, so the CPU cannot issue the next batch until the other stream's download is done; cuMemAlloc and the stream-ordered pair do not wait",
        variants: Scratch::ALL.iter().map(|&s| two_streams(s.label(), cfg.elements, cfg.batches, s)).collect(),
        watch: None,
        effects: vec![
            Effect::new("cuMemAlloc per batch instead of the stream-ordered pair", 0, 1, true),
            Effect::new("cuMemFree per batch instead of after the loop (both wait for the batch)", 2, 3, true),
            Effect::new("cuMemAlloc + cuMemFree per batch instead of the stream-ordered pair", 0, 3, true),
        ],
        ceiling_from: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::machine::{DeviceWaits, Machine, WaitsFor};
    use crate::pipeline::op::OpKind;
    use crate::pipeline::plan::Costs;

    fn costs(plans: &[&Plan], per_chunk: f64, chunk: usize) -> Costs {
        let mut c = Costs::new();
        for p in plans {
            for (kind, n) in p.distinct_ops().unwrap() {
                c.insert((kind, n), per_chunk * n as f64 / chunk as f64);
            }
        }
        for m in super::super::probes::PROBED_MEMORY {
            c.insert((OpKind::Alloc(m), chunk), 0.05);
            c.insert((OpKind::Free(m), chunk), 0.05);
        }
        c
    }

    #[test]
    fn every_variant_verifies_and_only_a_waiting_free_stalls_the_other_stream() {
        let cfg = MemoryConfig { elements: 1 << 14, batches: 8, ..MemoryConfig::default() };
        let e = stall(&cfg);
        let n = chunk(cfg.elements, cfg.batches, 0).1;
        let plans: Vec<&Plan> = e.variants.iter().collect();
        let c = costs(&plans, 1.0, n);
        let waits = Machine { device_waits: DeviceWaits { free: WaitsFor::EVERYTHING, ..DeviceWaits::default() }, host_wake: 0.02, ..Machine::engines(2) };
        let mut t = Vec::new();
        for v in &e.variants {
            let m = v.dry_run().unwrap();
            assert!(m.schedule.races().is_empty(), "{}: {:?}", v.name, m.schedule.races());
            assert!(v.expected_output().unwrap().iter().all(|p| matches!(p, crate::pipeline::cells::Provenance::Output(_))), "{}", v.name);
            t.push(v.predicted_ms(waits, &c).unwrap());
        }
        // Uploads and kernels on one stream, downloads on the other: about
        // two chunks' work per batch when they overlap, three when not.
        assert!((t[0] - t[1]).abs() < 1.0, "a cuMemAlloc that does not wait costs only its call: {t:?}");
        assert!(t[3] > t[2] + 4.0, "a cuMemFree that waits for the device serializes the download: {t:?}");
        assert!(t[3] > 1.3 * t[0], "{t:?}");
        // The same free on a driver where it does not wait costs only the wake-ups.
        let t3 = e.variants[3].predicted_ms(Machine { device_waits: DeviceWaits::default(), ..waits }, &c).unwrap();
        assert!((t3 - t[2]).abs() < 1.0, "{t3} vs {t:?}");
    }
}
