//! What a trace says about overlap: for the traced window (the first GPU
//! op's start to the last one's end), each GPU's and each stream's busy and
//! idle time, each kind of copy (how many, how big, how fast, how much of
//! it hidden under kernels), the CPU's synchronizing calls and the GPU idle
//! each one caused, work on the legacy default stream, stretches where
//! the GPU waited for the CPU to launch, and every idle stretch put down to
//! one cause (the unattributed kept apart). Every finding names the call
//! behind it and the time it costs, largest first.
//!
//! [`diagnose`] walks each GPU through the rooms below it, in this order:
//! `busy` (busy and idle time, the idle gaps), `copies` (copies by kind and
//! their findings), `syncs` (the idle gaps the syncs caused),
//! `issue_bound` (the gaps left, as issue-bound stretches), `idle` (every
//! gap put down to one cause); then the syncs' findings, all named by
//! `callers`.
//!
//! May use: `events`, `intervals`, `queries`, `link`, `fixes` (the
//! program's API), `diagnosis` (what it
//! fills in), `callers`, `busy`, `copies`, `syncs`, `issue_bound`, `idle`.

use super::busy::{idle_gaps, stream_summaries, GpuWork};
use super::callers::Callers;
use super::copies::Copies;
use super::diagnosis::{Diagnosis, GpuSummary, Window, DIAGNOSIS_SCHEMA, FINDING_MIN_US};
use super::events::{Trace, TraceFormat};
use super::fixes::ProgramApi;
use super::idle::{attribute_idle, host_work_finding};
use super::intervals::total;
use super::issue_bound::issue_bound;
use super::link::LinkRates;
use super::queries::legacy_default_stream;
use super::syncs::Syncs;

pub use super::issue_bound::{ISSUE_BOUND_MIN_GAPS, ISSUE_GAP_MAX_US};

/// Analyses a read trace. `file` names it in the report; `links` are the
/// recorded link rates at hand (each GPU's copies are set beside the one
/// whose GPU name matches).
pub fn diagnose(trace: &Trace, file: &str, links: &[LinkRates]) -> Diagnosis {
    let (start_us, end_us) = trace.window_us();
    let window = Window { start_us, end_us };
    let legacy = legacy_default_stream(trace);
    let callers = Callers::new(trace);
    let mut syncs = Syncs::new(trace);
    let mut gpus = Vec::new();
    let mut findings = Vec::new();
    for gpu in trace.gpus() {
        let work = GpuWork::of(trace, gpu);
        let name = trace.gpu_name(gpu).map(String::from);
        let link = name.as_deref().and_then(|n| links.iter().find(|l| l.matches(n)));
        let streams = stream_summaries(trace, &callers, &work, legacy, window);
        let copies = Copies::of(trace, &work, link);
        findings.extend(copies.findings(trace, gpu, &work, legacy, &callers));
        // The idle gaps a sync caused are the sync's; issue-bound stretches
        // are sought among the rest.
        let gaps = idle_gaps(trace, &work.ops);
        let blamed = syncs.blame(trace, &callers, gpu, &gaps);
        findings.extend(issue_bound(trace, &callers, gpu, &gaps, &blamed));
        let idle_causes = attribute_idle(trace, &callers, &work, &gaps, &blamed);
        findings.extend(host_work_finding(gpu, &idle_causes));
        let busy_us = total(&work.busy);
        gpus.push(GpuSummary {
            gpu,
            name,
            busy_us,
            idle_us: window.duration_us() - busy_us,
            streams,
            copies: copies.groups,
            link_source: link.map(|l| l.source.clone()),
            idle_causes,
        });
    }
    // Syncs, grouped by where they were called.
    findings.extend(syncs.findings(trace, &callers));
    let syncs = syncs.summary();
    findings.retain(|f| f.cost_us >= FINDING_MIN_US);
    findings.sort_by(|a, b| b.cost_us.total_cmp(&a.cost_us));
    Diagnosis {
        schema: DIAGNOSIS_SCHEMA,
        file: file.to_string(),
        format: trace.format.unwrap_or(TraceFormat::Kineto),
        api: ProgramApi::of(trace),
        window,
        gpus,
        syncs,
        findings,
        what_if: None,
        what_if_error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::diagnosis::{Cause, IdleCause};
    use crate::diagnose::events::{Call, CpuOp, Direction, GpuOp, GpuOpKind, HostMemory, Thread};
    use crate::diagnose::queries::LEGACY_DEFAULT_STREAM;
    use crate::diagnose::text::gbps;

    /// A trace under construction: GPU 0, one CPU thread.
    struct Build {
        t: Trace,
        next: u64,
    }

    impl Build {
        fn new() -> Build {
            let t = Trace { format: Some(TraceFormat::Kineto), threads: vec![Thread { pid: "1".into(), tid: "1".into() }], ..Trace::default() };
            Build { t, next: 1 }
        }
        /// `call` on the CPU over `cpu`, issuing `kind` on `stream` over `gpu_span`.
        fn launch(&mut self, call: &str, cpu: (f64, f64), stream: u64, kind: GpuOpKind, gpu_span: (f64, f64), bytes: Option<u64>) -> &mut Build {
            let k = self.next;
            self.next += 1;
            self.t.calls.push(Call { name: call.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, correlation: Some(k) });
            let name = match kind {
                GpuOpKind::Copy { .. } => "Memcpy".into(),
                _ => "kernel".into(),
            };
            self.t.gpu_ops.push(GpuOp { gpu: 0, stream, kind, name, start_us: gpu_span.0, end_us: gpu_span.1, correlation: Some(k), bytes });
            self
        }
        fn call(&mut self, call: &str, cpu: (f64, f64)) -> &mut Build {
            let k = self.next;
            self.next += 1;
            self.t.calls.push(Call { name: call.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, correlation: Some(k) });
            self
        }
        fn op(&mut self, name: &str, cpu: (f64, f64)) -> &mut Build {
            self.t.cpu_ops.push(CpuOp { name: name.into(), thread: 0, start_us: cpu.0, end_us: cpu.1, annotation: false });
            self
        }
        fn done(&mut self) -> Diagnosis {
            self.t.sort();
            diagnose(&self.t, "test.json", &[])
        }
    }

    const K: GpuOpKind = GpuOpKind::Kernel;
    const UP_PINNED: GpuOpKind = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pinned) };
    const UP_PAGEABLE: GpuOpKind = GpuOpKind::Copy { direction: Direction::H2d, host: Some(HostMemory::Pageable) };
    const DOWN: GpuOpKind = GpuOpKind::Copy { direction: Direction::D2h, host: Some(HostMemory::Pageable) };

    #[test]
    fn busy_is_the_union_of_every_stream_and_idle_the_rest_of_the_window() {
        let d = Build::new()
            .launch("cudaMemcpyAsync", (0.0, 1.0), 13, UP_PINNED, (10.0, 40.0), Some(3_000_000))
            .launch("cudaLaunchKernel", (1.0, 2.0), 7, K, (20.0, 60.0), None)
            .launch("cudaLaunchKernel", (2.0, 3.0), 7, K, (80.0, 100.0), None)
            .done();
        assert_eq!(d.window, Window { start_us: 10.0, end_us: 100.0 });
        let g = &d.gpus[0];
        assert_eq!((g.busy_us, g.idle_us), (70.0, 20.0));
        let s7 = g.streams.iter().find(|s| s.stream == 7).unwrap();
        assert_eq!((s7.busy_us, s7.idle_us, s7.kernels, s7.legacy_default), (60.0, 30.0, 2, true));
        let s13 = g.streams.iter().find(|s| s.stream == 13).unwrap();
        assert_eq!((s13.busy_us, s13.copies, s13.legacy_default), (30.0, 1, false));
        // The copy ran 10-40; kernels ran from 20: 20 µs hidden, 10 exposed.
        let c = &g.copies[0];
        assert_eq!((c.count, c.hidden_us, c.exposed_us, c.bytes), (1, 20.0, 10.0, Some(3_000_000)));
        assert!((c.gbps.unwrap() - 100.0).abs() < 1e-9, "3 MB in 30 µs is 100 GB/s");
        let f = &d.findings[0];
        assert_eq!((f.cause, f.cost_us, f.count), (Cause::ExposedCopies, 10.0, 1));
        assert!(f.text.contains("1 of 1 copy on stream 13 ran 10.0 µs with no kernel beside it"), "{}", f.text);
        assert_eq!((gbps(53.04), gbps(0.0021), gbps(0.25)), ("53.0".to_string(), "0.0021".to_string(), "0.25".to_string()));
        assert_eq!(f.call.name, "cudaMemcpyAsync");
        assert_eq!(f.call.correlation, Some(1));
    }

    #[test]
    fn a_sync_that_drains_the_gpu_is_named_with_the_idle_it_caused() {
        // .item(): the kernel ends at 100 inside the sync (50-110); the next
        // kernel, launched after the sync, starts at 130: 30 µs idle.
        let d = Build::new()
            .launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 95.0), None)
            .op("aten::item", (40.0, 112.0))
            .op("aten::_local_scalar_dense", (41.0, 111.0))
            .launch("cudaMemcpyAsync", (42.0, 48.0), 7, DOWN, (95.0, 100.0), Some(4))
            .call("cudaStreamSynchronize", (50.0, 110.0))
            .launch("cudaLaunchKernel", (120.0, 125.0), 7, K, (130.0, 200.0), None)
            .done();
        let f = d.findings.iter().find(|f| f.cause == Cause::Sync).expect("the sync is blamed");
        assert_eq!(f.cost_us, 30.0);
        assert_eq!(f.call.name, "aten::item > aten::_local_scalar_dense > cudaStreamSynchronize");
        assert_eq!(f.call.ts_us, 50.0);
        assert!(f.text.contains(".item()-style") && f.text.contains("4 B copied back"), "{}", f.text);
        assert_eq!((d.syncs.calls, d.syncs.costly, d.syncs.cost_us), (1, 1, 30.0));
    }

    #[test]
    fn a_sync_while_the_gpu_has_work_queued_costs_nothing() {
        // The CPU waits on 50-110 for the copy stream, but the compute
        // stream's kernel runs on to 300: no gap starts in the sync.
        let d = Build::new()
            .launch("cudaMemcpyAsync", (0.0, 5.0), 13, UP_PINNED, (10.0, 100.0), Some(1 << 20))
            .launch("cudaLaunchKernel", (6.0, 8.0), 7, K, (10.0, 300.0), None)
            .call("cudaEventSynchronize", (50.0, 110.0))
            .launch("cudaLaunchKernel", (120.0, 125.0), 7, K, (300.0, 400.0), None)
            .done();
        assert!(d.findings.iter().all(|f| f.cause != Cause::Sync), "{:?}", d.findings);
        assert_eq!((d.syncs.calls, d.syncs.costly, d.syncs.cost_us), (1, 0, 0.0));
        // And the GPU already idle before a sync is not the sync's doing.
        let d = Build::new()
            .launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 20.0), None)
            .call("cudaDeviceSynchronize", (50.0, 52.0))
            .launch("cudaLaunchKernel", (60.0, 65.0), 7, K, (70.0, 80.0), None)
            .done();
        assert_eq!(d.syncs.costly, 0);
    }

    #[test]
    fn a_pageable_copy_is_named_pageable_with_its_exposed_time() {
        let d = Build::new()
            .op("aten::to", (0.0, 120.0))
            .launch("cudaMemcpyAsync", (1.0, 100.0), 7, UP_PAGEABLE, (5.0, 100.0), Some(1 << 20))
            .launch("cudaLaunchKernel", (110.0, 115.0), 7, K, (120.0, 150.0), None)
            .done();
        let f = &d.findings[0];
        assert_eq!((f.cause, f.cost_us), (Cause::PageableCopies, 95.0));
        assert_eq!(f.call.name, "aten::to > cudaMemcpyAsync");
        assert!(f.text.contains("1 H2D copy from pageable memory, 1 MiB"), "{}", f.text);
    }

    #[test]
    fn many_tiny_ops_launched_late_are_an_issue_bound_stretch() {
        let mut b = Build::new();
        // 40 kernels of 2 µs, each launched 10 µs after the last: the GPU
        // waits 8 µs before each but the first.
        for i in 0..40 {
            let t = 10.0 * i as f64;
            b.launch("cudaLaunchKernel", (t, t + 4.0), 7, K, (t + 5.0, t + 7.0), None);
        }
        let d = b.done();
        let f = &d.findings[0];
        assert_eq!((f.cause, f.count), (Cause::IssueBound, 40));
        assert!((f.cost_us - 39.0 * 8.0).abs() < 1e-9, "{}", f.cost_us);
        assert!(f.text.contains("launched every 10.0 µs"), "{}", f.text);
        // The same kernels queued ahead of the GPU (all launched at once) are not.
        let mut b = Build::new();
        for i in 0..40 {
            let t = 10.0 * i as f64;
            b.launch("cudaLaunchKernel", (i as f64 * 0.1, i as f64 * 0.1 + 0.05), 7, K, (t + 5.0, t + 7.0), None);
        }
        assert!(b.done().findings.iter().all(|f| f.cause != Cause::IssueBound));
    }

    /// A trace with one idle stretch of each kind but sync, all on stream
    /// 7: (A) 10-20; the CPU in `aten::randn` 20-80, then (B) launched at
    /// 82, runs 90-100 (70 µs idle, host work); (C) launched at 86 before B
    /// ended, runs 105-110 (5 µs, a gap between ops); an event wait at
    /// 88.2, then (D) launched at 89, runs 200-210 (90 µs, another
    /// stream's work); `aten::add` 300-320 launches (E) at 310, runs
    /// 318-320 (108 µs, 90 of them in no traced op: the program's own
    /// code); a copy call under way from 315.5 to 460, its copy 450-460
    /// (130 µs, a copy).
    fn one_stretch_of_each_kind() -> Diagnosis {
        Build::new()
            .launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 20.0), None)
            .op("aten::randn", (20.0, 80.0))
            .launch("cudaLaunchKernel", (82.0, 85.0), 7, K, (90.0, 100.0), None)
            .launch("cudaLaunchKernel", (86.0, 88.0), 7, K, (105.0, 110.0), None)
            .call("cudaStreamWaitEvent", (88.2, 88.6))
            .launch("cudaLaunchKernel", (89.0, 91.0), 7, K, (200.0, 210.0), None)
            .op("aten::add", (300.0, 320.0))
            .launch("cudaLaunchKernel", (310.0, 315.0), 7, K, (318.0, 320.0), None)
            .launch("cudaMemcpyAsync", (315.5, 460.0), 7, UP_PAGEABLE, (450.0, 460.0), Some(1 << 20))
            .done()
    }

    #[test]
    fn each_idle_stretch_is_put_down_to_one_cause_and_they_add_up() {
        use crate::diagnose::diagnosis::IdleCause::*;
        let d = one_stretch_of_each_kind();
        let g = &d.gpus[0];
        assert_eq!(g.idle_us, 70.0 + 5.0 + 90.0 + 108.0 + 130.0);
        let got: Vec<(IdleCause, f64, usize)> = g.idle_causes.iter().map(|s| (s.cause, s.idle_us, s.stretches)).collect();
        assert_eq!(got, [(HostWork, 178.0, 2), (Copy, 130.0, 1), (OtherStream, 90.0, 1), (KernelGaps, 5.0, 1), (Unattributed, 0.0, 0)]);
        let behind = |c: IdleCause| -> Vec<(String, f64)> {
            g.idle_causes.iter().find(|s| s.cause == c).unwrap().behind.iter().map(|b| (b.name.clone(), b.idle_us)).collect()
        };
        // The CPU's time in each op while the GPU idled: 90 µs of code
        // before aten::add, 60 in aten::randn.
        assert_eq!(behind(HostWork), [("untraced code before aten::add".to_string(), 90.0), ("aten::randn".to_string(), 60.0)]);
        assert_eq!(behind(Copy), [("cudaMemcpyAsync".to_string(), 130.0)]);
        assert_eq!(behind(OtherStream), [("stream 7: cudaStreamWaitEvent".to_string(), 90.0)]);
        assert_eq!(behind(KernelGaps), [("back-to-back ops on stream 7".to_string(), 5.0)]);
        assert!(behind(Unattributed).is_empty());
        // The longest host-work stretch (E's, 108 µs) names the finding.
        let host = &g.idle_causes[0];
        assert_eq!((host.longest_us, host.longest_ended_by.as_ref().map(|c| c.name.as_str())), (108.0, Some("aten::add > cudaLaunchKernel")));
        let f = d.findings.iter().find(|f| f.cause == Cause::HostWork).expect("the host's own work is a finding");
        assert_eq!((f.cost_us, f.count, f.call.name.as_str(), f.call.ts_us), (178.0, 2, "aten::add > cudaLaunchKernel", 310.0));
        assert!(f.text.contains("the GPU idled 178.0 µs in 2 stretches while the CPU ran the program's own work"), "{}", f.text);
        assert!(f.text.contains("untraced code before aten::add 90.0 µs, aten::randn 60.0 µs"), "{}", f.text);
        // The same stream split HTA's way: B and E launched after the op
        // before them ended (host wait); C 5 µs after B (kernel wait); D
        // and the copy queued, 90 and 130 µs after (other).
        let k = g.streams[0].idle_kinds;
        assert_eq!((k.host_wait_us, k.kernel_wait_us, k.other_us), (178.0, 5.0, 220.0));
        assert_eq!(k.total_us(), g.idle_us);
    }

    #[test]
    fn a_sync_stretch_a_launching_stretch_and_one_with_no_launch_each_have_their_cause() {
        use crate::diagnose::diagnosis::IdleCause::*;
        // The .item() of the sync test (30 µs, the sync's), then a kernel
        // launched inside aten::mul 210-240 (launch 230), running 235-240:
        // the 35 µs the CPU spent in aten::mul are waiting for a launch.
        // Then a kernel no call launched: 10 µs unattributed.
        let mut b = Build::new();
        b.launch("cudaLaunchKernel", (0.0, 5.0), 7, K, (10.0, 95.0), None)
            .op("aten::item", (40.0, 112.0))
            .launch("cudaMemcpyAsync", (42.0, 48.0), 7, DOWN, (95.0, 100.0), Some(4))
            .call("cudaStreamSynchronize", (50.0, 110.0))
            .launch("cudaLaunchKernel", (120.0, 125.0), 7, K, (130.0, 200.0), None)
            .op("aten::mul", (200.0, 240.0))
            .launch("cudaLaunchKernel", (230.0, 233.0), 7, K, (235.0, 240.0), None);
        b.t.gpu_ops.push(GpuOp { gpu: 0, stream: 7, kind: K, name: "kernel".into(), start_us: 250.0, end_us: 260.0, correlation: None, bytes: None });
        let d = b.done();
        let got: Vec<(IdleCause, f64)> = d.gpus[0].idle_causes.iter().map(|s| (s.cause, s.idle_us)).collect();
        assert_eq!(got, [(WaitingForLaunches, 35.0), (Sync, 30.0), (Unattributed, 10.0)]);
        let sync = &d.gpus[0].idle_causes[1].behind[0];
        assert_eq!((sync.name.as_str(), sync.idle_us), ("aten::item > cudaStreamSynchronize", 30.0));
        let launching = &d.gpus[0].idle_causes[0].behind[0];
        assert_eq!((launching.name.as_str(), launching.idle_us), ("aten::mul", 30.0));
        assert_eq!(d.gpus[0].idle_causes.iter().map(|s| s.idle_us).sum::<f64>(), d.gpus[0].idle_us);
    }

    #[test]
    fn the_legacy_default_stream_is_the_synchronous_copys_where_there_is_one() {
        let mut b = Build::new();
        b.launch("cudaMemcpy", (0.0, 20.0), 3, UP_PAGEABLE, (5.0, 15.0), Some(8));
        b.t.sort();
        assert_eq!(legacy_default_stream(&b.t), Some(3));
        let mut b = Build::new();
        b.launch("cudaLaunchKernel", (0.0, 1.0), 3, K, (5.0, 15.0), None);
        assert_eq!(legacy_default_stream(&b.t), Some(LEGACY_DEFAULT_STREAM));
        b.t.format = Some(TraceFormat::Course);
        assert_eq!(legacy_default_stream(&b.t), None);
    }
}
