//! GPU-to-GPU copies, three ways, as plans the executors run: the peer
//! copy one way ([`one_way`]), both ways at once ([`both_ways`]), and
//! staged through pinned host memory ([`staged`]: what a copy between two
//! GPUs without peer access costs, chunked so the download from one GPU
//! overlaps the upload to the other). Each moves `elements` f32 from GPU
//! `from`'s buffer 0 to GPU `to`'s buffer 1; `from == to` makes them copies
//! within one GPU, which is how a machine with one GPU runs them. Each
//! plan puts its input in place as set-up ([`Issue::timed_from_here`]) and
//! leaves its result on the device, which the rig reads back after the
//! run: a run's time is the copies' alone, with no host-link traffic and
//! its noise in it.
//!
//! [`Issue::timed_from_here`]: crate::pipeline::issue::Issue::timed_from_here

use crate::pipeline::op::StreamKind;
use crate::pipeline::plan::{chunk, Plan, StreamSpec};

/// The copy's label in each plan.
pub const COPY: &str = "copy";

/// Buffer 0 on `from` (holding the input), buffer 1 on `to`.
fn placed(p: Plan, from: usize, to: usize) -> Plan {
    p.placed(vec![from, to])
}

/// `repeats` peer copies of the whole buffer from GPU `from` to GPU `to`,
/// back to back on a stream of `from`, after the input's upload (set-up);
/// buffer 1 is checked after the run.
pub fn one_way(elements: usize, from: usize, to: usize, repeats: usize) -> Plan {
    let specs = vec![StreamSpec::new("copies", StreamKind::NonBlocking, 0).on_gpu(from)];
    let p = Plan::new("peer copy, one way", specs, elements, 2, move |p, r| {
        let (s, n) = (r.streams[0], r.elements);
        p.h2d(s, r.devices[0], 0, r.input, 0, n, "upload")?;
        p.timed_from_here()?;
        for _ in 0..repeats.max(1) {
            p.d2d(s, r.devices[1], 0, r.devices[0], 0, n, COPY)?;
        }
        Ok(())
    });
    placed(p, from, to).checked_on_devices(&[1])
}

/// `repeats` uploads of the whole buffer from pinned host memory to GPU
/// `to`'s buffer 1, back to back on a stream of `to` (checked after the
/// run): the host link, for comparison with the copies between GPUs.
pub fn upload(elements: usize, to: usize, repeats: usize) -> Plan {
    let specs = vec![StreamSpec::new("uploads", StreamKind::NonBlocking, 0).on_gpu(to)];
    let p = Plan::new("upload from pinned host memory", specs, elements, 2, move |p, r| {
        let (s, n) = (r.streams[0], r.elements);
        for _ in 0..repeats.max(1) {
            p.h2d(s, r.devices[1], 0, r.input, 0, n, COPY)?;
        }
        Ok(())
    });
    placed(p, to, to).checked_on_devices(&[1])
}

/// Both directions at once: half the buffer from `from` to `to` on a
/// stream of `from` while the other half goes from `to` to `from` on a
/// stream of `to`, `repeats` times each. Buffer 0 (on `from`) holds the
/// input's first half, buffer 1 (on `to`) its second (uploaded as
/// set-up); each half crosses into the other buffer at the same offset,
/// and both buffers are checked after the run.
pub fn both_ways(elements: usize, from: usize, to: usize, repeats: usize) -> Plan {
    let specs = vec![StreamSpec::new("there", StreamKind::NonBlocking, 0).on_gpu(from), StreamSpec::new("back", StreamKind::NonBlocking, 0).on_gpu(to)];
    let p = Plan::new("peer copy, both ways", specs, elements, 2, move |p, r| {
        let (there, back) = (r.streams[0], r.streams[1]);
        let half = chunk(r.elements, 2, 1).0;
        let rest = r.elements - half;
        p.h2d(there, r.devices[0], 0, r.input, 0, half, "upload first half")?;
        p.h2d(back, r.devices[1], half, r.input, half, rest, "upload second half")?;
        p.timed_from_here()?;
        for _ in 0..repeats.max(1) {
            p.d2d(there, r.devices[1], 0, r.devices[0], 0, half, COPY)?;
            p.d2d(back, r.devices[0], half, r.devices[1], half, rest, COPY)?;
        }
        Ok(())
    });
    placed(p, from, to).checked_on_devices(&[0, 1])
}

/// Staged through pinned host memory, `repeats` times, in `chunks`
/// chunks: each chunk goes down from GPU `from` into host out (pinned) on
/// a stream of `from`, then up from there into GPU `to` on a stream of
/// `to` once its download is done (an event), so chunk c's upload overlaps
/// chunk c+1's download. A repeat starts once the one before has landed
/// (its downloads would overwrite chunks still going up). Host out ends
/// holding the data that crossed, which the run verifies.
pub fn staged(elements: usize, from: usize, to: usize, chunks: usize, repeats: usize) -> Plan {
    let specs = vec![StreamSpec::new("down", StreamKind::NonBlocking, 0).on_gpu(from), StreamSpec::new("up", StreamKind::NonBlocking, 0).on_gpu(to)];
    let p = Plan::new("staged through host memory", specs, elements, 2, move |p, r| {
        let (down, up) = (r.streams[0], r.streams[1]);
        p.h2d(down, r.devices[0], 0, r.input, 0, r.elements, "upload")?;
        p.timed_from_here()?;
        for pass in 0..repeats.max(1) {
            if pass > 0 {
                p.wait_for(down, up)?;
            }
            for c in 0..chunks.max(1) {
                let (at, n) = chunk(r.elements, chunks.max(1), c);
                p.d2h(down, r.output, at, r.devices[0], at, n, &format!("{COPY}: down {c}"))?;
                p.wait_for(up, down)?;
                p.h2d(up, r.devices[1], at, r.output, at, n, &format!("{COPY}: up {c}"))?;
            }
        }
        Ok(())
    });
    placed(p, from, to)
}

/// A ring over `gpus` GPUs: every GPU g copies its buffer 2g to buffer
/// 2g+1, on GPU g+1 (GPU 0 after the last), all at once, each on a stream
/// of its own GPU, `repeats` times. Each source holds the input (uploaded
/// as set-up); every received buffer is checked after the run. With two
/// GPUs the ring is [`both_ways`] with whole buffers.
pub fn ring(elements: usize, gpus: usize, repeats: usize) -> Plan {
    let n = gpus.max(1);
    let specs = (0..n).map(|g| StreamSpec::new("to the next", StreamKind::NonBlocking, 0).on_gpu(g)).collect();
    let p = Plan::new(&format!("ring of {n}"), specs, elements, 2 * n, move |p, r| {
        for g in 0..n {
            p.h2d(r.streams[g], r.devices[2 * g], 0, r.input, 0, r.elements, "upload")?;
        }
        p.timed_from_here()?;
        for _ in 0..repeats.max(1) {
            for g in 0..n {
                p.d2d(r.streams[g], r.devices[2 * g + 1], 0, r.devices[2 * g], 0, r.elements, COPY)?;
            }
        }
        Ok(())
    });
    let buffers: Vec<String> = (0..n).flat_map(|g| [format!("GPU {g}'s to send"), format!("received by GPU {} from GPU {g}", (g + 1) % n)]).collect();
    let names: Vec<(&str, usize)> = buffers.iter().map(|b| (b.as_str(), elements)).collect();
    p.placed((0..n).flat_map(|g| [g, (g + 1) % n]).collect()).with_device_buffers(&names).checked_on_devices(&(0..n).map(|g| 2 * g + 1).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::cells::Provenance;
    use crate::pipeline::machine::Machine;
    use crate::pipeline::op::{Link, OpKind};

    #[test]
    fn the_ring_sends_every_gpus_buffer_to_the_next_at_once() {
        for n in [3, 4] {
            let p = ring(64, n, 3);
            assert_eq!(p.gpus(), (0..n).collect::<Vec<_>>());
            let m = p.dry_run().unwrap();
            assert!(m.schedule.races().is_empty(), "{:?}", m.schedule.races());
            for cells in p.checked_cells(&m) {
                assert!(cells.iter().enumerate().all(|(i, c)| c == Provenance::Input(i as u32)));
            }
            let links: Vec<Link> = m.schedule.ops.iter().filter_map(|o| if let OpKind::D2d(l) = o.kind { Some(l) } else { None }).collect();
            assert_eq!(links.len(), 3 * n);
            assert!((0..n).all(|g| links.contains(&Link { from: g as u8, to: ((g + 1) % n) as u8 })), "{links:?}");
            // The queue model runs the links at once: three rounds of one copy's time.
            let mut costs: crate::pipeline::plan::Costs = [((OpKind::H2d, 64), 1.0)].into();
            for l in &links {
                costs.insert((OpKind::D2d(*l), 64), 0.5);
            }
            let (_, times) = p.predict(Machine::engines(2), &costs).unwrap();
            let copies: Vec<&(f64, f64)> = m.schedule.ops.iter().zip(&times).filter(|(o, _)| matches!(o.kind, OpKind::D2d(_))).map(|(_, t)| t).collect();
            let span = copies.iter().map(|t| t.1).fold(0.0, f64::max) - copies.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
            assert!((span - 1.5).abs() < 1e-9, "{span}");
        }
    }

    #[test]
    fn every_plan_moves_the_data_verified_and_race_free_over_two_gpus_or_one() {
        for (from, to) in [(0, 1), (1, 0), (0, 0)] {
            for p in [one_way(64, from, to, 3), both_ways(64, from, to, 3), staged(64, from, to, 4, 2), upload(64, to, 3)] {
                let m = p.dry_run().unwrap();
                assert!(m.schedule.races().is_empty(), "{}: {:?}", p.name, m.schedule.races());
                for out in p.checked_cells(&m) {
                    assert!(out.iter().enumerate().all(|(i, c)| c == Provenance::Input(i as u32)), "{}: {out:?}", p.name);
                }
            }
        }
        let kinds: Vec<OpKind> = one_way(64, 0, 1, 2).dry_run().unwrap().schedule.ops.iter().map(|o| o.kind).collect();
        assert_eq!(kinds.iter().filter(|k| **k == OpKind::D2d(Link { from: 0, to: 1 })).count(), 2);
        assert!(one_way(64, 0, 0, 1).dry_run().unwrap().schedule.ops.iter().any(|o| o.kind == OpKind::D2d(Link { from: 0, to: 0 })));
    }

    #[test]
    fn both_ways_run_at_once_and_staging_overlaps_down_and_up() {
        let n = 64;
        let peer = |from: u8, to: u8, e: usize| ((OpKind::D2d(Link { from, to }), e), 1.0);
        let costs = [((OpKind::H2d, n / 2), 1.0), ((OpKind::D2h, n / 2), 1.0), peer(0, 1, n / 2), peer(1, 0, n / 2)].into();
        let (s, t) = both_ways(n, 0, 1, 4).predict(Machine::engines(2), &costs).unwrap();
        let copies: Vec<(f64, f64)> = s.ops.iter().zip(&t).filter(|(o, _)| o.label == COPY).map(|(_, t)| *t).collect();
        let span = copies.iter().map(|c| c.1).fold(0.0, f64::max) - copies.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
        assert_eq!(span, 4.0, "4 copies each way at once take 4 copies' time");
        // Staged in 4 chunks: 4 downs of 1, each up of 1 behind its down: 5 in all.
        let costs = [((OpKind::H2d, n), 1.0), ((OpKind::H2d, n / 4), 1.0), ((OpKind::D2h, n / 4), 1.0)].into();
        let (s, t) = staged(n, 0, 1, 4, 1).predict(Machine::engines(2), &costs).unwrap();
        let crossing: Vec<(f64, f64)> = s.ops.iter().zip(&t).filter(|(o, _)| o.label.starts_with(COPY)).map(|(_, t)| *t).collect();
        let span = crossing.iter().map(|c| c.1).fold(0.0, f64::max) - crossing.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
        assert_eq!(span, 5.0);
    }
}
