//! Time intervals (start, end) in µs: the union of a set of them (when
//! something was busy) and how much of one interval a union covers.
//!
//! May use: nothing of the diagnosis: the bottom of the stack.

/// `spans` merged into sorted, disjoint intervals.
pub fn union(mut spans: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Total length of disjoint intervals.
pub fn total(merged: &[(f64, f64)]) -> f64 {
    merged.iter().map(|(s, e)| e - s).sum()
}

/// How much of `(start, end)` the disjoint, sorted intervals `merged` cover.
pub fn covered(merged: &[(f64, f64)], (start, end): (f64, f64)) -> f64 {
    // The first interval that ends after `start`.
    let first = merged.partition_point(|&(_, e)| e <= start);
    let mut sum = 0.0;
    for &(s, e) in &merged[first..] {
        if s >= end {
            break;
        }
        sum += e.min(end) - s.max(start);
    }
    sum.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_merge_overlapping_and_touching_spans() {
        let u = union(vec![(5.0, 7.0), (0.0, 2.0), (1.0, 3.0), (3.0, 4.0), (10.0, 11.0)]);
        assert_eq!(u, vec![(0.0, 4.0), (5.0, 7.0), (10.0, 11.0)]);
        assert_eq!(total(&u), 7.0);
        assert_eq!(union(vec![]), vec![]);
    }

    #[test]
    fn coverage_counts_only_the_overlap() {
        let u = vec![(0.0, 4.0), (5.0, 7.0), (10.0, 11.0)];
        assert_eq!(covered(&u, (3.0, 6.0)), 2.0);
        assert_eq!(covered(&u, (7.0, 10.0)), 0.0);
        assert_eq!(covered(&u, (-5.0, 20.0)), 7.0);
        assert_eq!(covered(&[], (0.0, 1.0)), 0.0);
    }
}
