//! Where each element of a buffer came from, kept as runs. A copy or a
//! kernel moves a range of elements whose provenance steps by one element
//! each (input 7, input 8, input 9...; or the same "never written"
//! throughout): such a range is one run, so the dry run's work per op is
//! its number of runs, not its number of elements. A 64 MiB buffer of a
//! plan in 4096 chunks holds a few thousand runs where it held 16 million
//! cells.

use std::collections::BTreeMap;
use std::ops::Range;

/// Where an element's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Never written.
    Unset,
    /// Input element i.
    Input(u32),
    /// The kernel applied to input element i.
    Output(u32),
    /// The kernel applied `times` times (2 or more) to input element i: a
    /// pipeline of stages, each running the kernel on the one before's output.
    Repeated(u32, u8),
    /// The sum over `ranks` GPUs (2 or more) of input elements `first`,
    /// `first + stride`, ... each after `passes` kernels: what an
    /// all-reduce leaves in every rank's buffer when rank r held element
    /// `first + r * stride` ([`super::issue::Issue::all_reduce`]).
    Summed { first: u32, stride: u32, ranks: u8, passes: u8 },
    /// The kernel applied to something that was not an input, or a sum of
    /// elements that are not one input's run of ranks (what no run can be
    /// checked against).
    Garbage,
}

impl Provenance {
    /// What the kernel makes of this element: one more pass over an input.
    pub fn computed(self) -> Provenance {
        match self {
            Provenance::Input(i) => Provenance::Output(i),
            Provenance::Output(i) => Provenance::Repeated(i, 2),
            Provenance::Repeated(i, k) if k < u8::MAX => Provenance::Repeated(i, k + 1),
            // A kernel over a sum is not a pass over one input.
            _ => Provenance::Garbage,
        }
    }
    /// The input element and kernel passes this element is, if it is one
    /// (not a sum, nothing unset).
    pub fn passes_of(self) -> Option<(u32, u8)> {
        match self {
            Provenance::Input(i) => Some((i, 0)),
            Provenance::Output(i) => Some((i, 1)),
            Provenance::Repeated(i, k) => Some((i, k)),
            _ => None,
        }
    }
    /// What an all-reduce makes of one element held by each rank, in rank
    /// order: their sum when they are one run of inputs after the same
    /// passes ([`Provenance::Summed`]), the element itself over one rank.
    pub fn sum_of(ranks: &[Provenance]) -> Provenance {
        let terms: Option<Vec<(u32, u8)>> = ranks.iter().map(|p| p.passes_of()).collect();
        match (ranks, terms) {
            ([], _) => Provenance::Garbage,
            ([one], _) => *one,
            (_, Some(t)) if t.len() <= u8::MAX as usize => {
                let (first, passes) = t[0];
                let Some(stride) = t[1].0.checked_sub(first) else { return Provenance::Garbage };
                let at = |r: usize| (r as u32).checked_mul(stride).and_then(|x| x.checked_add(first));
                if t.iter().enumerate().all(|(r, &(i, k))| k == passes && at(r) == Some(i)) {
                    Provenance::Summed { first, stride, ranks: t.len() as u8, passes }
                } else {
                    Provenance::Garbage
                }
            }
            _ => Provenance::Garbage,
        }
    }
    /// Input element i after `times` passes of the kernel (0: the input).
    pub fn after(i: u32, times: u8) -> Provenance {
        match times {
            0 => Provenance::Input(i),
            1 => Provenance::Output(i),
            k => Provenance::Repeated(i, k),
        }
    }
}

impl Provenance {
    /// The provenance `k` elements further along a run that starts with
    /// this one: the next input element for each that names one; the
    /// same for what names none (never written, garbage).
    pub fn stepped(self, k: usize) -> Provenance {
        let k = k as u32;
        match self {
            Provenance::Input(i) => Provenance::Input(i.wrapping_add(k)),
            Provenance::Output(i) => Provenance::Output(i.wrapping_add(k)),
            Provenance::Repeated(i, t) => Provenance::Repeated(i.wrapping_add(k), t),
            Provenance::Summed { first, stride, ranks, passes } => Provenance::Summed { first: first.wrapping_add(k), stride, ranks, passes },
            Provenance::Unset | Provenance::Garbage => self,
        }
    }
}

/// A buffer's provenance, element by element, as runs (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cells {
    len: usize,
    /// Each run's first element and its provenance there; the first run
    /// starts at 0; a run ends where the next begins (or at `len`).
    runs: BTreeMap<usize, Provenance>,
}

/// A piece of a run: its length and the provenance of its first element.
pub type Piece = (usize, Provenance);

impl Cells {
    /// `len` elements, all `p` stepped along (one run).
    pub fn run(len: usize, p: Provenance) -> Cells {
        let mut runs = BTreeMap::new();
        if len > 0 {
            runs.insert(0, p);
        }
        Cells { len, runs }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Element `i`'s provenance.
    pub fn get(&self, i: usize) -> Provenance {
        assert!(i < self.len, "element {i} of {}", self.len);
        let (&start, &p) = self.runs.range(..=i).next_back().expect("a run starts at 0");
        p.stepped(i - start)
    }
    /// The runs: each one's elements and its first element's provenance.
    pub fn runs(&self) -> impl Iterator<Item = (Range<usize>, Provenance)> + '_ {
        let mut it = self.runs.iter().peekable();
        std::iter::from_fn(move || {
            let (&start, &p) = it.next()?;
            let end = it.peek().map_or(self.len, |(&s, _)| s);
            Some((start..end, p))
        })
    }
    /// Every element's provenance, in order.
    pub fn iter(&self) -> impl Iterator<Item = Provenance> + '_ {
        self.runs().flat_map(|(r, p)| (0..r.len()).map(move |k| p.stepped(k)))
    }
    pub fn to_vec(&self) -> Vec<Provenance> {
        self.iter().collect()
    }
    /// The pieces of runs that cover `range`, in order.
    pub fn pieces(&self, range: Range<usize>) -> Vec<Piece> {
        assert!(range.end <= self.len, "{range:?} of {}", self.len);
        let mut out = Vec::new();
        if range.is_empty() {
            return out;
        }
        let (&first_start, &first) = self.runs.range(..=range.start).next_back().expect("a run starts at 0");
        let mut at = range.start;
        let mut current = first.stepped(range.start - first_start);
        for (&start, &p) in self.runs.range(range.start + 1..range.end) {
            out.push((start - at, current));
            (at, current) = (start, p);
        }
        out.push((range.end - at, current));
        out
    }
    /// Writes `pieces` (their lengths summing to the range's) over the
    /// elements from `at` on.
    pub fn write(&mut self, at: usize, pieces: &[Piece]) {
        let n: usize = pieces.iter().map(|p| p.0).sum();
        let end = at + n;
        assert!(end <= self.len, "{n} elements at {at} of {}", self.len);
        if n == 0 {
            return;
        }
        // What runs on after the written range, as it was.
        let after = (end < self.len).then(|| self.get(end));
        let stale: Vec<usize> = self.runs.range(at..end).map(|(&s, _)| s).collect();
        for s in stale {
            self.runs.remove(&s);
        }
        let mut start = at;
        for &(len, p) in pieces.iter().filter(|p| p.0 > 0) {
            self.runs.insert(start, p);
            start += len;
        }
        if let Some(p) = after {
            self.runs.entry(end).or_insert(p);
        }
        // Runs that carry on into the next (the same step) become one.
        self.merge_at(end);
        let mut s = at;
        for &(len, _) in pieces.iter().filter(|p| p.0 > 0) {
            self.merge_at(s);
            s += len;
        }
    }
    /// Joins the run starting at `at` to the one before it where it carries
    /// the one before on.
    fn merge_at(&mut self, at: usize) {
        if at == 0 {
            return;
        }
        let Some(&p) = self.runs.get(&at) else { return };
        let Some((&start, &before)) = self.runs.range(..at).next_back() else { return };
        if before.stepped(at - start) == p {
            self.runs.remove(&at);
        }
    }
    /// `f` of every element of `range`, as pieces (`f` must map a run to a
    /// run: the kernel's pass over an input, or nothing).
    pub fn mapped(&self, range: Range<usize>, f: impl Fn(Provenance) -> Provenance) -> Vec<Piece> {
        self.pieces(range).into_iter().map(|(n, p)| (n, f(p))).collect()
    }
}

/// What an all-reduce leaves in each rank's range: element by element, the
/// sum of the ranks' elements ([`Provenance::sum_of`]), as pieces. Each
/// rank's pieces (`ranks[r]`, all of one total length) are cut at every
/// rank's run boundaries; within a piece every rank steps by one, so the
/// sum does too (checked at the piece's last element; where it does not,
/// that piece is summed element by element).
pub fn summed(ranks: &[Vec<Piece>]) -> Vec<Piece> {
    let n: usize = ranks.first().map_or(0, |r| r.iter().map(|p| p.0).sum());
    let mut cuts: Vec<usize> = ranks
        .iter()
        .flat_map(|r| {
            r.iter().scan(0, |at, p| {
                *at += p.0;
                Some(*at)
            })
        })
        .chain([0])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let at = |r: &Vec<Piece>, i: usize| -> Provenance {
        let mut start = 0;
        for &(len, p) in r {
            if i < start + len {
                return p.stepped(i - start);
            }
            start += len;
        }
        Provenance::Garbage
    };
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a >= n {
            break;
        }
        let sum = |i: usize| Provenance::sum_of(&ranks.iter().map(|r| at(r, i)).collect::<Vec<_>>());
        let first = sum(a);
        if sum(b - 1) == first.stepped(b - 1 - a) {
            out.push((b - a, first));
        } else {
            out.extend((a..b).map(|i| (1, sum(i))));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Provenance::*;

    #[test]
    fn a_copy_keeps_runs_and_writes_split_and_join_them() {
        let mut c = Cells::run(16, Unset);
        c.write(4, &[(8, Input(4))]);
        assert_eq!(c.runs().count(), 3);
        assert_eq!((c.get(3), c.get(4), c.get(11), c.get(12)), (Unset, Input(4), Input(11), Unset));
        // Inputs 0..4 before them carry the run on: one run of 12.
        c.write(0, &[(4, Input(0))]);
        assert_eq!(c.runs().collect::<Vec<_>>(), [(0..12, Input(0)), (12..16, Unset)]);
        // A kernel over the middle.
        let k = c.mapped(2..6, Provenance::computed);
        assert_eq!(k, [(4, Output(2))]);
        c.write(2, &k);
        assert_eq!(c.to_vec()[..7], [Input(0), Input(1), Output(2), Output(3), Output(4), Output(5), Input(6)]);
        assert_eq!(c.pieces(1..8), [(1, Input(1)), (4, Output(2)), (2, Input(6))]);
        assert_eq!(c.len(), 16);
        assert_eq!(c.iter().count(), 16);
    }

    #[test]
    fn a_write_over_everything_is_one_run_again() {
        let mut c = Cells::run(8, Input(0));
        c.write(3, &[(2, Garbage)]);
        c.write(0, &[(8, Output(0))]);
        assert_eq!(c.runs().count(), 1);
        // A write that ends where the next run would carry it on joins it.
        let mut d = Cells::run(8, Unset);
        d.write(4, &[(4, Input(4))]);
        d.write(0, &[(4, Input(0))]);
        assert_eq!(d.runs().count(), 1);
    }

    #[test]
    fn sums_step_along_runs_and_mixed_runs_are_cut() {
        let a = vec![(4, Input(0)), (4, Input(100))];
        let b = vec![(2, Input(8)), (6, Input(10))];
        let s = summed(&[a.clone(), b]);
        let flat: Vec<Provenance> = s.iter().flat_map(|&(n, p)| (0..n).map(move |k| p.stepped(k))).collect();
        assert_eq!(flat[0], Summed { first: 0, stride: 8, ranks: 2, passes: 0 });
        assert_eq!(flat[3], Summed { first: 3, stride: 8, ranks: 2, passes: 0 });
        assert_eq!(flat[4], Garbage, "input 100 and input 12 are not one run of ranks");
        assert_eq!(s.iter().map(|p| p.0).sum::<usize>(), 8);
        assert_eq!(summed(std::slice::from_ref(&a)), a, "one rank's sum is itself");
    }
}
