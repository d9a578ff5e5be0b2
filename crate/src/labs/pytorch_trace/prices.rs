//! What lab 10 prices a trace's fixes by on this machine (the what-if's
//! `Pricing`): the host link's rates lab 1 recorded for each GPU, and the
//! gap between a CUDA graph's kernels each GPU's lab 10 recording
//! measured, what a DataLoader with workers cost its loop per batch, what
//! its profiler added to each CPU op it recorded, and how its kernels slow
//! on a GPU kept busy (its busy-clock calibration). Read once from a data folder ([`Prices::read`]) and asked for
//! one GPU at a time ([`Prices::for_gpu`]); `overlap-lab diagnose`
//! prices a learner's own trace the same way ([`Prices::diagnose`]).
//!
//! This is the one place lab 1's recordings are read for another lab: the
//! adapter from lab 1's results to the diagnosis's `LinkRates`.
//!
//! May use: `diagnose`, `labs::bandwidth`'s results, `measure`.

use super::programs::{read_programs, Programs, PROGRAMS_FILE};
use super::LAB;
use crate::diagnose::link::assumed_rates;
use crate::diagnose::busy_clock::{BusyClock, BusyPhase};
use crate::diagnose::replay::{BatchHandover, GraphPrice, Pricing};
use crate::diagnose::{Diagnosis, LinkRates, Trace};
use crate::error::{LabError, Result};
use crate::gpu::HostMemoryKind;
use crate::labs::bandwidth::{self, BandwidthResults};
use crate::measure::record::display_path;
use crate::measure::stats::{never_falling, upper_median};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The busy-clock calibration's file in a lab 10 recording's folder, as
/// `crate/reference/busy_clock_probe.py --out` writes it.
pub const BUSY_CLOCK_FILE: &str = "busy_clock.json";

/// A data folder's prices, read once.
#[derive(Clone, Debug, Default)]
pub struct Prices {
    /// Every lab 1 recording's link rates, a GPU each.
    pub links: Vec<LinkRates>,
    /// Each lab 10 recording's own prices, by its GPU, with its folder.
    recorded: Vec<(String, PathBuf, RecordedPrices)>,
}

/// What one lab 10 recording prices a trace by: its graph price, the
/// profiler's cost per recorded CPU op ([`profiler_cost_us`]: µs, and its
/// file as outputs name it) and a DataLoader's cost per batch handed over
/// ([`batch_handover`]), and its GPU's busy clock ([`read_busy_clock`]);
/// each where the recording has it.
#[derive(Clone, Debug, Default)]
pub struct RecordedPrices {
    pub graph: Option<GraphPrice>,
    pub profiler_us_per_cpu_op: Option<(f64, String)>,
    pub batch_handover: Option<BatchHandover>,
    pub busy_clock: Option<BusyClock>,
}

impl RecordedPrices {
    /// The prices of the recording `programs`, read from the folder `dir`.
    pub fn of(programs: &Programs, dir: &Path) -> RecordedPrices {
        let from = display_path(&dir.join(PROGRAMS_FILE));
        // A calibration that cannot be read costs its own price, not the what-if.
        let busy_clock = read_busy_clock(dir, programs.gpu.as_deref()).unwrap_or_else(|e| {
            eprintln!("overlap-lab: warning: kernels are priced at their traced clock: {e}");
            None
        });
        RecordedPrices {
            graph: programs.calibration.as_ref().and_then(|c| c.graph_price(from.clone())),
            profiler_us_per_cpu_op: profiler_cost_us(programs).map(|cost| (cost, from.clone())),
            batch_handover: batch_handover(programs, from),
            busy_clock,
        }
    }

    /// `pricing` with each of these prices that the recording has in
    /// place of its own.
    pub fn over(&self, pricing: Pricing) -> Pricing {
        Pricing {
            graph: self.graph.clone().or(pricing.graph),
            profiler_us_per_cpu_op: self.profiler_us_per_cpu_op.clone().or(pricing.profiler_us_per_cpu_op),
            batch_handover: self.batch_handover.clone().or(pricing.batch_handover),
            busy_clock: self.busy_clock.clone().or(pricing.busy_clock),
            ..pricing
        }
    }
}

/// What the profiler added to each CPU op it recorded, µs, as a lab 10
/// recording's programs show it: over the programs timed both ways, their
/// traced runs' host time less their untraced runs' medians, over the CPU
/// ops their traces hold (never below nothing). Added up before dividing,
/// so the programs the CPU bounds, with the most ops, weigh most: a
/// program the GPU bounds hides the profiler's cost under its GPU work.
/// None where no program has both times and a count of CPU ops.
pub fn profiler_cost_us(programs: &Programs) -> Option<f64> {
    let (extra_ms, ops) = programs
        .programs
        .values()
        .filter_map(|p| {
            let untraced = upper_median(&p.untraced.host_ms.as_ref()?.samples)?;
            let ops = *p.trace_facts.as_ref()?.events.get("cpu_op")?;
            Some((p.traced_host_ms? - untraced, ops))
        })
        .fold((0.0, 0u64), |(e, n), (x, k)| (e + x, n + k));
    (ops > 0).then(|| (extra_ms * 1e3 / ops as f64).max(0.0))
}

/// What a DataLoader with workers cost its loop per batch, as the lab 10
/// recording `programs` (its file named `from`) measured it; none where
/// it has no such calibration.
pub fn batch_handover(programs: &Programs, from: String) -> Option<BatchHandover> {
    let c = programs.calibration.as_ref()?;
    let (worker_us, loop_us) = c.handover()?;
    // The loop's own share and the first batch's wait, where the
    // recording has them (older ones do not: a lower bound).
    let (taken_over_us, first_batch_us) = (c.handover_taken_over_us.unwrap_or(0.0), c.handover_first_batch_us.unwrap_or(0.0));
    let busy_loop_us = c.handover_loop_work_us.unwrap_or(0.0);
    let mut per_batch_by_loop_work: Vec<(f64, f64)> =
        c.handover_by_loop_work.iter().flatten().map(|p| (p.loop_work_us, p.per_batch_us)).filter(|&(w, t)| w >= 0.0 && t > 0.0).collect();
    per_batch_by_loop_work.sort_by(|a, b| a.0.total_cmp(&b.0));
    // More of the loop's own work never brings its batches sooner.
    never_falling(&mut per_batch_by_loop_work);
    Some(BatchHandover { worker_us, loop_us, taken_over_us, busy_loop_us, per_batch_by_loop_work, first_batch_us, from })
}

/// The fields of a busy-clock recording ([`BUSY_CLOCK_FILE`]) the what-if
/// reads; the rest (each phase's steps, clocks and power) are its evidence.
#[derive(Deserialize)]
struct BusyClockRecording {
    gpu: Option<String>,
    by_gap: Vec<BusyClockRow>,
}

/// One gap length's phases, as the recording sums them up.
#[derive(Deserialize)]
struct BusyClockRow {
    gap_ms: f64,
    step_ms: f64,
    idle_ms: f64,
}

/// The busy-clock calibration in the lab 10 recording folder `dir`
/// ([`BUSY_CLOCK_FILE`]), for the GPU named `gpu` (the recording's): none
/// where the folder has none, or where its step ran no faster after idle
/// gaps than kept busy (nothing to price: [`BusyClock::from_phases`]);
/// `Err` where it cannot be read, is not one, was measured on another GPU,
/// or has fewer than two gap lengths.
pub fn read_busy_clock(dir: &Path, gpu: Option<&str>) -> Result<Option<BusyClock>> {
    let path = dir.join(BUSY_CLOCK_FILE);
    let shown = display_path(&path);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LabError::io(format!("reading {shown}"), e)),
    };
    let bad = |reason: String| LabError::BadData { path: shown.clone(), reason };
    let recording: BusyClockRecording = serde_json::from_str(&text).map_err(|e| bad(format!("not a busy-clock recording: {e}")))?;
    if let (Some(theirs), Some(ours)) = (&recording.gpu, gpu) {
        if theirs != ours {
            return Err(bad(format!("measured on {theirs}, not on the recording's {ours}")));
        }
    }
    let busy = recording.by_gap.iter().find(|r| r.gap_ms == 0.0).ok_or_else(|| bad("no phase kept busy (gap_ms 0)".into()))?;
    let gapped: Vec<BusyPhase> =
        recording.by_gap.iter().filter(|r| r.gap_ms > 0.0).map(|r| BusyPhase { idle_us: r.idle_ms * 1e3, step_us: r.step_ms * 1e3 }).collect();
    if gapped.len() < 2 {
        return Err(bad("fewer than two gap lengths: no curve to read".into()));
    }
    Ok(BusyClock::from_phases(busy.step_ms * 1e3, &gapped, shown.clone()))
}

impl Prices {
    /// The prices the recordings under `data` give. A recording that
    /// cannot be read costs its own prices, not the diagnosis: a warning
    /// says so.
    pub fn read(data: &Path) -> Prices {
        let links = recorded_link_rates(data).unwrap_or_else(|e| {
            eprintln!("overlap-lab: warning: copies are not set beside lab 1's rates: {e}");
            Vec::new()
        });
        // Folder by folder: one that cannot be read costs its own figures only.
        let recorded = std::fs::read_dir(data)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join(LAB))
            .filter(|d| d.join(PROGRAMS_FILE).is_file())
            .filter_map(|dir| {
                let programs = read_programs(&dir).ok()?;
                let prices = RecordedPrices::of(&programs, &dir);
                Some((programs.gpu.clone()?, dir, prices))
            })
            .collect();
        Prices { links, recorded }
    }

    /// The what-if's prices for a trace of the GPU named `gpu`: its link's
    /// rates and its graph gap, where these recordings have them.
    pub fn for_gpu(&self, gpu: Option<&str>) -> Pricing {
        let linked = Pricing { rates: gpu.and_then(|n| self.links.iter().find(|l| l.matches(n)).cloned()), ..Pricing::default() };
        match gpu.and_then(|n| self.recorded.iter().find(|r| r.0 == n)) {
            Some((_, _, prices)) => prices.over(linked),
            None => linked,
        }
    }

    /// The own prices of the recording in the folder `dir`, where these
    /// prices were read from a data folder that holds it (each read once).
    pub fn recorded_in(&self, dir: &Path) -> Option<&RecordedPrices> {
        self.recorded.iter().find(|r| r.1 == dir).map(|r| &r.2)
    }

    /// The what-if's prices for `trace`: its GPU's, where these recordings
    /// have its link; else the rates assumed from the trace's own pinned
    /// copies or its GPU's typical link, said to be assumed
    /// ([`crate::diagnose::link::assumed_rates`]): every fix is priced.
    pub fn for_trace(&self, trace: &Trace) -> Pricing {
        let mut pricing = self.for_gpu(trace.first_gpu_name());
        pricing.rates = pricing.rates.or_else(|| Some(assumed_rates(trace)));
        pricing
    }

    /// The diagnosis of `trace` (named `shown` in outputs) beside these
    /// link rates, its what-if priced for the trace's GPU ([`Prices::for_trace`]):
    /// what `overlap-lab diagnose` prints.
    /// `workers`: how many prepare the batches ahead in that fix (none:
    /// the what-if's default).
    pub fn diagnose(&self, trace: &Trace, shown: &str, workers: Option<usize>) -> Diagnosis {
        let pricing = Pricing { workers, ..self.for_trace(trace) };
        diagnosis_priced(trace, shown, &self.links, &pricing)
    }
}

/// The diagnosis of `trace` beside `links`, its what-if priced by `pricing`.
pub fn diagnosis_priced(trace: &Trace, shown: &str, links: &[LinkRates], pricing: &Pricing) -> Diagnosis {
    let mut d = crate::diagnose::diagnose(trace, shown, links);
    match crate::diagnose::whatif::what_if(trace, &d, pricing) {
        Ok(w) => d.what_if = Some(w),
        Err(e) => d.what_if_error = Some(e),
    }
    d
}

/// Every lab 1 recording in `data` as the host link's rates, for the
/// trace diagnosis (`overlap-lab diagnose`, lab 10): pageable and pinned
/// copies each way, at every size measured. No recording is no rates;
/// `Err` where one cannot be read.
pub fn recorded_link_rates(data: &Path) -> Result<Vec<LinkRates>> {
    use crate::diagnose::events::{Direction as TracedDirection, HostMemory};
    use crate::diagnose::LinkPoint;
    use bandwidth::Direction;
    let recordings = match crate::measure::record::find_recordings::<BandwidthResults>(data, bandwidth::LAB) {
        Ok(r) => r,
        Err(LabError::MissingData { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(recordings
        .into_iter()
        .map(|(path, rec)| LinkRates {
            gpu_name: rec.fingerprint.gpu_name.clone(),
            source: crate::measure::record::display_path(&path),
            points: rec
                .results
                .transfers
                .iter()
                .filter_map(|p| {
                    let host = match p.kind {
                        HostMemoryKind::Pageable => HostMemory::Pageable,
                        HostMemoryKind::Pinned => HostMemory::Pinned,
                        _ => return None,
                    };
                    let direction = match p.direction {
                        Direction::H2d => TracedDirection::H2d,
                        Direction::D2h => TracedDirection::D2h,
                        Direction::Bidirectional => return None,
                    };
                    Some(LinkPoint { host, direction, bytes: p.bytes.get(), gbps: p.gbps.median })
                })
                .collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::events::HostMemory;
    use crate::diagnose::link::{TypicalLink, MEASURE_LINK};
    use crate::diagnose::replay::{schedule, Change};
    use crate::labs::pytorch_trace::fixture::{on_stranger_gpu, BATCH_BYTES, STRANGER_GPU, STRANGER_PINNED_GBPS};

    /// The stranger's loop with `pinned` pinned copies, diagnosed with no
    /// recording of its GPU here.
    fn stranger(pinned: usize) -> (Trace, Diagnosis, Pricing) {
        let text = serde_json::to_string(&on_stranger_gpu(10, pinned)).unwrap();
        let trace = crate::diagnose::read_trace_text("stranger.json", &text).unwrap();
        assert_eq!(trace.first_gpu_name(), Some(STRANGER_GPU));
        let prices = Prices::default();
        (trace.clone(), prices.diagnose(&trace, "stranger.json", None), prices.for_trace(&trace))
    }

    /// The pinned fix's time for the loop's first pageable copy, µs.
    fn pinned_copy_us(trace: &Trace, pricing: &Pricing) -> f64 {
        let first = trace.gpu_ops.iter().position(|o| o.kind.label() == "H2D pageable").unwrap();
        let ts = schedule(trace, &[Change::Pinned], pricing).unwrap();
        let at = ts.traced_op.iter().position(|&o| o == Some(first)).unwrap();
        ts.durations_us[at]
    }

    #[test]
    fn a_strangers_pageable_loop_is_priced_by_its_links_typical_rate_said_to_be_assumed() {
        let (trace, d, pricing) = stranger(0);
        let w = d.what_if.as_ref().expect("predicted");
        assert!(w.not_priced.is_empty(), "{:?}", w.not_priced);
        let pinned = w.predictions.iter().find(|p| p.changes == [Change::Pinned]).expect("the pinned fix is priced");
        assert!(pinned.gain > 1.0, "{pinned:?}");
        let by = pinned.priced_by.as_deref().unwrap();
        assert!(by.contains("PCIe Gen4 x16") && by.contains("~25 GB/s") && by.contains("an assumption") && by.contains(MEASURE_LINK), "{by}");
        // By hand: 64 MiB after a 2.5 µs fixed cost at 25 GB/s: 2.5 + 67108864 / 25e3 = 2686.85 µs.
        assert!((pinned_copy_us(&trace, &pricing) - 2686.85).abs() < 0.01);
        let text = d.to_string();
        assert!(text.contains(MEASURE_LINK) && text.contains("pin_memory()") && !text.contains("lab 1 recording"), "{text}");
        let link = TypicalLink::of(Some(STRANGER_GPU));
        assert_eq!((link.generation, link.gbps, link.from_name), (4, 25.0, true));
        assert!((link.rate(crate::diagnose::events::Direction::H2d, 4 << 20) - 24.633).abs() < 1e-3);
        assert_eq!(TypicalLink::of(Some("NVIDIA H200")).generation, 5);
        assert_eq!(TypicalLink::of(Some("NVIDIA RTX 5000 Ada Generation")).generation, 4);
        assert_eq!(TypicalLink::of(Some("Tesla V100-SXM2-16GB")).gbps, 12.0);
        assert!(!TypicalLink::of(Some("Some Future GPU")).from_name);
    }

    #[test]
    fn a_strangers_own_pinned_copies_price_its_pageable_ones() {
        let (trace, d, pricing) = stranger(3);
        let pinned = d.what_if.as_ref().unwrap().predictions.iter().find(|p| p.changes == [Change::Pinned]).expect("priced").clone();
        let by = pinned.priced_by.unwrap();
        assert!(by.contains("this trace's own pinned copies (H2D 64 MiB at 22.0 GB/s)"), "{by}");
        let rates = pricing.rates.as_ref().unwrap();
        assert!((rates.rate(HostMemory::Pinned, crate::diagnose::events::Direction::H2d, BATCH_BYTES).unwrap().gbps - STRANGER_PINNED_GBPS).abs() < 1e-3);
        // By hand: 67108864 bytes at 22 GB/s: 3050.4 µs.
        assert!((pinned_copy_us(&trace, &pricing) - 3050.40).abs() < 0.01);
        // A copy 16x smaller is far from the trace's: the typical link prices it.
        assert!((rates.rate(HostMemory::Pinned, crate::diagnose::events::Direction::H2d, 4 << 20).unwrap().gbps - 24.633).abs() < 1e-3);
    }

    #[test]
    fn the_profilers_cost_per_cpu_op_is_the_programs_traced_less_untraced_time_over_their_ops() {
        let program = |traced: Option<f64>, untraced: &[f64], ops: Option<u64>| {
            serde_json::json!({"what": "w", "iterations": 3, "trace": "t.json.gz",
                "untraced": {"host_ms": {"samples": untraced}}, "traced_host_ms": traced,
                "trace_facts": {"events": ops.map_or(serde_json::json!({}), |n| serde_json::json!({"cpu_op": n}))}})
        };
        let programs = |list: serde_json::Value| -> Programs {
            serde_json::from_value(serde_json::json!({"command": "c", "date": "d", "torch": "t", "programs": list})).unwrap()
        };
        // (12 - 10) + (33 - 30) + (9.5 - 10) = 4.5 ms over 1000 + 500 +
        // 1000 ops: 1.8 µs (the programs with the most ops weigh most). One
        // with no count of ops and one never traced do not count.
        let p = programs(serde_json::json!({
            "pageable_then_compute": program(Some(12.0), &[9.0, 10.0, 11.0], Some(1000)),
            "pinned_one_stream": program(Some(33.0), &[30.0], Some(500)),
            "pinned_double_buffered": program(Some(9.5), &[10.0], Some(1000)),
            "tiny_ops_graph": program(Some(50.0), &[10.0], None),
            "tiny_ops": program(None, &[10.0], Some(10)),
        }));
        assert!((profiler_cost_us(&p).unwrap() - 1.8).abs() < 1e-9, "{:?}", profiler_cost_us(&p));
        // A recording where the profiler seems to cost nothing: none, not less.
        let p = programs(serde_json::json!({"pinned_double_buffered": program(Some(9.5), &[10.0], Some(1000))}));
        assert_eq!(profiler_cost_us(&p), Some(0.0));
        let p = programs(serde_json::json!({"tiny_ops": program(None, &[10.0], Some(10))}));
        assert_eq!(profiler_cost_us(&p), None);
    }

    #[test]
    fn the_h200s_busy_clock_is_read_from_its_recording() {
        let dir = crate::measure::record::repo_root().join("data/nvidia-h200").join(LAB);
        let clock = read_busy_clock(&dir, Some("NVIDIA H200")).unwrap().expect("the H200 recording has a busy clock");
        // The figures data/nvidia-h200/README.md quotes: 1.041x kept busy, all of
        // it won back from the 0.38 ms gaps' phase (idle 20% of its time).
        assert!((clock.slowdown - 1.041).abs() < 5e-4, "{}", clock.slowdown);
        assert!((clock.full_speed_idle_share() - 0.201).abs() < 5e-4, "{}", clock.full_speed_idle_share());
        let first_whole = clock.recovery_by_gap.iter().find(|p| p.1 >= 1.0).unwrap().0;
        assert!((first_whole - 382.0).abs() < 1.0, "{first_whole} µs");
        assert_eq!(clock.from, "data/nvidia-h200/pytorch-trace/busy_clock.json");
        // The recording's own pricing carries it.
        let data = crate::measure::record::repo_root().join("data");
        let recording = crate::labs::pytorch_trace::Recording::priced(&dir, Prices::read(&data)).unwrap();
        assert_eq!(recording.pricing().busy_clock.as_ref(), Some(&clock));
        let prices = Prices::read(&data);
        assert_eq!(prices.for_gpu(Some("NVIDIA H200")).busy_clock.as_ref(), Some(&clock));
        // The fixed download loop never idles long: its kernels run the whole
        // slowdown over the "before" loop's, idle a third of its window in
        // long gaps. The tiny-op loop's gaps are too short to win much back,
        // as its graph's are: its kernels keep their traced time within 0.5%.
        let factor = |program: &str, fix: &str| {
            let trace = crate::diagnose::read_trace(&dir.join(format!("{program}.json.gz")), &mut |_, _| {}).unwrap();
            let d = prices.diagnose(&trace, program, None);
            let w = d.what_if.unwrap();
            assert_eq!(w.busy_clock, Some(clock.says()));
            w.predictions.iter().find(|p| p.fix == fix).unwrap_or_else(|| panic!("{program}: no {fix}")).kernel_clock_factor
        };
        let downloads = factor("results_cpu_each_step", "pinned + download stream + read a step late");
        assert!((downloads - clock.slowdown).abs() < 1e-3, "{downloads}");
        let graph = factor("tiny_ops", "CUDA graph");
        assert!((graph - 1.0).abs() < 5e-3, "{graph}");
    }

    #[test]
    fn a_busy_clock_that_cannot_be_read_is_an_error_naming_its_file_and_none_is_no_clock() {
        let dir = crate::testing::temp_dir("busy-clock");
        assert_eq!(read_busy_clock(&dir, Some("NVIDIA H200")).unwrap(), None, "no file: no calibration");
        let row = |gap: f64, step: f64| serde_json::json!({"gap_ms": gap, "step_ms": step, "idle_ms": gap + 0.05, "busy_share": 0.9});
        let write = |v: serde_json::Value| std::fs::write(dir.join(BUSY_CLOCK_FILE), v.to_string()).unwrap();
        let cases = [
            (serde_json::json!("not a recording"), "not a busy-clock recording"),
            (serde_json::json!({"gpu": "NVIDIA A100", "by_gap": [row(0.0, 1.6), row(0.5, 1.5), row(1.0, 1.5)]}), "measured on NVIDIA A100"),
            (serde_json::json!({"gpu": "NVIDIA H200", "by_gap": [row(0.5, 1.5), row(1.0, 1.5)]}), "no phase kept busy"),
            (serde_json::json!({"gpu": "NVIDIA H200", "by_gap": [row(0.0, 1.6), row(1.0, 1.5)]}), "fewer than two gap lengths"),
        ];
        for (v, says) in cases {
            write(v);
            let e = read_busy_clock(&dir, Some("NVIDIA H200")).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(BUSY_CLOCK_FILE) && !e.contains('\n'), "{e}");
        }
        write(serde_json::json!({"gpu": "NVIDIA H200", "by_gap": [row(0.0, 1.6), row(0.5, 1.5), row(1.0, 1.5)]}));
        assert!(read_busy_clock(&dir, Some("NVIDIA H200")).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
