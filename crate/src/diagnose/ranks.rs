//! Several ranks of one data-parallel step: each rank's trace (one
//! process's torch.profiler trace per GPU, as DistributedDataParallel
//! writes them) read for its communication against its computation, and
//! the ranks set side by side to find the rank the others waited for.
//!
//! - **Communication** is NCCL's kernels (a name that starts `nccl` and
//!   holds `Kernel`), **computation** every other kernel but copies,
//!   memsets and syncs: HolisticTraceAnalysis's classes, so that each
//!   rank's hidden share (communication time under computation over
//!   communication time) is HTA's communication/computation overlap.
//! - **The clocks.** Each rank's trace has its own clock. A ring
//!   all-reduce ends on every rank within microseconds, so the ranks are
//!   aligned by their collectives: rank r's k-th NCCL kernel is every
//!   rank's k-th, and rank r's clock is moved by the median over k of how
//!   much later rank 0's k-th one ended.
//! - **Waiting.** A rank whose collective kernel starts early spins until
//!   the last rank's starts: on the aligned clock, every collective's
//!   last-starting rank kept the others waiting for as long as each
//!   started before it.
//! - **The straggler** is a rank with more work than the others: its
//!   computation exceeds the least busy rank's by more than
//!   [`STRAGGLER_SHARE`] of the window, and the others waited for it in
//!   the collectives at least as long as its excess (the work cost them).
//!   Waits alone do not name one: ranks of a balanced step take turns at
//!   starting last (in the balanced programs of
//!   `data/nvidia-h200/ddp-trace/`, one rank kept the others waiting up to
//!   10% of the window with computation within 1% of theirs).
//!
//! - **The collectives by size**: each collective's message (one rank's
//!   bytes, as its NCCL kernel says) and its time on the rank that started
//!   it last (that rank waited for no one: its kernel's time is the
//!   transfer's), as NCCL's bus bandwidth (the message over that time,
//!   times 2(n-1)/n for an all-reduce over n ranks), set beside lab 8's
//!   recorded all-reduce at that size on the same GPU where the caller
//!   hands one over ([`CollectiveRates`]: the recording is the lab's, so
//!   reading ranks needs nothing of the labs).
//!
//! May use: `measure` (a median), `events` (the traces), `intervals`
//! (unions and overlaps), `link` (which recording is the traces' GPU's),
//! `units` (a size in words, the nearest recorded one).

use super::events::{GpuOp, GpuOpKind, Trace};
use super::intervals::{covered, total, union};
use super::link::same_gpu;
use crate::measure::stats::upper_median;
use crate::units::nearest_by_ratio;
use serde::Serialize;
use std::fmt;

/// Whether a kernel is NCCL's (HTA's communication kernels).
pub fn is_communication(name: &str) -> bool {
    name.starts_with("nccl") && name.contains("Kernel")
}

/// Whether a kernel is computation as HTA classes it: not NCCL's, not a
/// copy or memset, not a sync.
fn is_computation(name: &str) -> bool {
    !(is_communication(name) || name.contains("Memcpy") || name.contains("Memset") || name.ends_with("Sync"))
}

/// One rank's figures over its traced window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankFigures {
    /// The rank the trace says (`distributedInfo`), else its place in the list.
    pub rank: u32,
    pub file: String,
    /// From the first GPU op's start to the last one's end, µs.
    pub window_us: f64,
    /// Some GPU op running, µs.
    pub busy_us: f64,
    /// NCCL's kernels running, µs.
    pub communication_us: f64,
    /// Computation kernels running, µs.
    pub computation_us: f64,
    /// NCCL's kernels running under computation, µs.
    pub hidden_us: f64,
    /// NCCL kernels in the trace (a collective's part on this rank each).
    pub collectives: usize,
    /// This rank's clock moved by, µs, to line its collectives up with rank 0's.
    pub offset_us: f64,
    /// How long, over all collectives, the other ranks waited for this one
    /// (each collective it started last: how much sooner each other began), µs.
    pub kept_others_waiting_us: f64,
    /// Collectives this rank started last.
    pub started_last: usize,
}

impl RankFigures {
    pub fn idle_us(&self) -> f64 {
        self.window_us - self.busy_us
    }
    /// Communication hidden under computation, as a share of communication
    /// (HTA's communication/computation overlap).
    pub fn hidden_share(&self) -> f64 {
        if self.communication_us > 0.0 {
            self.hidden_us / self.communication_us
        } else {
            0.0
        }
    }
    pub fn exposed_us(&self) -> f64 {
        self.communication_us - self.hidden_us
    }
}

/// How much more computation than the least busy rank, as a share of the
/// window, makes a rank a straggler: the share a fix must gain to be
/// offered (`whatif`'s 5%), so that a straggler named is one worth removing.
pub const STRAGGLER_SHARE: f64 = 0.05;

/// The rank the others waited for, and why it is named.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: u32,
    /// Its computation beyond the least busy rank's, µs.
    pub extra_computation_us: f64,
    /// How long the other ranks waited for it in the collectives, µs.
    pub kept_others_waiting_us: f64,
}

/// One size of collective of the step: how many, and how fast.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveSize {
    /// NCCL's operation, as its kernel's name gives it ("AllReduce").
    pub operation: String,
    /// One rank's message, bytes.
    pub bytes: u64,
    pub count: usize,
    /// The median time of the kernel of the rank that started it last, µs.
    pub transfer_us: f64,
    /// NCCL's bus bandwidth at that time, GB/s.
    pub bus_gbps: f64,
    /// Lab 8's recorded all-reduce bus bandwidth at the recorded size
    /// nearest this one (by ratio), on the same GPU, GB/s; none where no
    /// recording was handed over, or the operation is not an all-reduce.
    pub recorded_bus_gbps: Option<f64>,
    /// The recorded size that figure is at, bytes.
    pub recorded_at_bytes: Option<u64>,
}

/// A recording of all-reduces by size (lab 8's), for [`Ranks::beside`].
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveRates {
    /// The GPU it was measured on, as its fingerprint names it.
    pub gpu_name: String,
    /// The recording, as outputs name files.
    pub source: String,
    /// The ranks it summed over.
    pub ranks: usize,
    /// (bytes a rank, the all-reduce's median time µs), by size.
    pub points: Vec<(u64, f64)>,
}

/// NCCL's bus bandwidth factor of `operation` over `n` ranks: what a
/// rank's link carries for each byte of its message.
fn bus_factor(operation: &str, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match operation {
        "AllReduce" => 2.0 * (n - 1.0) / n,
        "AllGather" | "ReduceScatter" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// The operation an NCCL kernel runs, from its name
/// ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)" is "AllReduce").
fn operation_of(kernel: &str) -> String {
    kernel.split(['_', '(']).nth(1).unwrap_or("").to_string()
}

/// The version of [`Ranks`]' JSON (`diagnose --json` on several ranks):
/// MAINTAINERS.md lists its fields.
pub const RANKS_SCHEMA: &str = "overlap-lab.ranks/1";

/// The ranks of one step, side by side, in rank order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ranks {
    /// [`RANKS_SCHEMA`].
    pub schema: &'static str,
    pub ranks: Vec<RankFigures>,
    /// The straggler, where one rank is ([`STRAGGLER_SHARE`]).
    pub straggler: Option<Straggler>,
    /// The collectives by operation and size, smallest first (those whose
    /// kernels name their message).
    pub collectives_by_size: Vec<CollectiveSize>,
    /// The recording their `recorded_bus_gbps` come from, where one was set beside them.
    pub recorded_from: Option<String>,
}

impl Ranks {
    /// The collectives set beside the recording in `rates` made on the
    /// traces' GPU (`gpu_name`), where there is one: each all-reduce size
    /// with the bus bandwidth recorded at the nearest size by ratio.
    pub fn beside(mut self, rates: &[CollectiveRates], gpu_name: &str) -> Ranks {
        let Some(r) = rates.iter().find(|r| same_gpu(&r.gpu_name, gpu_name) && !r.points.is_empty()) else { return self };
        for c in self.collectives_by_size.iter_mut().filter(|c| c.operation == "AllReduce") {
            if let Some(&(bytes, us)) = nearest_by_ratio(&r.points, |p| p.0, c.bytes).filter(|p| p.1 > 0.0) {
                c.recorded_bus_gbps = Some(bytes as f64 / us / 1e3 * bus_factor("AllReduce", r.ranks));
                c.recorded_at_bytes = Some(bytes);
            }
        }
        self.recorded_from = Some(format!("{} ({} GPUs)", r.source, r.ranks));
        self
    }
}

/// The ranks of `traces` (each a rank's trace, with the name to show it
/// by): a one-line error where they cannot be one step's ranks (fewer than
/// two, a rank twice, no NCCL kernels, or not as many on each).
pub fn read_ranks(traces: &[(String, Trace)]) -> Result<Ranks, String> {
    if traces.len() < 2 {
        return Err(format!("{} trace(s): several ranks need a trace each, two at least", traces.len()));
    }
    // Each rank's figures and its NCCL kernels, in start order.
    let mut read: Vec<(RankFigures, Vec<&GpuOp>)> = Vec::new();
    for (k, (file, t)) in traces.iter().enumerate() {
        let rank = t.distributed.map_or(k as u32, |d| d.rank);
        if let Some((other, _)) = read.iter().find(|(r, _)| r.rank == rank) {
            return Err(format!("{file} and {} are both rank {rank}", other.file));
        }
        let kernels = t.gpu_ops.iter().filter(|o| o.kind == GpuOpKind::Kernel);
        let mut nccl: Vec<&GpuOp> = kernels.clone().filter(|o| is_communication(&o.name)).collect();
        if nccl.is_empty() {
            return Err(format!("{file}: no NCCL kernel: not a rank of a step that communicates"));
        }
        nccl.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        let compute = union(kernels.filter(|o| is_computation(&o.name)).map(|o| (o.start_us, o.end_us)).collect());
        let comm_merged = union(nccl.iter().map(|o| (o.start_us, o.end_us)).collect());
        let (from, to) = t.window_us();
        let figures = RankFigures {
            rank,
            file: file.clone(),
            window_us: to - from,
            busy_us: total(&union(t.gpu_ops.iter().map(|o| (o.start_us, o.end_us)).collect())),
            communication_us: total(&comm_merged),
            computation_us: total(&compute),
            hidden_us: comm_merged.iter().map(|&s| covered(&compute, s)).sum(),
            collectives: nccl.len(),
            offset_us: 0.0,
            kept_others_waiting_us: 0.0,
            started_last: 0,
        };
        read.push((figures, nccl));
    }
    // In rank order: the lowest rank's clock is the one the others are lined up with.
    read.sort_by_key(|(r, _)| r.rank);
    let (mut ranks, parts): (Vec<RankFigures>, Vec<Vec<&GpuOp>>) = read.into_iter().unzip();
    if let Some(r) = ranks.iter().find(|r| r.collectives != ranks[0].collectives) {
        return Err(format!("{} has {} NCCL kernels and {} has {}: not the same step's ranks", r.file, r.collectives, ranks[0].file, ranks[0].collectives));
    }
    // Each rank's clock lined up with the lowest rank's by its collectives' ends.
    for r in 1..ranks.len() {
        let gaps: Vec<f64> = parts[0].iter().zip(&parts[r]).map(|(a, b)| a.end_us - b.end_us).collect();
        ranks[r].offset_us = upper_median(&gaps).unwrap_or(0.0);
    }
    // Each collective: the rank that started last kept the others waiting,
    // and its kernel's time is the transfer's.
    let mut by_size: std::collections::BTreeMap<(String, u64), Vec<f64>> = std::collections::BTreeMap::new();
    for k in 0..ranks[0].collectives {
        let starts: Vec<f64> = parts.iter().zip(&ranks).map(|(p, r)| p[k].start_us + r.offset_us).collect();
        let last = (0..starts.len()).max_by(|&a, &b| starts[a].total_cmp(&starts[b])).unwrap_or(0);
        ranks[last].started_last += 1;
        ranks[last].kept_others_waiting_us += starts.iter().map(|s| starts[last] - s).sum::<f64>();
        // Its message as the lowest rank's kernel names it.
        if let Some(bytes) = parts[0][k].bytes {
            by_size.entry((operation_of(&parts[0][k].name), bytes)).or_default().push(parts[last][k].duration_us());
        }
    }
    let world = traces.iter().find_map(|(_, t)| t.distributed.map(|d| d.world_size as usize)).unwrap_or(ranks.len());
    let collectives_by_size = by_size
        .into_iter()
        .filter_map(|((operation, bytes), times)| {
            let transfer_us = upper_median(&times)?;
            Some(CollectiveSize {
                bus_gbps: if transfer_us > 0.0 { bytes as f64 / transfer_us / 1e3 * bus_factor(&operation, world) } else { 0.0 },
                operation,
                bytes,
                count: times.len(),
                transfer_us,
                recorded_bus_gbps: None,
                recorded_at_bytes: None,
            })
        })
        .collect();
    let straggler = straggler_of(&ranks);
    Ok(Ranks { schema: RANKS_SCHEMA, ranks, straggler, collectives_by_size, recorded_from: None })
}

/// The rank with the most computation, where it exceeds the least busy
/// rank's by more than [`STRAGGLER_SHARE`] of the window and the others
/// waited for it at least that long.
fn straggler_of(ranks: &[RankFigures]) -> Option<Straggler> {
    let least = ranks.iter().map(|r| r.computation_us).fold(f64::INFINITY, f64::min);
    let most = ranks.iter().max_by(|a, b| a.computation_us.total_cmp(&b.computation_us))?;
    let extra = most.computation_us - least;
    (extra > STRAGGLER_SHARE * most.window_us && most.kept_others_waiting_us >= extra).then_some(Straggler {
        rank: most.rank,
        extra_computation_us: extra,
        kept_others_waiting_us: most.kept_others_waiting_us,
    })
}

impl fmt::Display for Ranks {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let ms = |us: f64| us / 1e3;
        writeln!(f, "{} ranks, their clocks lined up by their collectives", self.ranks.len())?;
        writeln!(
            f,
            "  {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>11} {:>10} {:>12}  trace",
            "rank", "window", "busy", "idle", "comm", "exposed", "hidden", "collectives", "last in", "others wait"
        )?;
        for r in &self.ranks {
            writeln!(
                f,
                "  {:>4} {:>7.2} ms {:>7.2} ms {:>7.2} ms {:>7.2} ms {:>7.2} ms {:>7.1}% {:>11} {:>10} {:>9.2} ms  {}",
                r.rank,
                ms(r.window_us),
                ms(r.busy_us),
                ms(r.idle_us()),
                ms(r.communication_us),
                ms(r.exposed_us()),
                100.0 * r.hidden_share(),
                r.collectives,
                r.started_last,
                ms(r.kept_others_waiting_us),
                r.file
            )?;
        }
        writeln!(f, "  (comm: NCCL's kernels; hidden: their time under computation kernels, HTA's communication/computation overlap; last in: collectives this rank started last; others wait: how long the other ranks waited in those)")?;
        for c in &self.collectives_by_size {
            let recorded = match (c.recorded_bus_gbps, c.recorded_at_bytes) {
                (Some(g), Some(at)) => format!("; lab 8 recorded {g:.1} GB/s at {}", crate::units::Bytes(at)),
                _ => String::new(),
            };
            writeln!(
                f,
                "{} of {}: {} in the traces, {:.1} µs each on the rank that started it last: {:.1} GB/s of bus bandwidth{recorded}",
                c.operation,
                crate::units::Bytes(c.bytes),
                c.count,
                c.transfer_us,
                c.bus_gbps
            )?;
        }
        if let Some(from) = &self.recorded_from {
            writeln!(f, "  (lab 8's recording: {from})")?;
        }
        match &self.straggler {
            Some(s) => writeln!(
                f,
                "straggler: rank {}: {:.2} ms more computation than the least busy rank; the others waited {:.2} ms for it",
                s.rank,
                ms(s.extra_computation_us),
                ms(s.kept_others_waiting_us)
            ),
            None => writeln!(
                f,
                "no straggler: no rank's computation exceeds another's by {:.0}% of the window with the others waiting for it",
                100.0 * STRAGGLER_SHARE
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::Distributed;

    /// A rank's trace: compute kernels on stream 7 and NCCL's on stream 17,
    /// each (name, start, end) in µs on that rank's clock.
    fn rank(rank: u32, kernels: &[(&str, f64, f64)]) -> (String, Trace) {
        let mut t = Trace { distributed: Some(Distributed { rank, world_size: 2 }), ..Trace::default() };
        for &(name, start_us, end_us) in kernels {
            let stream = if is_communication(name) { 17 } else { 7 };
            t.gpu_ops.push(GpuOp { gpu: 0, stream, kind: GpuOpKind::Kernel, name: name.into(), start_us, end_us, correlation: None, bytes: None });
        }
        t.gpu_ops.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        (format!("rank{rank}.json"), t)
    }

    const NCCL: &str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";

    #[test]
    fn each_ranks_hidden_share_and_who_kept_the_others_waiting_on_clocks_lined_up_by_collectives() {
        // Rank 0: compute 0-100; its sum starts at 50 and ends at 130 (it
        // waited for rank 1, whose sum started 20 µs later on the common clock).
        // Rank 1's clock runs 1000 µs ahead: compute 1000-1100, its sum 1070-1130.
        let r0 = rank(0, &[("gemm", 0.0, 100.0), (NCCL, 50.0, 130.0)]);
        let r1 = rank(1, &[("gemm", 1000.0, 1100.0), (NCCL, 1070.0, 1130.0)]);
        let ranks = read_ranks(&[r1.clone(), r0.clone()]).unwrap();
        let (a, b) = (&ranks.ranks[0], &ranks.ranks[1]);
        assert_eq!((a.rank, b.rank), (0, 1), "in rank order, whatever the files' order");
        assert_eq!((a.communication_us, a.hidden_us, a.exposed_us()), (80.0, 50.0, 30.0));
        assert!((a.hidden_share() - 0.625).abs() < 1e-12 && (b.hidden_share() - 0.5).abs() < 1e-12);
        assert_eq!((a.window_us, a.busy_us, a.idle_us()), (130.0, 130.0, 0.0));
        assert_eq!(b.offset_us, -1000.0, "rank 1's clock lined up by the sum's end");
        assert_eq!((b.started_last, b.kept_others_waiting_us, a.started_last), (1, 20.0, 0));
        let text = ranks.to_string();
        assert!(text.contains("62.5%") && text.contains("rank1.json") && text.contains("no straggler"), "{text}");
        assert_eq!(ranks.straggler, None, "the same computation on both ranks");
    }

    /// A straggler is named only where a rank has more work and the others
    /// waited for it: not for waits alone (a rank that starts its sum late
    /// with no more work), nor for more work that kept no one waiting.
    #[test]
    fn the_rank_with_more_work_that_the_others_waited_for_is_the_straggler() {
        let r0 = rank(0, &[("gemm", 0.0, 100.0), (NCCL, 50.0, 160.0)]);
        let more_work = rank(1, &[("gemm", 0.0, 100.0), ("gemm", 100.0, 140.0), (NCCL, 140.0, 160.0)]);
        let s = read_ranks(&[r0.clone(), more_work]).unwrap();
        assert_eq!(s.straggler, Some(Straggler { rank: 1, extra_computation_us: 40.0, kept_others_waiting_us: 90.0 }));
        assert!(s.to_string().contains("straggler: rank 1: 0.04 ms more computation"), "{s}");
        let late_only = rank(1, &[("gemm", 0.0, 100.0), (NCCL, 140.0, 160.0)]);
        assert_eq!(read_ranks(&[r0.clone(), late_only]).unwrap().straggler, None, "waits alone");
        let unseen = rank(1, &[("gemm", 0.0, 140.0), (NCCL, 50.0, 160.0)]);
        assert_eq!(read_ranks(&[r0, unseen]).unwrap().straggler, None, "more work no one waited for");
    }

    /// Each size's collectives timed on the rank that started them last
    /// (it waited for no one), as bus bandwidth, and set beside the
    /// recording of the traces' GPU only, at its nearest size by ratio.
    #[test]
    fn collectives_by_size_are_timed_on_the_last_rank_to_start_and_set_beside_the_recording() {
        let mib = 1u64 << 20;
        let with_bytes = |(name, mut t): (String, Trace), bytes: &[u64]| {
            for (o, b) in t.gpu_ops.iter_mut().filter(|o| is_communication(&o.name)).zip(bytes) {
                o.bytes = Some(*b);
            }
            (name, t)
        };
        // Two 4 MiB sums and one of 16 MiB; rank 1 starts each 20 µs after rank 0.
        let r0 = with_bytes(rank(0, &[("gemm", 0.0, 300.0), (NCCL, 10.0, 60.0), (NCCL, 100.0, 150.0), (NCCL, 200.0, 300.0)]), &[4 * mib, 4 * mib, 16 * mib]);
        let r1 = with_bytes(rank(1, &[("gemm", 0.0, 300.0), (NCCL, 30.0, 60.0), (NCCL, 120.0, 150.0), (NCCL, 220.0, 300.0)]), &[4 * mib, 4 * mib, 16 * mib]);
        let ranks = read_ranks(&[r0, r1]).unwrap();
        let sizes: Vec<(&str, u64, usize, f64)> = ranks.collectives_by_size.iter().map(|c| (c.operation.as_str(), c.bytes, c.count, c.transfer_us)).collect();
        assert_eq!(sizes, vec![("AllReduce", 4 * mib, 2, 30.0), ("AllReduce", 16 * mib, 1, 80.0)]);
        // Two ranks: the bus carries the message once (2(n-1)/n = 1).
        assert!((ranks.collectives_by_size[0].bus_gbps - 4.0 * mib as f64 / 30.0 / 1e3).abs() < 1e-9);
        let rates = vec![
            CollectiveRates { gpu_name: "Other GPU".into(), source: "x.json".into(), ranks: 4, points: vec![(4 * mib, 1.0)] },
            CollectiveRates { gpu_name: "NVIDIA H200".into(), source: "multi-gpu.json".into(), ranks: 4, points: vec![(mib, 10.0), (8 * mib, 40.0)] },
        ];
        let beside = ranks.clone().beside(&rates, " nvidia h200 ");
        let c = &beside.collectives_by_size;
        // 4 MiB is nearer 8 MiB than 1 MiB by ratio; four ranks: 2(n-1)/n = 1.5.
        assert_eq!((c[0].recorded_at_bytes, c[1].recorded_at_bytes), (Some(8 * mib), Some(8 * mib)));
        assert!((c[0].recorded_bus_gbps.unwrap() - 8.0 * mib as f64 / 40.0 / 1e3 * 1.5).abs() < 1e-9);
        let text = beside.to_string();
        assert!(text.contains("AllReduce of 4 MiB: 2 in the traces") && text.contains("multi-gpu.json (4 GPUs)"), "{text}");
        assert_eq!(ranks.clone().beside(&rates, "NVIDIA A100").recorded_from, None, "no recording of that GPU");
        assert_eq!(operation_of("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)"), "AllGather");
    }

    #[test]
    fn traces_that_are_not_one_steps_ranks_are_one_line_errors() {
        let r0 = rank(0, &[("gemm", 0.0, 100.0), (NCCL, 50.0, 130.0)]);
        let e = |traces: &[(String, Trace)]| read_ranks(traces).unwrap_err();
        assert!(e(std::slice::from_ref(&r0)).contains("two at least"));
        assert!(e(&[r0.clone(), r0.clone()]).contains("both rank 0"));
        let quiet = rank(1, &[("gemm", 0.0, 100.0)]);
        assert!(e(&[r0.clone(), quiet]).contains("rank1.json: no NCCL kernel"));
        let more = rank(1, &[(NCCL, 0.0, 10.0), (NCCL, 20.0, 30.0)]);
        assert!(e(&[r0.clone(), more]).contains("not the same step's ranks"));
        for t in [e(std::slice::from_ref(&r0)), e(&[r0.clone(), r0])] {
            assert!(!t.contains('\n'), "{t}");
        }
    }
}
