//! Lab 7's results in words: what the run shows (the lab's best pipelined
//! kernel against the naive one and against the plain CUDA reference at
//! its best over its sweep, whose grid of launches is printed too), the
//! headline rows and the measured figures behind them.
//!
//! May use: `super::results` and `super::settings`, `lab_kit::headline`.
//! No GPU.

use super::results::{gbps, KernelPipelineResults, VariantResult};
use super::settings::{BlocksPerSm, Role, Variant};

/// A kernel's name with its launch said where the name leaves it out (one
/// block per SM, the lab's usual launch).
pub fn launch_name(v: &Variant) -> String {
    if BlocksPerSm(v.blocks_per_sm) == BlocksPerSm::ONE {
        format!("{}, one block per SM", v.name)
    } else {
        v.name.clone()
    }
}

impl KernelPipelineResults {
    /// What the run shows, in words, with the numbers and spreads.
    pub fn summary_lines(&self) -> String {
        let mut out = String::new();
        if let (Some(best), Some(naive)) = (self.best_pipelined(), self.by_role(Role::Baseline)) {
            let (b, n) = (best.ms.as_ref().unwrap(), naive.ms.as_ref().unwrap());
            out += &format!(
                "best pipelined kernel: {} at {:.1}% of the ceiling, {:.2}x the naive kernel at one block per SM ({:.4} vs {:.4} ms, spreads {:.4} / {:.4}: {})\n",
                best.variant.name,
                100.0 * self.share(best).unwrap(),
                n.median / b.median,
                b.median,
                n.median,
                b.middle_spread(),
                n.middle_spread(),
                if n.median - b.median > b.middle_spread().max(n.middle_spread()) { "beyond the spreads" } else { "NOT beyond the spreads" }
            );
        }
        if let (Some(best), Some(plain)) = (self.best_pipelined(), self.plain_reference()) {
            let (b, p) = (best.ms.as_ref().unwrap(), plain.ms.as_ref().unwrap());
            let points = 100.0 * (self.share(best).unwrap() - self.share(plain).unwrap());
            let beyond = (p.median - b.median).abs() > b.middle_spread().max(p.middle_spread());
            out += &format!(
                "the plain CUDA reference (the CUDA guide's two-stage cuda::pipeline), at its best ({}; the best of {} launches swept), reaches {:.1}% of the ceiling: the lab's best pipelined kernel is {:.1} points {} it ({:.4} vs {:.4} ms, spreads {:.4} / {:.4}: {})\n",
                launch_name(&plain.variant),
                self.yardstick_launches(),
                100.0 * self.share(plain).unwrap(),
                points.abs(),
                if points >= 0.0 { "above" } else { "BELOW" },
                b.median,
                p.median,
                b.middle_spread(),
                p.middle_spread(),
                if beyond { "beyond the spreads" } else { "within the spreads" }
            );
        }
        if let (Some(best), Some(occ)) = (self.best_pipelined(), self.by_role(Role::Occupancy)) {
            let (b, o) = (best.ms.as_ref().unwrap(), occ.ms.as_ref().unwrap());
            let res = occ.resources.unwrap();
            out += &format!(
                "the naive kernel with {} blocks per SM reaches {:.1}% of the ceiling: more warps also keep loads in flight; the best pipelined kernel is {:+.1}% faster than it, with one block per SM\n",
                res.blocks_per_sm,
                100.0 * self.share(occ).unwrap(),
                100.0 * (o.median / b.median - 1.0)
            );
        }
        out
    }

    /// How many launches of the plain CUDA reference ran: what its best is
    /// the best of.
    pub fn yardstick_launches(&self) -> usize {
        self.ran().filter(|r| r.variant.role == Role::PlainReference).count()
    }

    /// The plain CUDA reference's sweep as a grid: a row per tile, a
    /// column per launch asked, each cell its share of the ceiling (with
    /// the blocks per SM launched where it asked as many as fit), the
    /// best marked; a launch skipped says so. Empty where it never ran.
    pub fn yardstick_lines(&self) -> String {
        let plain: Vec<&VariantResult> = self.variants.iter().filter(|r| r.variant.role == Role::PlainReference).collect();
        if plain.is_empty() {
            return String::new();
        }
        let mut tiles: Vec<u32> = Vec::new();
        let mut launches: Vec<u32> = Vec::new();
        for r in &plain {
            if !tiles.contains(&r.variant.shape.tile) {
                tiles.push(r.variant.shape.tile);
            }
            if !launches.contains(&r.variant.blocks_per_sm) {
                launches.push(r.variant.blocks_per_sm);
            }
        }
        let best = self.plain_reference();
        let mut out = format!(
            "the plain CUDA reference's sweep (share of the ceiling at the median; 2 stages, {} threads; * its best):\n  {:<6}",
            plain[0].variant.shape.threads, "tile"
        );
        for &b in &launches {
            out += &format!(" {:>22}", BlocksPerSm(b).words());
        }
        out += "\n";
        for &t in &tiles {
            out += &format!("  {t:<6}");
            for &b in &launches {
                let r = plain.iter().find(|r| r.variant.shape.tile == t && r.variant.blocks_per_sm == b);
                let cell = match r {
                    Some(r) => match (self.share(r), &r.skipped) {
                        (Some(s), _) => {
                            let fit = match r.resources {
                                Some(res) if BlocksPerSm(b) == BlocksPerSm::MAX => format!(" ({})", res.blocks_per_sm),
                                _ => String::new(),
                            };
                            let star = if best.is_some_and(|x| std::ptr::eq(x, *r)) { "*" } else { " " };
                            format!("{:.1}%{fit}{star}", 100.0 * s)
                        }
                        (None, Some(_)) => "skipped ".into(),
                        (None, None) => "- ".into(),
                    },
                    None => "- ".into(),
                };
                out += &format!(" {cell:>22}");
            }
            out += "\n";
        }
        out
    }

    /// The measured numbers behind [`Self::headline`]: the ceiling's copy
    /// and every kernel that ran.
    pub fn headline_figures(&self) -> Vec<crate::lab_kit::headline::HeadlineFigure> {
        let c = self.ceiling_copy();
        // By rate, not time: the fastest copy's size may differ from run to run.
        let rate = c.ms.map_decreasing(|ms| gbps((c.mib << 20) / 4, ms));
        let mut v = vec![crate::lab_kit::headline::HeadlineFigure::new("device-memory ceiling (the fastest copy)", "GB/s", rate)];
        v.extend(self.ran().filter_map(|r| Some(crate::lab_kit::headline::HeadlineFigure::new(r.variant.name.clone(), "ms", r.ms?))));
        v
    }
    /// The headline rows.
    pub fn headline(&self) -> Vec<(String, String)> {
        let c = self.ceiling_copy();
        let mut rows = vec![(
            "device-memory ceiling (D2D copy, read + write)".to_string(),
            format!("{:.0} GB/s ({} MiB copy{})", c.gbps(), c.mib, if self.ceiling_sweep.is_empty() { "; no larger copy swept" } else { "" }),
        )];
        let pct = |r: Option<&VariantResult>| r.and_then(|r| self.share(r)).map_or("-".to_string(), |s| format!("{:.1}%", 100.0 * s));
        rows.push(("naive kernel, one block per SM, of the ceiling".into(), pct(self.by_role(Role::Baseline))));
        rows.push(("naive kernel, as many blocks as fit, of the ceiling".into(), pct(self.by_role(Role::Occupancy))));
        if let Some(best) = self.best_pipelined() {
            rows.push(("best pipelined kernel, of the ceiling".into(), format!("{} ({})", pct(Some(best)), best.variant.name)));
        }
        if let Some(plain) = self.plain_reference() {
            let of = self.yardstick_launches();
            rows.push((
                "plain CUDA two-stage reference, of the ceiling".into(),
                format!("{} ({}; the best of {of} launches swept)", pct(Some(plain)), launch_name(&plain.variant)),
            ));
        }
        rows
    }
}
#[cfg(test)]
mod tests {
    use super::super::fixture::results as fixture;
    use super::super::settings::BlocksPerSm;
    use super::super::LAB;
    use super::*;
    use crate::measure::stats::Summary;

    #[test]
    fn the_table_and_headline_name_the_best_kernel_the_naive_one_and_the_skipped() {
        let r = fixture();
        let t = r.table();
        assert!(t.contains("skipped: tile_tma.cu needs compute capability 9.0"), "{t}");
        // Best: 1.025 ms (4 stages) against the naive 2.0 ms: 1.95x, 97.6% of the ceiling (1.0 ms).
        assert!(t.contains("best pipelined kernel: warp-specialized, 4 stages, 10 compute warps at 97.6%"), "{t}");
        assert!(t.contains("1.95x the naive kernel") && t.contains("beyond the spreads"), "{t}");
        assert!(t.contains("blocks per SM reaches 83.3%") && t.contains("+17.1% faster"), "{t}");
        let h = r.headline();
        assert_eq!(h[1].1, "50.0%");
        assert_eq!(h[2].1, "83.3%");
        assert!(h[3].1.starts_with("97.6% (warp-specialized"), "{h:?}");
        // The reference at its best over its sweep (tile 1024, as many
        // blocks as fit, 1.04 ms): 96.2%, 1.4 points under the best; 7 of
        // its 8 launches ran.
        assert_eq!(
            h[4],
            (
                "plain CUDA two-stage reference, of the ceiling".into(),
                "96.2% (plain CUDA reference (2 stages), tile 1024, as many blocks as fit; the best of 7 launches swept)".into()
            )
        );
        assert!(
            t.contains("at its best (plain CUDA reference (2 stages), tile 1024, as many blocks as fit; the best of 7 launches swept), reaches 96.2%"),
            "{t}"
        );
        assert!(t.contains("reaches 96.2% of the ceiling: the lab's best pipelined kernel is 1.4 points above it") && t.contains("within the spreads"), "{t}");
        assert!(t.contains("\n  plain CUDA reference (2 stages), tile 1024 "), "its own row: {t}");
        // Each winner is marked in the table: the lab's best and the yardstick's.
        let row = |name: &str| t.lines().find(|l| l.starts_with(&format!("  {name} "))).unwrap_or_else(|| panic!("no row {name}: {t}")).to_string();
        assert!(row("warp-specialized, 4 stages, 10 compute warps").ends_with("<- the lab's best"), "{t}");
        assert!(row("plain CUDA reference (2 stages), tile 1024, as many blocks as fit").ends_with("<- the yardstick at its best"), "{t}");
        assert!(!row("plain CUDA reference (2 stages), tile 1024").contains("<-"), "{t}");
        assert!(row("plain CUDA reference (2 stages), tile 2048, 4 blocks per SM").contains("skipped: 4 blocks per SM do not fit"), "{t}");
        // A reference faster than every kernel of the lab is said so, and is never the lab's best.
        let mut fast = r.clone();
        for v in fast.variants.iter_mut().filter(|v| v.variant.role == Role::PlainReference && v.ms.is_some()) {
            v.ms = Some(Summary::of(&[0.9, 0.9, 0.9]).unwrap());
        }
        assert_ne!(fast.best_pipelined().unwrap().variant.role, Role::PlainReference);
        let t = fast.table();
        assert!(t.contains("the lab's best pipelined kernel is 13.6 points BELOW it") && t.contains("beyond the spreads"), "{t}");
        let ceiling = r.ceiling_gbps();
        assert!((ceiling - 2.0 * 4.0 * r.config.elements() as f64 / 1e6).abs() < 1e-6, "{ceiling}");
    }

    /// Recordings made before the plain reference and the vector width
    /// load as what they ran (one float at a time, one block per SM, no
    /// reference) and still render.
    #[test]
    fn recordings_from_before_the_plain_reference_load_as_what_they_ran() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let found = crate::measure::record::find_recordings::<KernelPipelineResults>(&data, LAB).unwrap();
        assert!(!found.is_empty());
        for (path, rec) in found {
            let r = &rec.results;
            if r.variants.iter().any(|x| x.variant.role == Role::PlainReference) {
                continue;
            }
            let at = path.display();
            assert_eq!((r.config.vector_width, &r.config.sweep_blocks_per_sm), (1, &vec![BlocksPerSm::ONE]), "{at}");
            assert!(r.config.plain_blocks_per_sm.is_empty() && r.variants.iter().all(|x| x.variant.vector_width == 1), "{at}");
            assert!(r.plain_reference().is_none() && !r.table().contains("plain CUDA reference ("), "{at}");
            assert!(!r.headline().iter().any(|(k, _)| k.contains("plain")), "{at}");
        }
    }

    /// The yardstick's grid: a row per tile, a column per launch, its best
    /// starred, a launch that does not fit skipped, the blocks launched
    /// where it asked as many as fit.
    #[test]
    fn the_yardstick_s_sweep_is_a_grid_with_its_best_starred() {
        let r = fixture();
        let g = r.yardstick_lines();
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines.len(), 4, "{g}");
        assert!(lines[0].starts_with("the plain CUDA reference's sweep") && lines[0].contains("2 stages, 128 threads"), "{g}");
        for words in ["tile", "one block per SM", "2 blocks per SM", "4 blocks per SM", "as many blocks as fit"] {
            assert!(lines[1].contains(words), "{words}: {g}");
        }
        // Tile 1024: 1.06, 1.05, 1.05 and 1.04 ms (8 blocks) against the 1.0 ms copy.
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[2]), ["1024", "94.3%", "95.2%", "95.2%", "96.2%", "(8)*"], "{g}");
        assert_eq!(cells(lines[3]), ["2048", "92.6%", "93.5%", "skipped", "93.5%", "(8)"], "{g}");
        assert_eq!(g.matches('*').count() - 1, 1, "one best, and the legend's star: {g}");
        assert_eq!(r.yardstick_launches(), 7);
        // A run with no reference prints no grid.
        let mut none = r.clone();
        none.variants.retain(|v| v.variant.role != Role::PlainReference);
        assert_eq!((none.yardstick_lines(), none.yardstick_launches()), (String::new(), 0));
        assert!(none.plain_reference().is_none() && !none.headline().iter().any(|(k, _)| k.contains("plain")));
        assert_eq!(launch_name(&r.variants[0].variant), "naive, one block per SM");
    }

    /// The H200's recording, from before the sweep: the reference at its
    /// best of the two launches it ran, at tile 4096, said with its launch.
    #[test]
    fn a_recording_from_before_the_sweep_names_its_best_of_the_launches_it_ran() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let found = crate::measure::record::find_recordings::<KernelPipelineResults>(&data, LAB).unwrap();
        let mut seen = 0;
        for (path, rec) in found {
            let r = &rec.results;
            let Some(best) = r.plain_reference() else { continue };
            seen += 1;
            let at = path.display();
            assert_eq!((best.variant.shape.tile, r.yardstick_launches()), (4096, r.config.plain_blocks_per_sm.len()), "{at}");
            let row = r.headline().into_iter().find(|(k, _)| k.contains("plain")).unwrap().1;
            assert!(
                row.contains(&launch_name(&best.variant)) && row.ends_with(&format!("; the best of {} launches swept)", r.yardstick_launches())),
                "{at}: {row}"
            );
            assert_eq!(r.yardstick_lines().lines().count(), 3, "{at}: one tile swept");
        }
        assert!(seen >= 1, "a recording with the reference");
    }
}
