//! The table `overlap-lab multi-gpu` prints (and the report's summary):
//! the GPUs and their links, then each part beside its reference (the
//! copies beside PyTorch's and the host link, the four-way overlap beside
//! its bound, the pipeline's and training's bubbles beside (S−1)/(M+S−1),
//! the all-reduce beside what any schedule could hide, by bucket, by
//! message size and by CTA setting).
//!
//! May use: the lab's results ([`super::results`]) and the bubble's
//! closed form ([`super::pipeline_parallel::bubble_model`]); `units`,
//! `measure::stats` and `lab_kit::check::pct` for the numbers' form.

use super::pipeline_parallel;
use super::results::{best_of, AllReduceResults, MultiGpuResults};
use crate::lab_kit::check::pct;
use crate::measure::stats::Summary;
use crate::units::{fmt_ms, Bytes};

impl MultiGpuResults {
    /// The table the command line prints.
    pub fn table(&self) -> String {
        let mut out = self.topology.describe();
        out += &format!("the lab's GPUs: {}\n", self.gpus_line());
        if !self.several_gpus() {
            out += "ONE GPU: the copies below are within GPU 0, the pipeline's two stages share it, and the all-reduce needs two GPUs; the notebook shows a two-GPU recording where there is one\n";
        }
        out += &self.peer_lines();
        out += &self.four_way_lines();
        out += &self.pipeline_lines();
        out += &self.all_reduce_lines();
        out
    }

    fn peer_lines(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "\ncopies {} (GB/s, median and 25%..75% of {} runs; each copy timed as {} copies minus one, over {}):\n",
            self.pair(),
            c.repeats,
            c.copies,
            c.copies - 1
        );
        out += &format!("  {:>9} {:>22} {:>22} {:>22} {:>22}\n", "size", "one way", "both ways", "staged via host", "host link (H2D)");
        let cell = |s: &Summary| {
            let (lo, hi) = s.middle_range();
            format!("{:.1} ({:.1}..{:.1})", s.median, lo, hi)
        };
        for p in &self.peer {
            out += &format!(
                "  {:>9} {:>22} {:>22} {:>22} {:>22}\n",
                Bytes(p.bytes).to_string(),
                cell(&p.one_way),
                cell(&p.both_ways),
                cell(&p.staged),
                cell(&p.host)
            );
        }
        out += "  (both ways: the bytes that crossed in both directions per second; staged: down to pinned host memory and up again, in chunks that overlap)\n";
        if let Some(r) = &self.ring {
            let alone: Vec<String> =
                r.alone.iter().enumerate().map(|(g, s)| format!("{}->{} {:.1}", self.gpus[g], self.gpus[(g + 1) % self.gpus.len()], s.median)).collect();
            let (lo, hi) = r.per_link.middle_range();
            out += &format!(
                "ring of {} at {}: every GPU sends to the next at once, {:.1} GB/s a link ({lo:.1}..{hi:.1}); each alone {} GB/s\n",
                r.alone.len(),
                Bytes(r.bytes),
                r.per_link.median,
                alone.join(", ")
            );
        }
        match (&self.torch, self.against_torch()) {
            (Ok(t), Some((one, both))) => {
                out += &format!(
                    "PyTorch {} at {}, same GPUs, same run: one way {:.1} GB/s (ours {}), both ways {:.1} GB/s (ours {})\n",
                    t.torch,
                    Bytes(t.bytes),
                    t.one_way.median,
                    pct(one),
                    t.both_ways.median,
                    pct(both)
                );
            }
            (Err(why), _) => out += &format!("no PyTorch reference: {why}\n"),
            _ => {}
        }
        out
    }

    fn four_way_lines(&self) -> String {
        let f = &self.four_way;
        let (first, copy) = match self.gpus[..] {
            [a, b, ..] => (a, format!("copy to GPU {b}")),
            [a] => (a, format!("copy within GPU {a}")),
            [] => (0, "copy".to_string()),
        };
        let names = ["H2D", "D2H", copy.as_str(), "kernel"];
        let alone: Vec<String> = names.iter().zip(&f.alone_ms).map(|(n, s)| format!("{n} {}", fmt_ms(s.median))).collect();
        let (bound, link_bound, serial, m) = (f.bound_ms(), f.link_bound_ms(), f.serial_ms(), f.together_ms.median);
        let eff = f.efficiency();
        format!(
            "\nfour-way overlap on GPU {first}, {} each (a round by difference):\n  alone: {}; H2D and D2H together {}\n  all four at once {} (25%..75% {}..{}); serial sum {}; bound (the longest alone, each at its fastest quarter) {}; with the host link's two directions as measured together {}\n  at once reached {} of the bound with the link measured (bound / time; its runs' middle half beside it), and saved {} of what overlap could save (serial - bound)\n{}",
            Bytes(f.bytes),
            alone.join(", "),
            fmt_ms(f.host_link_ms.median),
            fmt_ms(m),
            fmt_ms(f.together_ms.middle_range().0),
            fmt_ms(f.together_ms.middle_range().1),
            fmt_ms(serial),
            fmt_ms(bound),
            fmt_ms(link_bound),
            eff.cell(),
            pct((serial - m) / (serial - bound)),
            crate::measure::stats::Efficiency::note([&eff]).map_or(String::new(), |why| format!("  {why}\n"))
        )
    }

    fn pipeline_lines(&self) -> String {
        let p = &self.pipeline;
        let mut out = format!(
            "\npipeline of {} stages, {} MiB, {} ({} per stage over all the data, {} FMAs per element):\n",
            p.stages,
            self.config.pipeline_mib,
            self.stages_placed(),
            fmt_ms(p.stage_ms.median),
            p.iterations
        );
        let two = self.several_gpus();
        // On one GPU the model (a GPU a stage) does not apply: no column for it.
        if two {
            out += &format!("  {:>13} {:>24} {:>20} {:>8} {:>12}\n", "micro-batches", "bubble (25%..75%)", "model (S-1)/(M+S-1)", "diff", "total");
        } else {
            out += &format!("  {:>13} {:>24} {:>12}\n", "micro-batches", "SMs idle (25%..75%)", "total");
        }
        for b in &p.points {
            let measured = b.measured.as_ref().map_or("no timeline".to_string(), |m| {
                let (lo, hi) = m.middle_range();
                format!("{} ({}..{})", pct(m.median), pct(lo), pct(hi))
            });
            if two {
                let diff = b.measured.as_ref().map_or("-".to_string(), |m| format!("{:+.1}", 100.0 * (m.median - b.model)));
                out += &format!("  {:>13} {:>24} {:>20} {:>8} {:>12}\n", b.micro_batches, measured, pct(b.model), diff, fmt_ms(b.total_ms.median));
            } else {
                out += &format!("  {:>13} {:>24} {:>12}\n", b.micro_batches, measured, fmt_ms(b.total_ms.median));
            }
        }
        out += if self.several_gpus() {
            "  (bubble: the share of the window from the first kernel's start to the last one's end that each GPU ran no kernel, averaged over the GPUs; diff in points)\n"
        } else {
            "  (one GPU: both stages' kernels share its SMs, so the bubble model, for one GPU a stage, does not apply: this checks the code path)\n"
        };
        out += &self.training_lines();
        out
    }

    /// Training in each order: the bubble beside the model and the
    /// activations each stage keeps.
    fn training_lines(&self) -> String {
        let p = &self.pipeline;
        if p.training.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "
training, the forward and backward of every micro-batch ({} stages), bubble (25%..75%) and diff from the model in points:
",
            p.stages
        );
        out += &format!("  {:>13}", "micro-batches");
        for t in &p.training {
            out += &format!(" {:>26} {:>7}", t.order.name(), "diff");
        }
        out += &format!(
            " {:>10}   activations kept by stage 0..{}
",
            "model",
            p.stages - 1
        );
        for (k, &m) in self.config.micro_batches.iter().enumerate() {
            out += &format!("  {m:>13}");
            for t in &p.training {
                let (cell, diff) =
                    t.points.get(k).and_then(|b| b.measured.as_ref().map(|s| (s, b.model))).map_or(("no timeline".into(), "-".into()), |(s, model)| {
                        let (lo, hi) = s.middle_range();
                        (format!("{} ({}..{})", pct(s.median), pct(lo), pct(hi)), format!("{:+.1}", 100.0 * (s.median - model)))
                    });
                out += &format!(" {cell:>26} {diff:>7}");
            }
            let kept: Vec<String> = p
                .training
                .iter()
                .map(|t| format!("{} {}", t.order.name(), self.kept(t.order, m).iter().map(|b| Bytes(*b).to_string()).collect::<Vec<_>>().join(", ")))
                .collect();
            out += &format!(" {:>10}   {}\n", pct(pipeline_parallel::bubble_model(p.stages, m)), kept.join("; "));
        }
        out += "  (fill-drain runs every forward, then every backward, and keeps every micro-batch's activation; 1F1B runs one forward, one backward once the pipe is full, and keeps at most S-s on stage s; both idle (S-1)/(M+S-1) where forward and backward take the same time)\n";
        if !self.several_gpus() {
            out += "  (one GPU: both stages share its SMs, so the model, for one GPU a stage, does not apply: this checks the code path)\n";
        }
        out
    }

    fn all_reduce_lines(&self) -> String {
        let a = match &self.all_reduce {
            Err(why) => return format!("\ngradient all-reduce: skipped: {why}\n"),
            Ok(a) => a,
        };
        let mut out = format!(
            "\ngradient all-reduce, NCCL {} over {} GPUs, {} MiB of gradients each, layer kernel {} FMAs per element (compute {}x the communication at the largest bucket):\n",
            a.nccl_version, a.ranks, self.config.grad_mib, a.iterations, self.config.compute_ratio
        );
        out += &format!(
            "  {:>9} {:>7} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
            "bucket", "buckets", "one sum", "bus GB/s", "compute", "comm", "serial", "overlapped", "model", "hidden", "at most"
        );
        for p in &a.points {
            out += &format!(
                "  {:>9} {:>7} {:>10} {:>9.1} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}\n",
                Bytes(p.bucket_bytes).to_string(),
                p.buckets,
                fmt_ms(p.all_reduce_ms.median),
                p.bus_gbps(a.ranks),
                fmt_ms(p.compute_ms()),
                fmt_ms(p.comm_ms()),
                fmt_ms(p.serial_ms.median),
                fmt_ms(p.overlapped_ms.median),
                fmt_ms(p.predicted_ms),
                pct(p.hidden()),
                pct(p.hidden_bound())
            );
        }
        out += "  (a training step, by difference; hidden: (serial - overlapped) / comm; at most: all but the last bucket's sum where compute is the longer; bus GB/s: NCCL's bus bandwidth of one bucket's sum)\n";
        if !a.device_bytes.is_empty() {
            let each: Vec<String> = a.device_bytes.iter().enumerate().map(|(g, &b)| format!("GPU {g} {}", Bytes(b))).collect();
            out += &format!(
                "  device memory of the buffers on each GPU: {} (a rank's batch and gradients, {} each, on its own GPU, and one bucket's sum timed alone; NCCL's own besides)\n",
                each.join(", "),
                Bytes((self.config.grad_mib as u64) << 20)
            );
        }
        out += &self.all_reduce_size_lines(a);
        out += &self.cta_lines(a);
        if let Some(b) = a.best() {
            out += &format!(
                "best where compute is at least as long as the communication: buckets of {} hid {} of the communication ({} at most), NCCL's bus bandwidth {:.1} GB/s\n",
                Bytes(b.bucket_bytes),
                pct(b.hidden()),
                pct(b.hidden_bound()),
                b.bus_gbps(a.ranks)
            );
        }
        out
    }

    /// Bus bandwidth by message size, beside PyTorch's.
    fn all_reduce_size_lines(&self, a: &AllReduceResults) -> String {
        if a.sizes.is_empty() {
            return String::new();
        }
        let mut out = format!("all-reduce alone by size over {} GPUs, NCCL's bus bandwidth (2(n-1)/n of the bytes over the time):\n", a.ranks);
        out += &format!("  {:>9} {:>10} {:>10} {:>12} {:>8}\n", "size", "one sum", "bus GB/s", "PyTorch GB/s", "ours");
        for ((bytes, ours, theirs), (_, ms)) in a.bus_by_size().into_iter().zip(&a.sizes) {
            let (t, ratio) = theirs.map_or(("-".into(), "-".into()), |t| (format!("{t:.1}"), pct(ours / t)));
            out += &format!("  {:>9} {:>10} {:>10.1} {:>12} {:>8}\n", Bytes(bytes).to_string(), fmt_ms(ms.median), ours, t, ratio);
        }
        match &a.torch {
            Some(Ok(t)) => out += &format!("  (PyTorch {} with NCCL {}, torch.distributed's all_reduce on the same GPUs, after ours)\n", t.torch, t.nccl),
            Some(Err(why)) => out += &format!("  no PyTorch reference: {why}\n"),
            None => out += "  no PyTorch reference: --no-reference\n",
        }
        out
    }

    /// The bucket sweep's best point under each CTA setting, and the one
    /// chosen by measurement.
    fn cta_lines(&self, a: &AllReduceResults) -> String {
        let skipped: String = a.skipped.iter().map(|why| format!("CTA setting skipped: {why}\n")).collect();
        if a.capped.is_empty() {
            return skipped;
        }
        let mut out = skipped + "the SMs NCCL takes (each setting its own communicators; the layers calibrated once): the best bucket of each\n";
        out += &format!(
            "  {:>16} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}\n",
            "NCCL's CTAs", "bucket", "layer", "one sum", "overlapped", "hidden", "at most", "bus GB/s"
        );
        for (ctas, points) in a.sweeps() {
            match best_of(points) {
                Some(p) => {
                    out += &format!(
                        "  {:>16} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9.1}\n",
                        ctas.to_string(),
                        Bytes(p.bucket_bytes).to_string(),
                        fmt_ms(p.kernel_ms.median),
                        fmt_ms(p.all_reduce_ms.median),
                        fmt_ms(p.overlapped_ms.median),
                        pct(p.hidden()),
                        pct(p.hidden_bound()),
                        p.bus_gbps(a.ranks)
                    )
                }
                None => out += &format!("  {:>16} compute shorter than the communication at every bucket\n", ctas.to_string()),
            }
        }
        if let Some((ctas, p)) = a.chosen() {
            out += &format!(
                "chosen by measurement (the setting that hid the most): {ctas}, buckets of {}: hid {} of the communication ({} at most), NCCL's bus bandwidth {:.1} GB/s\n",
                Bytes(p.bucket_bytes),
                pct(p.hidden()),
                pct(p.hidden_bound()),
                p.bus_gbps(a.ranks)
            );
        }
        if let Some(why) = &a.env_override {
            out += &format!("  NOTE: {why}: the settings above all ran as it says\n");
        }
        out
    }
}
