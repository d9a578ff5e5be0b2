//! Four-way overlap on one GPU of a pair: an upload, a download, a copy to
//! the other GPU and a kernel, each on its own stream, all at once. Each
//! has its own engine — a copy engine for each direction of the host link,
//! the copy over the link between the GPUs, and the SMs — so the bound is
//! the longest of the four alone ([`bound_ms`]); the queue model's
//! prediction adds what is measured to slow them (the host link's two
//! directions at once, [`crate::pipeline::machine::Machine::both_ways`]).
//! What the GPU does beyond that is what the lab measures.

use crate::pipeline::op::{Link, OpKind, StreamKind};
use crate::pipeline::plan::{Costs, Plan, StreamSpec};

/// The four operations, by label.
pub const UPLOAD: &str = "H2D to GPU 0";
pub const DOWNLOAD: &str = "D2H from GPU 0";
/// The copy's label: to GPU `peer` of the plan, or within GPU 0.
pub fn peer_label(peer: usize) -> String {
    if peer == 0 {
        "copy within GPU 0".into()
    } else {
        format!("copy GPU 0 -> GPU {peer}")
    }
}
pub const KERNEL: &str = "kernel on GPU 0";
/// Uploads the data every other op reads, before the four start.
pub const PROLOGUE: &str = "upload the source";

/// The plan: over `elements`, first the source is uploaded (ordered
/// before the rest by events); then, on four streams of GPU 0 at once,
/// `rounds` times each: an upload into another buffer, the download of the
/// source, its copy to GPU `peer` (GPU 0 itself on a machine with one: a
/// copy within it) and the kernel over it. With `only` not empty, just the
/// ops of those kinds (how each is timed alone, and the host link's two
/// directions together). `host out` gets the source back (or
/// stays unwritten without a download), so the run checks that nothing
/// overwrote the source.
pub fn plan(elements: usize, peer: usize, rounds: usize, only: &[OpKind]) -> Plan {
    let specs = ["upload", "download", "peer", "compute"].map(|n| StreamSpec::new(n, StreamKind::NonBlocking, 0).on_gpu(0)).to_vec();
    let name = match only {
        [] => "four-way overlap".to_string(),
        kinds => format!("{} alone", kinds.iter().map(|k| k.label()).collect::<Vec<_>>().join(" + ")),
    };
    // Of a kind asked for (a copy whichever GPUs it joins).
    let only = only.to_vec();
    let wants = move |k: OpKind| only.is_empty() || only.iter().any(|o| std::mem::discriminant(o) == std::mem::discriminant(&k));
    Plan::new(&name, specs, elements, 5, move |p, r| {
        let [up, down, to_peer, compute] = [r.streams[0], r.streams[1], r.streams[2], r.streams[3]];
        let (source, landing, result, on_peer) = (r.devices[0], r.devices[1], r.devices[2], r.devices[4]);
        let n = r.elements;
        p.h2d(compute, source, 0, r.input, 0, n, PROLOGUE)?;
        for s in [up, down, to_peer] {
            p.wait_for(s, compute)?;
        }
        for _ in 0..rounds.max(1) {
            if wants(OpKind::H2d) {
                p.h2d(up, landing, 0, r.input, 0, n, UPLOAD)?;
            }
            if wants(OpKind::D2h) {
                p.d2h(down, r.output, 0, source, 0, n, DOWNLOAD)?;
            }
            if wants(OpKind::D2d(Link { from: 0, to: 1 })) {
                p.d2d(to_peer, on_peer, 0, source, 0, n, &peer_label(peer))?;
            }
            if wants(OpKind::Kernel) {
                p.compute(compute, source, 0, result, 0, n, KERNEL)?;
            }
        }
        Ok(())
    })
    .placed(vec![0, 0, 0, 0, peer])
}

/// The four ops' kinds, in the order the lab reports them, with the copy
/// to GPU `peer`.
pub fn kinds(peer: usize) -> [OpKind; 4] {
    let link = Link::between(0, peer).unwrap_or(Link { from: 0, to: 1 });
    [OpKind::H2d, OpKind::D2h, OpKind::D2d(link), OpKind::Kernel]
}

/// The longest of the four alone, ms (each costed at `elements`, the copy
/// to GPU `peer`): what the run takes if every engine works at once at
/// full speed. `None` when one has no cost.
pub fn bound_ms(costs: &Costs, elements: usize, peer: usize) -> Option<f64> {
    kinds(peer).iter().map(|&k| costs.get(&(k, elements)).copied()).try_fold(0.0f64, |m, c| c.map(|c| m.max(c)))
}

/// The four alone one after another, ms: what no overlap at all takes.
pub fn serial_ms(costs: &Costs, elements: usize, peer: usize) -> Option<f64> {
    kinds(peer).iter().map(|&k| costs.get(&(k, elements)).copied()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;

    fn costs(n: usize) -> Costs {
        [((OpKind::H2d, n), 4.0), ((OpKind::D2h, n), 4.0), ((OpKind::D2d(Link { from: 0, to: 1 }), n), 1.0), ((OpKind::Kernel, n), 3.0)].into()
    }

    #[test]
    fn the_four_run_at_once_up_to_the_longest_and_the_host_links_directions_slow_each_other() {
        let n = 64;
        let p = plan(n, 1, 1, &[]);
        let m = p.dry_run().unwrap();
        assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
        assert!(Plan::output_cells(&m).iter().enumerate().all(|(i, c)| c == Provenance::Input(i as u32)), "host out gets the source back");
        assert_eq!(p.gpus(), [0, 1]);
        let c = costs(n);
        assert_eq!((bound_ms(&c, n, 1), serial_ms(&c, n, 1)), (Some(4.0), Some(12.0)));
        assert_eq!(bound_ms(&Costs::new(), n, 1), None);
        // Each alone, and over one GPU: the same data checks.
        for only in kinds(0) {
            let alone = plan(n, 0, 3, &[only]).dry_run().unwrap();
            assert!(alone.schedule.races().is_empty(), "{:?}", alone.schedule.races());
            assert_eq!(alone.schedule.ops.iter().filter(|o| o.kind == only && o.label != PROLOGUE).count(), 3, "{only:?}");
        }
        // The prologue's upload (4) first, then the four at once: the
        // longest (4) bounds them.
        let (s, t) = p.predict(Machine::engines(2), &c).unwrap();
        let end = |label: &str| s.ops.iter().zip(&t).find(|(o, _)| o.label == label).map(|(_, t)| t.1).unwrap();
        assert_eq!(t.iter().map(|x| x.1).fold(0.0, f64::max), 8.0);
        assert_eq!((end(&peer_label(1)), end(KERNEL)), (5.0, 7.0));
        let one_gpu = plan(n, 0, 1, &[]).dry_run().unwrap();
        assert!(one_gpu.schedule.ops.iter().any(|o| o.label == "copy within GPU 0"), "the copy on one GPU is labelled as within it");
        // Uploads and downloads at 0.8 of their speed while both run: 5 ms.
        let slowed = Machine { both_ways: 0.8, ..Machine::engines(2) };
        let (_, t) = p.predict(slowed, &c).unwrap();
        assert!((t.iter().map(|x| x.1).fold(0.0, f64::max) - 9.0).abs() < 1e-9);
        // The host link's two directions together, nothing else.
        let pair = plan(n, 1, 2, &[OpKind::H2d, OpKind::D2h]).dry_run().unwrap();
        let kinds: Vec<OpKind> = pair.schedule.ops.iter().filter(|o| o.label != PROLOGUE).map(|o| o.kind).collect();
        assert_eq!(kinds, [OpKind::H2d, OpKind::D2h, OpKind::H2d, OpKind::D2h]);
        assert_eq!(plan(n, 1, 1, &[OpKind::H2d, OpKind::D2h]).name, "H2D + D2H alone");
    }
}
