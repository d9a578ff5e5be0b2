//! Byte sizes that print and parse the way people write them (`4KiB`,
//! `1.5GiB`), the command line's size options, and what its number options
//! expect.
//!
//! How a size is read (the command line's `--help` says the same):
//!
//! - `KiB`, `MiB`, `GiB`, `TiB` are powers of 1024, and so are the bare
//!   letters `K`, `M`, `G`, `T`, as in `dd`, `ulimit` and `ls -h`, the
//!   tools a learner already knows.
//! - `kB` (or `KB`), `MB`, `GB`, `TB` are powers of 1000, as `dd` reads
//!   them and as disks and the labs' GB/s count: `1.5GB` is 1.5 × 10^9
//!   bytes, about 1430.5 MiB, not 1.5 GiB.
//! - `B` is a byte; a number with no unit counts the option's own unit
//!   (bytes, or MiB for the options the labs keep in MiB).
//! - Units are read in any case (`mib` is `MiB`), and a space may stand
//!   between the number and the unit (`"12 MiB"`).
//! - A size that is not a whole number of the option's unit is rounded to
//!   the nearest whole one when that moves it by 0.1% or less (`0.7G` is
//!   751619277 bytes, or 717 MiB for a MiB option); otherwise it is an
//!   error that names the two whole sizes around it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

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

/// A byte count. Displays with binary units, parses `4096`, `4K`, `4KiB`,
/// `64MiB`, `1.5G` and `2GB` (2 × 10^9 bytes): see the module doc.
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
    /// `4096`, `4K`, `4KiB`, `1.5 GiB`, `2GB`: a bare number is bytes.
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s, 1).map(Bytes)
    }
}

/// The units a size may carry, as `dd` reads them: the bare letters and
/// the `iB` names are powers of 1024, the `B` names of more than one
/// letter powers of 1000. Matched in any case.
const SIZE_UNITS: &[(&[&str], u64)] = &[
    (&["b"], 1),
    (&["k", "kib"], KIB),
    (&["kb"], 1_000),
    (&["m", "mib"], MIB),
    (&["mb"], 1_000_000),
    (&["g", "gib"], GIB),
    (&["gb"], 1_000_000_000),
    (&["t", "tib"], TIB),
    (&["tb"], 1_000_000_000_000),
];

/// The bytes a unit word stands for (`"MiB"`, `"gb"`, `"K"`), if it is one.
fn unit_bytes(word: &str) -> Option<u64> {
    let word = word.to_ascii_lowercase();
    SIZE_UNITS.iter().find(|(names, _)| names.contains(&word.as_str())).map(|(_, m)| *m)
}

/// True if `word` is a unit of sizes on its own (`MiB`, `GB`, `k`): the
/// command line joins such a word to the size before it (`--gpu-budget
/// 12 MiB`, two words, reads as `12 MiB`).
pub fn is_size_unit(word: &str) -> bool {
    unit_bytes(word).is_some()
}

/// A size as people write it: a whole or decimal number, then an
/// optional unit (see the module's doc), read as a whole number of
/// `unit` bytes (1: bytes; [`MIB`]: MiB), which a bare number also
/// counts. The one parser of sizes: [`Bytes`]'s `FromStr` and the
/// command line's size options ([`size_option`], [`mib_option`]) all read
/// sizes through it.
fn parse_size(s: &str, unit: u64) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("'{s}' is negative: expected a size of 0 or more, e.g. 64MiB"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit_word) = t.split_at(split);
    let (whole, fraction) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(format!("'{s}' is not a size (expected a number and a unit, e.g. 4096, 4KiB, 1.5GiB)"));
    }
    let unit_word = unit_word.trim();
    let mult = match unit_word {
        "" => unit,
        u => unit_bytes(u).ok_or_else(|| format!("unknown size unit '{}' in '{s}' (use B, KiB, MiB, GiB, TiB or kB, MB, GB, TB)", u.to_ascii_lowercase()))?,
    };
    // Exact arithmetic: the size is `scaled * mult / scale` bytes, so
    // `n / d` of `unit`; 1.5GiB is 1610612736 bytes exactly.
    let too_large = || format!("'{s}' overflows 64 bits");
    let digits = |d: &str| if d.is_empty() { Ok(0) } else { d.parse::<u128>().map_err(|_| too_large()) };
    let scale = 10u128.checked_pow(fraction.len() as u32).ok_or_else(too_large)?;
    let (whole, fraction) = (digits(whole)?, digits(fraction)?);
    let scaled = whole.checked_mul(scale).and_then(|w| w.checked_add(fraction)).ok_or_else(too_large)?;
    let n = scaled.checked_mul(mult as u128).ok_or_else(too_large)?;
    let d = scale.checked_mul(unit as u128).ok_or_else(too_large)?;
    let (below, rest) = (n / d, n % d);
    let nearest = if rest == 0 || rest < d - rest { below } else { below + 1 };
    // A fraction of a byte (or of a MiB) is rounded away when that moves
    // the size by 0.1% or less (0.7G is 751619276.8 bytes: 751619277);
    // more than that, the learner meant another size: say which.
    let off = rest.min(d - rest);
    if rest != 0 && off > n / 1000 {
        let (name, suffix) = if unit == 1 { ("bytes", "") } else { ("MiB", "MiB") };
        let exact = if unit == 1 || n % scale != 0 {
            format!("{} {name}", n as f64 / d as f64)
        } else {
            Bytes(u64::try_from(n / scale).map_err(|_| too_large())?).to_string()
        };
        let why = if unit == 1 { ", not a whole number of bytes" } else { ": expected a whole number of MiB" };
        return Err(format!("'{s}' is {exact}{why}; the nearest are {below}{suffix} and {}{suffix}", below + 1));
    }
    u64::try_from(nearest).map_err(|_| too_large())
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
/// given (`1.5GB`, 1430.5 MiB, is rounded to 1431). Recordings keep the
/// number of MiB, as before. 0 parses (lab 7's `--ceiling-max-mib 0`: no
/// sweep); each lab's settings say which range an option takes.
pub fn mib_option(s: &str) -> Result<usize, String> {
    usize::try_from(parse_size(s, MIB)?).map_err(|_| format!("'{s}' is too large"))
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

/// The item of `items` whose size (`size_of`) is nearest `bytes` by
/// ratio (3 MiB is nearer 4 MiB than 1 MiB): how a measured size is
/// looked up among the sizes a recording measured.
pub fn nearest_by_ratio<T>(items: impl IntoIterator<Item = T>, size_of: impl Fn(&T) -> u64, bytes: u64) -> Option<T> {
    let off = |b: u64| ((b.max(1) as f64).ln() - (bytes.max(1) as f64).ln()).abs();
    items.into_iter().min_by(|a, b| off(size_of(a)).total_cmp(&off(size_of(b))))
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
        assert_eq!("0.1KiB".parse::<Bytes>().unwrap_err(), "'0.1KiB' is 102.4 bytes, not a whole number of bytes; the nearest are 102 and 103");
    }

    #[test]
    fn sizes_take_decimals_and_print_back_as_they_parse() {
        assert_eq!("1.5GiB".parse::<Bytes>().unwrap(), Bytes(3 * GIB / 2));
        assert_eq!("1.5GB".parse::<Bytes>().unwrap(), Bytes(1_500_000_000));
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
        assert_eq!(mib_option("1.5GiB").unwrap(), 1536);
        assert_eq!(mib_option("1536MiB").unwrap(), 1536);
        assert_eq!(mib_option("4096KiB").unwrap(), 4);
        assert_eq!(mib_option("100KiB").unwrap_err(), "'100KiB' is 100 KiB: expected a whole number of MiB; the nearest are 0MiB and 1MiB");
        assert_eq!(mib_option("0.5").unwrap_err(), "'0.5' is 512 KiB: expected a whole number of MiB; the nearest are 0MiB and 1MiB");
        assert_eq!(mib_option("2.3").unwrap_err(), "'2.3' is 2.3 MiB: expected a whole number of MiB; the nearest are 2MiB and 3MiB");
        assert_eq!(mib_option("0GiB").unwrap(), 0);
        assert!(mib_option("-1").unwrap_err().contains("is negative"));
        assert!(mib_option("lots").unwrap_err().contains("is not a size"));
    }

    #[test]
    fn decimal_units_count_thousands_and_binary_ones_1024s() {
        // kB, KB, MB, GB, TB: powers of 1000, as dd reads them.
        for (text, bytes) in [("1kB", 1_000), ("1KB", 1_000), ("2MB", 2_000_000), ("1.5GB", 1_500_000_000), ("1TB", 1_000_000_000_000u64)] {
            assert_eq!(text.parse::<Bytes>(), Ok(Bytes(bytes)), "{text}");
        }
        // KiB ... TiB and the bare letters K, M, G, T: powers of 1024, in any case.
        for (text, bytes) in
            [("1K", KIB), ("1k", KIB), ("1KiB", KIB), ("1kib", KIB), ("3M", 3 * MIB), ("3MiB", 3 * MIB), ("2G", 2 * GIB), ("1T", TIB), ("1TiB", TIB), ("7B", 7)]
        {
            assert_eq!(text.parse::<Bytes>(), Ok(Bytes(bytes)), "{text}");
        }
        // GB is not GiB: the old reading, 1.5 GiB, is 7% more.
        assert_ne!("1.5GB".parse::<Bytes>(), "1.5GiB".parse::<Bytes>());
        assert!(is_size_unit("MiB") && is_size_unit("gb") && is_size_unit("K") && is_size_unit("B"));
        assert!(!is_size_unit("12") && !is_size_unit("MiBs") && !is_size_unit("") && !is_size_unit("--max"));
    }

    #[test]
    fn a_space_may_stand_between_the_number_and_its_unit() {
        assert_eq!("12 MiB".parse::<Bytes>(), Ok(Bytes(12 * MIB)));
        assert_eq!(" 12\tMiB ".parse::<Bytes>(), Ok(Bytes(12 * MIB)));
        assert_eq!(size_option("4 KiB"), Ok(Bytes(4096)));
        assert_eq!(mib_option("1 GiB"), Ok(1024));
        assert_eq!(mib_option("2 GB"), Ok(1907), "2 GB is 1907.3 MiB");
    }

    #[test]
    fn a_fraction_is_rounded_only_when_that_changes_the_size_by_a_hair() {
        // 0.7G is 751619276.8 bytes: 0.2 bytes off is nothing.
        assert_eq!(size_option("0.7G"), Ok(Bytes(751_619_277)));
        assert_eq!("0.7G".parse::<Bytes>(), Ok(Bytes(751_619_277)));
        // In MiB, 0.7G is 716.8: 0.2 MiB, 0.03%, off.
        assert_eq!(mib_option("0.7G"), Ok(717));
        assert_eq!(mib_option("0.7GiB"), Ok(717));
        // 1.5GB is 1430.51 MiB; 1GB 953.67 MiB.
        assert_eq!(mib_option("1.5GB"), Ok(1431));
        assert_eq!(mib_option("1GB"), Ok(954));
        assert_eq!(mib_option("1000kB").unwrap_err(), "'1000kB' is 976.6 KiB: expected a whole number of MiB; the nearest are 0MiB and 1MiB");
        // Halfway rounds up; a fraction that matters is an error naming both neighbours.
        assert_eq!(size_option("2.5").unwrap_err(), "'2.5' is 2.5 bytes, not a whole number of bytes; the nearest are 2 and 3");
        assert_eq!(size_option("100.5").unwrap_err(), "'100.5' is 100.5 bytes, not a whole number of bytes; the nearest are 100 and 101");
        assert_eq!(size_option("1000.5"), Ok(Bytes(1001)), "0.05% off");
        assert_eq!(size_option("10000.5"), Ok(Bytes(10001)), "0.005% off");
        assert_eq!(size_option("10000.4"), Ok(Bytes(10000)));
        assert!(mib_option("0.3").unwrap_err().contains("the nearest are 0MiB and 1MiB"), "{:?}", mib_option("0.3"));
        // A size too small for one byte stays an error, never 0 by rounding.
        assert!(size_option("0.0001K").unwrap_err().contains("not a whole number of bytes"));
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
