//! Lab 8's figures: bandwidth against size, the bubble against
//! micro-batches, the all-reduce against bucket size, and three timelines
//! (a lane per GPU's stream); and the report files made from them.

use super::config::LAB;
use super::results::{AllReducePoint, MultiGpuResults, PeerPoint, PipelineResults};
use crate::error::Result;
use crate::pipeline::op::{Link, OpKind};
use crate::pipeline::timeline::Timeline;
use crate::present::chart::{Chart, Figure, Panel, RGBColor, Series, XAxis};
use crate::present::gantt::{kind_color, Gantt};
use std::path::{Path, PathBuf};

const GREY: RGBColor = RGBColor(120, 120, 120);
const BLACK: RGBColor = RGBColor(30, 30, 30);

impl MultiGpuResults {
    /// GB/s against size: one way, both ways, staged through host memory,
    /// the host link's upload, and PyTorch's copies at the largest size.
    pub fn peer_chart(&self, origin: &str) -> Figure {
        let line = |label: &str, color, dashed, f: &dyn Fn(&PeerPoint) -> f64| Series {
            label: label.into(),
            color,
            dashed,
            points: self.peer.iter().map(|p| (p.bytes as f64, f(p))).collect(),
        };
        let peer = kind_color(OpKind::D2d(Link { from: 0, to: 1 }));
        let mut series = vec![
            line("one way", peer, false, &|p| p.one_way.median),
            line("both ways (total)", kind_color(OpKind::AllReduce(2)), false, &|p| p.both_ways.median),
            line("staged through pinned host memory", kind_color(OpKind::D2h), false, &|p| p.staged.median),
            line("host link: H2D from pinned memory", GREY, true, &|p| p.host.median),
        ];
        if let Ok(t) = &self.torch {
            series.push(Series {
                label: format!("PyTorch {}: one way", t.torch),
                color: BLACK,
                dashed: false,
                points: vec![(t.bytes as f64, t.one_way.median)],
            });
            series.push(Series {
                label: format!("PyTorch {}: both ways", t.torch),
                color: BLACK,
                dashed: true,
                points: vec![(t.bytes as f64, t.both_ways.median)],
            });
        }
        Figure {
            stem: format!("{LAB}-peer"),
            title: format!("Lab 8: copies {} ({})", self.pair(), self.link()),
            subtitle: origin.into(),
            panels: vec![Panel {
                title: "each copy timed by difference (a run of many minus a run of one), median of the runs".into(),
                x_axis: XAxis::LogBytes,
                x_label: "bytes per copy".into(),
                y_label: "GB/s".into(),
                log_y: true,
                series,
            }],
            panel_size: (760, 460),
        }
    }

    /// The bubble against micro-batches: measured and (S−1)/(M+S−1).
    pub fn bubble_chart(&self, origin: &str) -> Figure {
        let pts = &self.pipeline.points;
        let measured = pts.iter().filter_map(|b| b.measured.as_ref().map(|m| (b.micro_batches as f64, 100.0 * m.median))).collect();
        let model = pts.iter().map(|b| (b.micro_batches as f64, 100.0 * b.model)).collect();
        let where_ =
            if self.several_gpus() { self.stages_placed() } else { format!("ONE GPU: {} (no model: it is for one GPU a stage)", self.stages_placed()) };
        let mut series =
            vec![Series { label: "forward only, measured (CUPTI timeline)".into(), color: kind_color(OpKind::Kernel), dashed: false, points: measured }];
        // Training in each order, measured the same way.
        for (t, color) in self.pipeline.training.iter().zip([kind_color(OpKind::D2d(crate::pipeline::op::Link { from: 0, to: 1 })), kind_color(OpKind::H2d)]) {
            let points = t.points.iter().filter_map(|b| b.measured.as_ref().map(|m| (b.micro_batches as f64, 100.0 * m.median))).collect();
            series.push(Series { label: format!("training, {} (forward and backward)", t.order.name()), color, dashed: false, points });
        }
        // The model only where it applies: a GPU a stage.
        if self.several_gpus() {
            series.push(Series { label: "model (S-1)/(M+S-1)".into(), color: GREY, dashed: true, points: model });
        }
        Figure {
            stem: format!("{LAB}-bubble"),
            title: format!("Lab 8: the bubble of a pipeline of {} stages", self.pipeline.stages),
            subtitle: origin.into(),
            panels: vec![Panel {
                title: format!("{} MiB, {where_}; events only, the CPU never waits", self.config.pipeline_mib),
                x_axis: XAxis::LogCount,
                x_label: "micro-batches".into(),
                y_label: "% of the time each GPU idles".into(),
                log_y: false,
                series,
            }],
            panel_size: (760, 420),
        }
    }

    /// Hidden share and bus bandwidth against bucket size; `None` when the
    /// all-reduce was skipped.
    pub fn all_reduce_chart(&self, origin: &str) -> Option<Figure> {
        let a = self.all_reduce.as_ref().ok()?;
        let by = |f: &dyn Fn(&AllReducePoint) -> f64| a.points.iter().map(|p| (p.bucket_bytes as f64, f(p))).collect::<Vec<_>>();
        let color = kind_color(OpKind::AllReduce(2));
        // Hidden by bucket under each CTA setting (NCCL's own choice first).
        let palette = [color, kind_color(OpKind::H2d), kind_color(OpKind::D2h), kind_color(OpKind::Kernel), BLACK];
        let mut hidden: Vec<Series> = a
            .sweeps()
            .into_iter()
            .zip(palette.iter().cycle())
            .map(|((ctas, pts), &c)| Series {
                label: format!("measured, {ctas}: (serial - overlapped) / comm"),
                color: c,
                dashed: false,
                points: pts.iter().map(|p| (p.bucket_bytes as f64, 100.0 * p.hidden())).collect(),
            })
            .collect();
        hidden.push(Series {
            label: "at most (the last bucket exposed; NCCL's choice)".into(),
            color: GREY,
            dashed: true,
            points: by(&|p| 100.0 * p.hidden_bound()),
        });
        let mut bus = vec![Series { label: "a bucket's sum, NCCL's choice of CTAs".into(), color, dashed: false, points: by(&|p| p.bus_gbps(a.ranks)) }];
        let by_size = a.bus_by_size();
        if !by_size.is_empty() {
            bus.push(Series {
                label: "alone by size (ours)".into(),
                color: BLACK,
                dashed: false,
                points: by_size.iter().map(|&(b, ours, _)| (b as f64, ours)).collect(),
            });
            let torch: Vec<(f64, f64)> = by_size.iter().filter_map(|&(b, _, t)| t.map(|t| (b as f64, t))).collect();
            if !torch.is_empty() {
                bus.push(Series { label: "PyTorch all_reduce, same GPUs, same run".into(), color: GREY, dashed: true, points: torch });
            }
        }
        Some(Figure {
            stem: format!("{LAB}-all-reduce"),
            title: format!("Lab 8: gradient all-reduce beside compute (NCCL {}, {} GPUs)", a.nccl_version, a.ranks),
            subtitle: origin.into(),
            panels: vec![
                Panel {
                    title: format!("{} MiB of gradients per GPU: the communication hidden by overlap", self.config.grad_mib),
                    x_axis: XAxis::LogBytes,
                    x_label: "bucket size".into(),
                    y_label: "% of the communication hidden".into(),
                    log_y: false,
                    series: hidden,
                },
                Panel {
                    title: "one all-reduce alone".into(),
                    x_axis: XAxis::LogBytes,
                    x_label: "bytes per all-reduce".into(),
                    y_label: "NCCL bus bandwidth, GB/s".into(),
                    log_y: false,
                    series: bus,
                },
            ],
            panel_size: (760, 380),
        })
    }

    fn gantt(&self, stem: &str, title: &str, origin: &str, t: Timeline) -> Gantt {
        Gantt::new(&format!("{LAB}-{stem}"), title, origin, vec![t])
    }

    /// One round of the four at once (None: no timeline was recorded).
    pub fn four_way_gantt(&self, origin: &str) -> Option<Gantt> {
        Some(self.gantt(
            "four-way",
            &format!("Lab 8: an upload, a download, a copy {} and a kernel at once", self.pair()),
            origin,
            // The source's upload is set-up, outside the timed round.
            self.four_way_timeline.as_ref()?.keeping(|s| s.label != super::four_way::PROLOGUE).illustrating(self.four_way.together_ms.median),
        ))
    }

    /// One run of the pipeline.
    pub fn pipeline_gantt(&self, origin: &str) -> Option<Gantt> {
        let m = PipelineResults::drawn(&self.config.micro_batches);
        let mut t = self.pipeline.timeline.clone()?;
        if let Some(p) = self.pipeline.points.iter().find(|p| p.micro_batches == m) {
            t = t.illustrating(p.total_ms.median);
        }
        Some(self.gantt("pipeline", &format!("Lab 8: {} stages over {m} micro-batches, ordered by events", self.pipeline.stages), origin, t))
    }

    /// One training run under 1F1B (the last order swept).
    pub fn training_gantt(&self, origin: &str) -> Option<Gantt> {
        let m = PipelineResults::drawn(&self.config.micro_batches);
        let t = self.pipeline.training.last()?;
        let mut tl = t.timeline.clone()?;
        if let Some(p) = t.points.iter().find(|p| p.micro_batches == m) {
            tl = tl.illustrating(p.total_ms.median);
        }
        Some(self.gantt("training", &format!("Lab 8: training, {}, {} stages over {m} micro-batches", t.order.name(), self.pipeline.stages), origin, tl))
    }

    /// One overlapped training step.
    pub fn all_reduce_gantt(&self, origin: &str) -> Option<Gantt> {
        let a = self.all_reduce.as_ref().ok()?;
        // The step is its layers and sums: the batch's upload and the
        // gradients' download around it are set-up and check, not timed.
        let mut t = a.timeline.as_ref()?.keeping(|s| !matches!(s.kind, OpKind::H2d | OpKind::D2h));
        // The step drawn is the one at the middle bucket size.
        let mut sizes: Vec<u64> = a.points.iter().map(|p| p.bucket_bytes).collect();
        sizes.sort_unstable();
        if let Some(p) = sizes.get(sizes.len() / 2).and_then(|&b| a.points.iter().find(|p| p.bucket_bytes == b)) {
            t = t.illustrating(p.overlapped_ms.median);
        }
        Some(self.gantt("all-reduce-step", "Lab 8: one training step, each bucket summed beside the next layers", origin, t))
    }
}

/// The report's files: every chart and timeline (timelines with their
/// Chrome traces) and the table.
pub fn report(r: &MultiGpuResults, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = r.peer_chart(origin).save(dir)?;
    files.extend(r.bubble_chart(origin).save(dir)?);
    if let Some(f) = r.all_reduce_chart(origin) {
        files.extend(f.save(dir)?);
    }
    for g in [r.four_way_gantt(origin), r.pipeline_gantt(origin), r.training_gantt(origin), r.all_reduce_gantt(origin)].into_iter().flatten() {
        files.extend(g.save(dir)?);
        let trace = dir.join(format!("{}.trace.json", g.stem));
        g.timelines[0].save_chrome_trace(&trace)?;
        files.push(trace);
    }
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}", r.table()))?);
    Ok(files)
}
