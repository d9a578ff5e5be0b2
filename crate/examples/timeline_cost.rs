//! Diagnostic: what does each way of timing a pipeline cost, and where does
//! the balanced pipeline lose time against its bound?
//! Balanced kernel (1x the H2D time), 32 Mi f32, 32 chunks on 4 streams,
//! depth-first. Medians of interleaved runs, in ms.
//! Run on a GPU: `cargo run --release --example timeline_cost -- OUT_DIR`.

use overlap_lab::gpu::{driver, Gpu, TimelineSource};
use overlap_lab::labs::overlap::measure::{point_plan, Sweep};
use overlap_lab::labs::overlap::IssueOrder;
use overlap_lab::measure::stats::Summary;
use overlap_lab::pipeline::op::OpKind;

const ELEMENTS: usize = 32 << 20;

fn med(v: &[f64]) -> String {
    let s = Summary::of(v).expect("samples");
    format!("{:.3} [{:.3}..{:.3}]", s.median, s.min, s.max)
}

fn main() -> overlap_lab::Result<()> {
    let out = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/timeline-cost".into()));
    std::fs::create_dir_all(&out).map_err(|e| overlap_lab::LabError::config(e.to_string()))?;
    let gpu = Gpu::open(0)?;
    println!("{}\n", gpu.fingerprint()?.describe());
    let mut sweep = Sweep::new(&gpu, ELEMENTS)?;
    let h2d = Summary::of_runs(7, || sweep.timed_alone(OpKind::H2d))?.median;
    let it = sweep.calibrate(h2d, 1.0)?;
    let (c, s, o) = (32, 4, IssueOrder::DepthFirst);
    let gated = point_plan(ELEMENTS, c, s, o, &OpKind::STAGES, false);
    let ungated = gated.clone().issued_live();
    let (gated_model, ungated_model) = (gated.dry_run()?, ungated.dry_run()?);

    // 1. Gate x events, interleaved.
    let modes: [(&str, TimelineSource, bool); 4] = [
        ("off, ungated", TimelineSource::Off, false),
        ("events, ungated", TimelineSource::Events, false),
        ("off, gated", TimelineSource::Off, true),
        ("events, gated", TimelineSource::Events, true),
    ];
    let mut t = vec![Vec::new(); modes.len()];
    for rep in 0..28 {
        for (k, &(_, src, behind_gate)) in modes.iter().enumerate() {
            let (plan, model) = if behind_gate { (&gated, &gated_model) } else { (&ungated, &ungated_model) };
            let r = sweep.rig.run_modelled(plan, model, src)?;
            if rep >= 3 {
                t[k].push(r.total_ms);
            }
        }
    }
    println!("balanced {c} chunks / {s} streams DF ({it} FMAs), H2D alone {h2d:.3} ms");
    for (k, (name, _, _)) in modes.iter().enumerate() {
        println!("  {name:<28} {}", med(&t[k]));
    }

    // 2. CUPTI kinds (gated, timeline off, tracing enabled around the runs).
    for (name, memcpy, kernel) in [("cupti memcpy+kernel", true, true), ("cupti memcpy only", true, false), ("cupti kernel only", false, true)] {
        driver::activity::start()?;
        driver::activity::record_only(memcpy, kernel)?;
        let mut v = Vec::new();
        for rep in 0..15 {
            let r = sweep.point(c, s, o)?;
            if rep >= 3 {
                v.push(r.total_ms);
            }
        }
        driver::activity::stop()?;
        let _ = driver::activity::finish();
        println!("  {name:<28} {}", med(&v));
    }
    let mut v = Vec::new();
    for _ in 0..12 {
        v.push(sweep.point(c, s, o)?.total_ms);
    }
    println!("  {:<28} {}", "off, gated (after cupti)", med(&v));

    // 3. Per-event cost on one stream: 64 ops back to back, events off/on.
    println!("\none stream, 64 ops back to back (gated):");
    for (name, kind) in [("H2D 2 MiB", OpKind::H2d), ("kernel 1/64", OpKind::Kernel), ("D2H 2 MiB", OpKind::D2h)] {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for rep in 0..14 {
            for (on, dst) in [(false, &mut a), (true, &mut b)] {
                let source = if on { TimelineSource::Events } else { TimelineSource::Off };
                let ms = sweep.run(64, 1, o, &[kind], false, source)?.total_ms;
                if rep >= 2 {
                    dst.push(ms);
                }
            }
        }
        let (ma, mb) = (Summary::of(&a)?.median, Summary::of(&b)?.median);
        println!("  {name:<14} off {}  events {}  -> {:+.2} us per event", med(&a), med(&b), 1e3 * (mb - ma) / 64.0);
    }

    // 4. Both directions at once: whole data, repeated.
    let mut both = Vec::new();
    for _ in 0..15 {
        both.push(sweep.both_copies(1)?);
    }
    println!("\nH|D whole data on 2 streams: {}", med(&both));

    // 5. Timelines of the balanced point: events and CUPTI.
    for (name, src) in [("events", TimelineSource::Events), ("cupti", TimelineSource::Cupti)] {
        let r = sweep.run(c, s, o, &OpKind::STAGES, false, src)?;
        let tl = r.timeline.expect("timeline");
        tl.save_chrome_trace(&out.join(format!("balanced-{name}.json")))?;
        println!(
            "{name}: total {:.3} ms, H2D busy {:.0} us, kernel busy {:.0} us, D2H busy {:.0} us",
            r.total_ms,
            tl.busy_us(OpKind::H2d),
            tl.busy_us(OpKind::Kernel),
            tl.busy_us(OpKind::D2h)
        );
    }
    Ok(())
}
