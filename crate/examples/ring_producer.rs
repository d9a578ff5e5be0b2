//! Diagnostic for lab 6's pinned-staging ring: where does the CPU's time
//! per batch go inside a running ring, against the producer timed alone?
//! Lab 6's default size (16 batches of 8 MiB), the kernel balanced
//! against a batch's upload. Per ring: the run's total per batch, the
//! loop's host time per batch and its share inside the driver's issuing
//! calls (timeline off); with events: the producer's spans, and from one
//! produce's end to the next one's start. Medians [min..max], µs.
//! Run on a GPU: `cargo run --release --example ring_producer`.

use overlap_lab::gpu::{Gpu, PlanRig, TimelineSource};
use overlap_lab::lab_kit::experiment::balance;
use overlap_lab::labs::memory::ring::{plan, Staging};
use overlap_lab::measure::stats::Summary;
use overlap_lab::pipeline::op::StreamKind;
use overlap_lab::pipeline::plan::{Plan, StreamSpec};
use std::time::Instant;

const ELEMENTS: usize = 32 << 20;
const BATCHES: usize = 16;
const REPS: usize = 9;

fn med(v: &[f64]) -> String {
    let s = Summary::of(v).expect("samples");
    format!("{:7.1} [{:.1}..{:.1}]", s.median, s.min, s.max)
}

/// The producer alone, `batches` batches back to back, or with a sleep
/// of `gap_us` between batches (the ring's issuing time).
fn produce_alone(n: usize, batches: usize, gap_us: u64) -> Plan {
    Plan::new("producer alone", vec![StreamSpec::new("s", StreamKind::NonBlocking, 0)], n * (batches + 1), 2, move |p, r| {
        for b in 0..batches {
            if gap_us > 0 {
                std::thread::sleep(std::time::Duration::from_micros(gap_us));
            }
            p.produce(r.input, 0, n, b, "produce")?;
        }
        Ok(())
    })
    .with_producer(n)
}

fn spans_of(rig: &mut PlanRig, p: &Plan) -> overlap_lab::Result<(Vec<f64>, Vec<f64>)> {
    let m = p.dry_run()?;
    let t = rig.run_modelled(p, &m, TimelineSource::Events)?.timeline.expect("timed");
    let mut prod: Vec<_> = t.spans.iter().filter(|s| s.label.starts_with("produce")).map(|s| (s.start_us, s.end_us)).collect();
    prod.sort_by(|a, b| a.0.total_cmp(&b.0));
    let lens = prod.iter().map(|(a, b)| b - a).collect();
    let gaps = prod.windows(2).map(|w| w[1].0 - w[0].1).collect();
    Ok((lens, gaps))
}

fn main() -> overlap_lab::Result<()> {
    let gpu = Gpu::open(0)?;
    println!("{}\n", gpu.fingerprint()?.describe());
    let n = ELEMENTS / BATCHES;
    let mut rig = PlanRig::new(&gpu, ELEMENTS, 2, 1)?;
    rig.iterations = balance(&mut rig, n, 7)?;
    println!("kernel: {} FMAs per element; {} cores", rig.iterations, std::thread::available_parallelism().map_or(0, |c| c.get()));

    let variants: Vec<Plan> =
        [Staging::Ring(1), Staging::Ring(2), Staging::Ring(3), Staging::Ring(6)].into_iter().map(|s| plan(ELEMENTS, BATCHES, s)).collect();
    let models: Vec<_> = variants.iter().map(|p| p.dry_run()).collect::<overlap_lab::Result<_>>()?;
    let mut total = vec![Vec::new(); variants.len()];
    let mut host = vec![Vec::new(); variants.len()];
    for rep in 0..=REPS {
        for (i, (p, m)) in variants.iter().zip(&models).enumerate() {
            let run = rig.run_modelled(p, m, TimelineSource::Off)?;
            if rep > 0 {
                total[i].push(1e3 * run.total_ms / BATCHES as f64);
                host[i].push(1e3 * run.issue_ms / BATCHES as f64);
            }
        }
    }
    println!("\nper batch, timeline off: total | the loop's host time (its recorded calls replayed)");
    for (i, p) in variants.iter().enumerate() {
        println!("  {:<28} {} | {}", p.name, med(&total[i]), med(&host[i]));
    }
    println!("\nwith events: the producer's spans | produce end to next produce start");
    for p in &variants {
        let (mut lens, mut gaps) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (l, g) = spans_of(&mut rig, p)?;
            lens.extend(l);
            gaps.extend(g);
        }
        println!("  {:<28} {} | {}", p.name, med(&lens), med(&gaps));
    }
    println!("\nthe producer alone (events): back to back | 150 µs sleep between | 400 µs sleep between");
    let mut row = Vec::new();
    for gap in [0, 150, 400] {
        let mut lens = Vec::new();
        for _ in 0..3 {
            lens.extend(spans_of(&mut rig, &produce_alone(n, BATCHES - 1, gap))?.0);
        }
        row.push(med(&lens));
    }
    println!("  {}", row.join(" | "));

    // copy_streaming on plain memory, outside the pipeline: all cores vs one.
    let src: Vec<u64> = (0..n as u64 / 2).collect();
    let mut dst = vec![0u64; n / 2];
    let mut time = |f: &mut dyn FnMut(&mut [u64]), sleep_us: u64| {
        let mut v = Vec::new();
        for _ in 0..20 {
            std::thread::sleep(std::time::Duration::from_micros(sleep_us));
            let t = Instant::now();
            f(&mut dst);
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        med(&v)
    };
    let par = time(&mut |d| overlap_lab::measure::pattern::copy_streaming(d, &src), 0);
    let par_gap = time(&mut |d| overlap_lab::measure::pattern::copy_streaming(d, &src), 150);
    let one = time(&mut |d| d.copy_from_slice(&src), 0);
    let one_gap = time(&mut |d| d.copy_from_slice(&src), 150);
    println!("\n8 MiB into ordinary memory: copy_streaming (all cores) {par} | after 150 µs sleep {par_gap}; one thread copy_from_slice {one} | after sleep {one_gap}");
    Ok(())
}
