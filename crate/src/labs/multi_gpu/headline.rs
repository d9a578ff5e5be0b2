//! Lab 8's headline: the rows `overlap-lab report` and `all` print for it
//! (the GPUs, the largest copy beside PyTorch's, the four-way overlap
//! beside its bound, the bubble beside its model, the communication the
//! all-reduce hid) and the measured figures behind them.
//!
//! May use: the lab's results ([`super::results`]), `lab_kit::headline`,
//! `units` and `lab_kit::check::pct`.

use super::results::{MultiGpuResults, PipelineResults};
use crate::lab_kit::check::pct;
use crate::units::{fmt_ms, Bytes};

impl MultiGpuResults {
    /// The measured numbers behind [`Self::headline`]: the largest copy's
    /// rates and the four-way overlap.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let mut v = Vec::new();
        if let Some(p) = self.largest() {
            let what = if self.several_gpus() { "peer copy" } else { "copy within GPU 0" };
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{what} one way, {}", Bytes(p.bytes)), "GB/s", p.one_way));
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("{what} both ways, {}", Bytes(p.bytes)), "GB/s", p.both_ways));
            v.push(crate::lab_kit::headline::HeadlineFigure::new(format!("staged through host memory, {}", Bytes(p.bytes)), "GB/s", p.staged));
        }
        v.push(crate::lab_kit::headline::HeadlineFigure::new("four-way overlap", "ms", self.four_way.together_ms));
        v
    }
    /// The headline rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = vec![(
            "GPUs the lab ran on".to_string(),
            if self.several_gpus() { format!("{}: {}", self.gpus.len(), self.links()) } else { "1: copies within GPU 0, no all-reduce".into() },
        )];
        if let Some(p) = self.largest() {
            let vs = |ours: f64, t: Option<f64>| t.map_or(format!("{ours:.0} GB/s"), |r| format!("{ours:.0} GB/s ({} of PyTorch)", pct(r)));
            let t = self.against_torch();
            let what = if self.several_gpus() { "peer copy" } else { "copy within GPU 0" };
            rows.push((format!("{what} one way, {}", Bytes(p.bytes)), vs(p.one_way.median, t.map(|t| t.0))));
            rows.push((format!("{what} both ways, {}", Bytes(p.bytes)), vs(p.both_ways.median, t.map(|t| t.1))));
            rows.push((format!("staged through host memory, {}", Bytes(p.bytes)), format!("{:.0} GB/s", p.staged.median)));
        }
        let f = &self.four_way;
        rows.push((
            "four-way overlap (H2D, D2H, copy, kernel at once)".into(),
            format!("{} vs bound {} (serial {})", fmt_ms(f.together_ms.median), fmt_ms(f.link_bound_ms()), fmt_ms(f.serial_ms())),
        ));
        let m = PipelineResults::drawn(&self.config.micro_batches);
        if let Some(b) = self.bubble(m).filter(|_| self.several_gpus()) {
            let measured = b.measured.as_ref().map_or("no timeline".into(), |s| pct(s.median));
            rows.push((format!("pipeline bubble, {m} micro-batches"), format!("{measured} (model {})", pct(b.model))));
        }
        rows.push((
            "all-reduce hidden behind compute (best bucket)".into(),
            match &self.all_reduce {
                Ok(a) => a.best().map_or("compute shorter than the communication at every bucket".into(), |b| {
                    format!("{} at {} buckets, bus {:.0} GB/s", pct(b.hidden()), Bytes(b.bucket_bytes), b.bus_gbps(a.ranks))
                }),
                Err(why) => format!("skipped: {why}"),
            },
        ));
        rows.push((
            "all-reduce hidden, CTAs chosen by measurement".into(),
            match &self.all_reduce {
                Ok(a) => a.chosen().map_or("compute shorter than the communication at every bucket".into(), |(ctas, b)| {
                    format!("{} at {} buckets, {ctas}, bus {:.0} GB/s", pct(b.hidden()), Bytes(b.bucket_bytes), b.bus_gbps(a.ranks))
                }),
                Err(why) => format!("skipped: {why}"),
            },
        ));
        rows
    }
}
