//! Byte sizes that print and parse the way people write them (`4KiB`, `1GiB`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A duration given in ms, in the unit that suits its size: `-4.36 ms`,
/// `2.0 µs`, `1.25 s`, so a table never prints -4360.0 µs.
pub fn fmt_ms(ms: f64) -> String {
    let a = ms.abs();
    if !ms.is_finite() {
        "n/a".into()
    } else if a >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if a >= 1.0 {
        format!("{ms:.2} ms")
    } else if a >= 1e-3 || a == 0.0 {
        format!("{:.1} µs", ms * 1e3)
    } else {
        format!("{:.0} ns", ms * 1e6)
    }
}

/// A byte count. Displays with binary units, parses `4096`, `4K`, `4KiB`, `64MiB`, `1G`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    pub fn get(self) -> u64 {
        self.0
    }
    pub fn as_usize(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        let (unit, div) = if b >= GIB {
            ("GiB", GIB)
        } else if b >= MIB {
            ("MiB", MIB)
        } else if b >= KIB {
            ("KiB", KIB)
        } else {
            return write!(f, "{b} B");
        };
        if b % div == 0 {
            write!(f, "{} {unit}", b / div)
        } else {
            write!(f, "{:.1} {unit}", b as f64 / div as f64)
        }
    }
}

impl FromStr for Bytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(format!("'{s}' is not a size (expected e.g. 4096, 4KiB, 64MiB, 1GiB)"));
        }
        let n: u64 = num.parse().map_err(|_| format!("'{s}' is too large a number"))?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" | "kb" => KIB,
            "m" | "mib" | "mb" => MIB,
            "g" | "gib" | "gb" => GIB,
            other => return Err(format!("unknown size unit '{other}' in '{s}' (use B, KiB, MiB or GiB)")),
        };
        n.checked_mul(mult).map(Bytes).ok_or_else(|| format!("'{s}' overflows 64 bits"))
    }
}

/// A name as a file-name part: lower-case letters and digits, anything
/// else one '-' ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3").
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_in_the_unit_that_suits_them() {
        assert_eq!(fmt_ms(-4360.0), "-4.36 s");
        assert_eq!(fmt_ms(-4.36), "-4.36 ms");
        assert_eq!(fmt_ms(8.93), "8.93 ms");
        assert_eq!(fmt_ms(0.002), "2.0 µs");
        assert_eq!(fmt_ms(-0.5), "-500.0 µs");
        assert_eq!(fmt_ms(0.0), "0.0 µs");
        assert_eq!(fmt_ms(2e-7), "0 ns");
        assert_eq!(fmt_ms(f64::NAN), "n/a");
    }

    #[test]
    fn parses_and_prints_binary_units() {
        assert_eq!("4KiB".parse::<Bytes>().unwrap(), Bytes(4096));
        assert_eq!("64M".parse::<Bytes>().unwrap(), Bytes(64 * MIB));
        assert_eq!(" 1 GiB".trim().parse::<Bytes>().unwrap(), Bytes(GIB));
        assert_eq!("4096".parse::<Bytes>().unwrap(), Bytes(4096));
        assert_eq!(Bytes(GIB).to_string(), "1 GiB");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(12).to_string(), "12 B");
    }

    #[test]
    fn rejects_garbage() {
        assert!("".parse::<Bytes>().is_err());
        assert!("KiB".parse::<Bytes>().is_err());
        assert!("4XB".parse::<Bytes>().unwrap_err().contains("unknown size unit"));
        assert!("99999999999999999999".parse::<Bytes>().is_err());
        assert!("17179869184G".parse::<Bytes>().unwrap_err().contains("overflows"));
    }
}
