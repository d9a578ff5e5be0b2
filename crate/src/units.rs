//! Byte sizes that print and parse the way people write them (`4KiB`,
//! `1.5GiB`), the command line's size options, and what its number options
//! expect.

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

/// A byte count. Displays with binary units, parses `4096`, `4K`, `4KiB`, `64MiB`, `1.5G`.
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
    /// `4096`, `4K`, `4KiB`, `1.5 GiB`: a bare number is bytes.
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s, 1).map(Bytes)
    }
}

/// The units a size may carry, each a power of 1024 (`KB` is read as
/// `KiB`, as the tools learners know from `ls -h` and `free` print them).
const SIZE_UNITS: &[(&[&str], u64)] =
    &[(&["b"], 1), (&["k", "kb", "kib"], KIB), (&["m", "mb", "mib"], MIB), (&["g", "gb", "gib"], GIB), (&["t", "tb", "tib"], 1 << 40)];

/// A size as people write it: a whole or decimal number, then an
/// optional unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB); a bare
/// number counts `bare` bytes each. The one parser of sizes: [`Bytes`]'s
/// `FromStr` and the command line's size options ([`size_option`],
/// [`mib_option`]) all read sizes through it.
fn parse_size(s: &str, bare: u64) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("'{s}' is negative: expected a size of 0 or more, e.g. 64MiB"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let (whole, fraction) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(format!("'{s}' is not a size (expected a number and a unit, e.g. 4096, 4KiB, 1.5GiB)"));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult = match unit.as_str() {
        "" => bare,
        u => match SIZE_UNITS.iter().find(|(names, _)| names.contains(&u)) {
            Some((_, m)) => *m,
            None => return Err(format!("unknown size unit '{unit}' in '{s}' (use B, KiB, MiB, GiB or TiB)")),
        },
    };
    // Exact arithmetic: 1.5GiB is 1610612736 bytes, 0.1KiB no whole number of them.
    let too_large = || format!("'{s}' overflows 64 bits");
    let digits = |d: &str| if d.is_empty() { Ok(0) } else { d.parse::<u128>().map_err(|_| too_large()) };
    let scale = 10u128.checked_pow(fraction.len() as u32).ok_or_else(too_large)?;
    let (whole, fraction) = (digits(whole)?, digits(fraction)?);
    let scaled = whole.checked_mul(scale).and_then(|w| w.checked_add(fraction)).ok_or_else(too_large)?;
    let bytes = scaled.checked_mul(mult as u128).ok_or_else(too_large)?;
    if bytes % scale != 0 {
        return Err(format!("'{s}' is not a whole number of bytes"));
    }
    u64::try_from(bytes / scale).map_err(|_| too_large())
}

/// A size option of the command line (`--min 4KiB`): a size of more than
/// 0, in bytes where no unit is given.
pub fn size_option(s: &str) -> Result<Bytes, String> {
    match parse_size(s, 1)? {
        0 => Err(format!("'{s}' is a size of 0: expected more than 0 bytes")),
        b => Ok(Bytes(b)),
    }
}

/// A size option the labs keep in MiB (`--gpu-budget 1.5GiB`,
/// `--sizes-mib 64`): a whole number of MiB, in MiB where no unit is
/// given. Recordings keep the number of MiB, as before. 0 parses (lab 7's
/// `--ceiling-max-mib 0`: no sweep); each lab's settings say which range
/// an option takes.
pub fn mib_option(s: &str) -> Result<usize, String> {
    let b = parse_size(s, MIB)?;
    if b % MIB != 0 {
        return Err(format!("'{s}' is {}: expected a whole number of MiB", Bytes(b)));
    }
    usize::try_from(b / MIB).map_err(|_| format!("'{s}' is too large"))
}

/// What a number option of the command line expects, where its own
/// parser's words do not say (clap's parsers of plain numbers say
/// "invalid digit found in string"): `error` is the parser's error and
/// `value` what was given. `None`: the error says it already (the size
/// options' parsers above, a range).
pub fn number_expected(error: &(dyn std::error::Error + 'static), value: &str) -> Option<String> {
    let negative = value.trim().starts_with('-');
    if let Some(e) = error.downcast_ref::<std::num::ParseIntError>() {
        return Some(match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "expected a smaller whole number".to_string(),
            _ if negative => "expected a whole number of 0 or more, not a negative one".to_string(),
            _ => "expected a whole number, e.g. 4".to_string(),
        });
    }
    if error.downcast_ref::<std::num::ParseFloatError>().is_some() {
        return Some("expected a number, e.g. 2.5".to_string());
    }
    // clap's parser of u32 reads an i64, then says "-1 is not in 0..=4294967295".
    let out_of_range = error.to_string().starts_with(&format!("{} is not in 0..", value.trim()));
    (negative && out_of_range).then(|| "expected a whole number of 0 or more, not a negative one".to_string())
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
        assert!("1.2.3MiB".parse::<Bytes>().unwrap_err().contains("is not a size"));
        assert!("4XB".parse::<Bytes>().unwrap_err().contains("unknown size unit 'xb'"));
        assert!("99999999999999999999".parse::<Bytes>().is_err());
        assert!("17179869184G".parse::<Bytes>().unwrap_err().contains("overflows"));
        assert!("-4KiB".parse::<Bytes>().unwrap_err().contains("is negative"));
        assert!("0.1KiB".parse::<Bytes>().unwrap_err().contains("not a whole number of bytes"));
    }

    #[test]
    fn sizes_take_decimals_and_print_back_as_they_parse() {
        assert_eq!("1.5GiB".parse::<Bytes>().unwrap(), Bytes(3 * GIB / 2));
        assert_eq!("1.5GB".parse::<Bytes>().unwrap(), Bytes(3 * GIB / 2));
        assert_eq!(".5 KiB".parse::<Bytes>().unwrap(), Bytes(512));
        assert_eq!("2.TiB".parse::<Bytes>().unwrap(), Bytes(2 << 40));
        for b in [Bytes(1536), Bytes(GIB), Bytes(4 * KIB), Bytes(12), Bytes(3 * MIB / 2)] {
            assert_eq!(b.to_string().parse::<Bytes>().unwrap(), b, "{b}");
        }
    }

    #[test]
    fn size_options_say_what_they_expect() {
        assert_eq!(size_option("4KiB").unwrap(), Bytes(4096));
        assert_eq!(size_option("4096").unwrap(), Bytes(4096));
        assert!(size_option("0").unwrap_err().contains("size of 0"));
        assert!(size_option("0KiB").unwrap_err().contains("size of 0"));
        // MiB options: a bare number is MiB, any unit converts.
        assert_eq!(mib_option("64").unwrap(), 64);
        assert_eq!(mib_option("1.5GB").unwrap(), 1536);
        assert_eq!(mib_option("1536MiB").unwrap(), 1536);
        assert_eq!(mib_option("4096KiB").unwrap(), 4);
        assert!(mib_option("100KiB").unwrap_err().contains("expected a whole number of MiB"), "{}", mib_option("100KiB").unwrap_err());
        assert!(mib_option("0.5").unwrap_err().contains("512 KiB: expected a whole number of MiB"));
        assert_eq!(mib_option("0GiB").unwrap(), 0);
        assert!(mib_option("-1").unwrap_err().contains("is negative"));
        assert!(mib_option("lots").unwrap_err().contains("is not a size"));
    }

    #[test]
    fn plain_number_errors_say_what_the_option_expects() {
        let int = "-1".parse::<u64>().unwrap_err();
        assert_eq!(number_expected(&int, "-1").unwrap(), "expected a whole number of 0 or more, not a negative one");
        let int = "x".parse::<u64>().unwrap_err();
        assert_eq!(number_expected(&int, "x").unwrap(), "expected a whole number, e.g. 4");
        let big = "99999999999999999999".parse::<u64>().unwrap_err();
        assert_eq!(number_expected(&big, "99999999999999999999").unwrap(), "expected a smaller whole number");
        let float = "fast".parse::<f64>().unwrap_err();
        assert_eq!(number_expected(&float, "fast").unwrap(), "expected a number, e.g. 2.5");
        let range: Box<dyn std::error::Error> = "-1 is not in 0..=4294967295".into();
        assert_eq!(number_expected(range.as_ref(), "-1").unwrap(), "expected a whole number of 0 or more, not a negative one");
        // A parser that says what it expects is left to say it.
        let own: Box<dyn std::error::Error> = mib_option("-1").unwrap_err().into();
        assert!(number_expected(own.as_ref(), "-1").is_none());
    }
}
