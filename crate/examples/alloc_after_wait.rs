//! Diagnostic for lab 6: why does cuMemAlloc take as long as the other
//! stream's download when the CPU has just waited for a batch's kernel
//! (lab 6's "the CPU waits for each batch" variant ran 16% over its
//! model), when the probes find it waits for no busy kernel, upload or
//! download? Each scenario is a two-stream loop of 4 batches of 32 MiB;
//! it prints each cuMemAlloc's time and what ran on the GPU meanwhile.
//! Run on a GPU: `cargo run --release --example alloc_after_wait`.
//!
//! On the H100 (2026-11-24): after a CPU wait for kernel b, the next
//! cuMemAlloc took 628 µs and ended 16 µs after download b, which had
//! started as it began (the same with the download on the compute stream);
//! with no download running it took 110-200 µs. With 8 downloads queued
//! and the CPU waiting for the first, the three allocations after it took
//! 459, 1038 and 1054 µs while the rest ran: slowed, not waiting for the
//! queue. (A later run found the same with the CPU's wait placed before
//! the downloads were issued, and no slowdown beside running uploads or
//! kernels: what slows cuMemAlloc is a download running, not the wait.
//! Lab 6's probe beside downloads had made its calls during the upload
//! before them; it now waits for that upload, and measures 0.98 ms.)

use overlap_lab::gpu::{Gpu, PlanRig, TimelineSource};
use overlap_lab::measure::stats::Summary;
use overlap_lab::pipeline::issue::Issue;
use overlap_lab::pipeline::op::StreamKind;
use overlap_lab::pipeline::plan::{chunk, Plan, Refs, StreamSpec};

const ELEMENTS: usize = 32 << 20;
const BATCHES: usize = 4;

/// How batch b's download and the CPU's wait are arranged.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Lab 6's variant: D2H b on the download stream after an event, the
    /// CPU waits for kernel b, then allocates batch b+1.
    WaitKernelCrossStream,
    /// The same, D2H b on the compute stream (no cross-stream event).
    WaitKernelSameStream,
    /// The CPU waits for D2H b itself before the next allocation.
    WaitDownload,
    /// No CPU wait: every allocation made while the GPU runs ahead.
    NoWait,
    /// As the first, with D2H b issued after the next allocation.
    DownloadIssuedAfterAlloc,
    /// As the probes: 8 downloads queued at once; the CPU waits for the
    /// first to end, then allocates three buffers while the rest run.
    QueuedWaitFirst,
    /// The same with no CPU wait before the allocations.
    QueuedNoWait,
}

/// The queued scenarios: one upload, then 8 downloads of a batch's size on
/// the download stream; three allocations after (`wait`: once the CPU has
/// seen the first download end).
fn queued(p: &mut dyn Issue, r: &Refs, wait: bool) -> overlap_lab::Result<()> {
    let download = r.streams[1];
    let (_, n) = chunk(r.elements, BATCHES, 0);
    p.h2d(r.streams[0], r.devices[0], 0, r.input, 0, n, "H2D 0")?;
    let uploaded = p.event()?;
    p.record(uploaded, r.streams[0])?;
    p.wait(download, uploaded)?;
    let first = p.event()?;
    for i in 0..8 {
        p.d2h(download, r.output, 0, r.devices[0], 0, n, &format!("D2H {i}"))?;
        if i == 0 {
            p.record(first, download)?;
        }
    }
    if wait {
        p.host_wait(first)?;
    }
    let held = (1..BATCHES).map(|b| p.alloc(n, &format!("scratch {b}"))).collect::<overlap_lab::Result<Vec<_>>>()?;
    p.sync_device()?;
    held.into_iter().try_for_each(|h| p.free(h))
}

fn plan(s: Scenario) -> Plan {
    let specs = vec![StreamSpec::new("compute", StreamKind::NonBlocking, 0), StreamSpec::new("download", StreamKind::NonBlocking, 0)];
    Plan::new(&format!("{s:?}"), specs, ELEMENTS, 1, move |p: &mut dyn Issue, r: &Refs| {
        match s {
            Scenario::QueuedWaitFirst => return queued(p, r, true),
            Scenario::QueuedNoWait => return queued(p, r, false),
            _ => {}
        }
        let (compute, download) = (r.streams[0], r.streams[1]);
        let mut held = Vec::new();
        let mut pending: Option<(usize, usize, usize)> = None;
        for b in 0..BATCHES {
            let (at, n) = chunk(r.elements, BATCHES, b);
            let scratch = p.alloc(n, &format!("scratch {b}"))?;
            if let Some((pb, pat, pn)) = pending.take() {
                p.d2h(download, r.output, pat, r.devices[0], pat, pn, &format!("D2H {pb}"))?;
            }
            p.h2d(compute, scratch, 0, r.input, at, n, &format!("H2D {b}"))?;
            p.compute(compute, scratch, 0, r.devices[0], at, n, &format!("kernel {b}"))?;
            let computed = p.event()?;
            p.record(computed, compute)?;
            let down = if matches!(s, Scenario::WaitKernelSameStream) { compute } else { download };
            if !matches!(s, Scenario::WaitKernelSameStream) {
                p.wait(download, computed)?;
            }
            if matches!(s, Scenario::DownloadIssuedAfterAlloc) {
                pending = Some((b, at, n));
            } else {
                p.d2h(down, r.output, at, r.devices[0], at, n, &format!("D2H {b}"))?;
            }
            match s {
                Scenario::NoWait => {}
                Scenario::WaitDownload => {
                    let downloaded = p.event()?;
                    p.record(downloaded, down)?;
                    p.host_wait(downloaded)?;
                }
                _ => p.host_wait(computed)?,
            }
            held.push(scratch);
        }
        if let Some((pb, pat, pn)) = pending.take() {
            p.d2h(download, r.output, pat, r.devices[0], pat, pn, &format!("D2H {pb}"))?;
        }
        p.sync_device()?;
        held.into_iter().try_for_each(|h| p.free(h))
    })
}

fn main() -> overlap_lab::Result<()> {
    let scenarios = [
        Scenario::WaitKernelCrossStream,
        Scenario::WaitKernelSameStream,
        Scenario::WaitDownload,
        Scenario::NoWait,
        Scenario::DownloadIssuedAfterAlloc,
        Scenario::QueuedWaitFirst,
        Scenario::QueuedNoWait,
    ];
    for s in scenarios {
        // Each loop checked on the model first: no race, every output from its kernel.
        let m = plan(s).dry_run()?;
        if let Some(r) = m.schedule.races().first() {
            return Err(overlap_lab::LabError::config(format!("{s:?}: {}", r.what)));
        }
    }
    let gpu = Gpu::open(0)?;
    println!("{}\n", gpu.fingerprint()?.describe());
    let mut rig = PlanRig::new(&gpu, ELEMENTS, 1, 400)?;
    let plans: Vec<Plan> = scenarios.iter().map(|&s| plan(s)).collect();
    // Per scenario: each later allocation's time, and by how much it ended after the D2H running when it began.
    let mut alloc_us: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    let mut after_d2h_us: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    let mut total_ms: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    for rep in 0..8 {
        for (k, plan) in plans.iter().enumerate() {
            let run = rig.run(plan, TimelineSource::Events)?;
            let t = run.timeline.expect("a timeline");
            if rep == 0 {
                continue;
            }
            total_ms[k].push(run.total_ms);
            for a in t.spans.iter().filter(|s| s.label.starts_with("cuMemAlloc") && !s.label.ends_with(" 0")) {
                alloc_us[k].push(a.end_us - a.start_us);
                if let Some(d) = t.spans.iter().find(|d| d.label.starts_with("D2H") && d.start_us <= a.start_us + 50.0 && d.end_us > a.start_us) {
                    after_d2h_us[k].push(a.end_us - d.end_us);
                }
            }
            if rep == 1 {
                println!("{:?}:", scenarios[k]);
                let mut spans = t.spans.clone();
                spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
                for s in spans.iter().filter(|s| !s.label.starts_with("cuMemFree")) {
                    println!("  {:<10} {:<22} {:>8.0} {:>8.0} {:>6.0} µs", s.lane, s.label, s.start_us, s.end_us, s.end_us - s.start_us);
                }
            }
        }
    }
    println!("\nscenario                        total ms (median)  cuMemAlloc b>0 µs (median, min..max)  alloc end - D2H end µs (median, n)");
    for (k, s) in scenarios.iter().enumerate() {
        let a = Summary::of(&alloc_us[k])?;
        let tot = Summary::of(&total_ms[k])?;
        let after =
            Summary::of(&after_d2h_us[k]).map(|s| format!("{:+.0} ({})", s.median, after_d2h_us[k].len())).unwrap_or_else(|_| "- (no D2H running)".into());
        println!("{:<31} {:>10.3} {:>16.0} ({:.0}..{:.0}) {:>30}", format!("{s:?}"), tot.median, a.median, a.min, a.max, after);
    }
    Ok(())
}
