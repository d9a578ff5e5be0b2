//! How the report writes its numbers into text, one way for every room
//! that writes them (the findings, the what-if table, the printed
//! diagnosis): a time in µs as `3.36 ms` ([`us`]), a rate in GB/s with the
//! digits it needs ([`gbps`]), a count with its noun (`counted`).
//!
//! May use: `units` (the crate's, for a time's digits). Nothing of the
//! diagnosis: this sits at the bottom so that any room may word a number.

/// A time in µs as the report prints it (`3.36 ms`, `12.0 µs`).
pub fn us(t: f64) -> String {
    crate::units::fmt_ms(t / 1e3)
}

/// A rate in GB/s with the digits it needs: "53.0", "0.0021".
pub fn gbps(r: f64) -> String {
    if r >= 1.0 || r <= 0.0 {
        format!("{r:.1}")
    } else {
        let digits = 1 + (-r.log10().floor()) as usize;
        format!("{r:.digits$}")
    }
}

/// "1 copy", "3 copies".
pub(crate) fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
