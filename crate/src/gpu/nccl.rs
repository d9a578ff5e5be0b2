//! NCCL, loaded at run time: collective communication between GPUs (lab
//! 8's all-reduce of "gradients" beside compute). Where the library is
//! looked for, how it is loaded and its raw calls are in the thin raw
//! layer (`driver::nccl_*`, each call on a raw communicator an
//! `unsafe fn`); here are the safe types: [`Nccl`], the library loaded,
//! [`Communicators`], which own one communicator per GPU, and
//! [`NcclCtas`], how many CTAs (thread blocks, one SM each) their
//! collectives may take: NCCL's share of the GPU beside compute.
//!
//! A CTA setting is the communicators' own (ncclCommInitRankConfig's
//! `minCTAs`/`maxCTAs`), so one process can hold several in turn.
//! `NCCL_MIN_CTAS` and `NCCL_MAX_CTAS` in the environment override every
//! one of them ([`nccl_ctas_env_override`] says so in a line).
//!
//! NVLink multicast (NCCL's NVLS) stays off: [`Nccl::load`] sets the
//! variables of [`MULTICAST_OFF`] where they are unset, and a child
//! process this crate starts (PyTorch's reference) gets them too: a
//! program that uses multicast can put a host's GPUs, which others may
//! share, out of service.

use super::{driver, DeviceBuffer, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};

pub use driver::MULTICAST_OFF;

/// [`MULTICAST_OFF`] for a child process's environment: each variable as
/// this process has it if set, else its value there.
pub fn multicast_off_env() -> Vec<(String, String)> {
    MULTICAST_OFF.iter().map(|&(k, v)| (k.to_string(), std::env::var(k).unwrap_or_else(|_| v.to_string()))).collect()
}

/// NCCL, loaded.
pub struct Nccl {
    /// Where it was loaded from.
    pub path: String,
}

impl Nccl {
    /// Loads NCCL once per process (`driver::nccl_load` says where it looks).
    pub fn load() -> Result<Nccl> {
        Ok(Nccl { path: driver::nccl_load()?.to_string() })
    }

    /// "2.27.7".
    pub fn version(&self) -> Result<String> {
        let v = driver::nccl_version()?;
        // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9.
        Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }
}

/// How many CTAs (NCCL's channels, a thread block each) a communicator's
/// collectives may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NcclCtas {
    /// NCCL's own choice (ncclCommInitAll, no config).
    #[default]
    Default,
    /// At most `max` CTAs (1 to [`NcclCtas::LIMIT`]), and at least `min`
    /// (1 to `max`) where given, else NCCL's least (1).
    AtMost { max: u32, min: Option<u32> },
}

impl NcclCtas {
    /// NCCL's limit on both (`MAXCHANNELS`, 64 from 2.17 to 2.30).
    pub const LIMIT: u32 = 64;

    /// At most `max` CTAs.
    pub fn at_most(max: u32) -> NcclCtas {
        NcclCtas::AtMost { max, min: None }
    }

    /// The cap, `None` for NCCL's own choice.
    pub fn max(&self) -> Option<u32> {
        match *self {
            NcclCtas::Default => None,
            NcclCtas::AtMost { max, .. } => Some(max),
        }
    }

    /// An error naming the setting unless NCCL takes it (a max of 1 to
    /// [`Self::LIMIT`], a min of 1 to the max).
    pub fn check(&self) -> Result<()> {
        let NcclCtas::AtMost { max, min } = *self else { return Ok(()) };
        if !(1..=Self::LIMIT).contains(&max) {
            return Err(LabError::config(format!("NCCL's max CTAs {max}: give 1 to {} (NCCL's channel limit)", Self::LIMIT)));
        }
        if let Some(min) = min.filter(|m| !(1..=max).contains(m)) {
            return Err(LabError::config(format!("NCCL's min CTAs {min}: give 1 to the max, {max}")));
        }
        Ok(())
    }
}

/// "NCCL's choice", "at most 8 CTAs", "2 to 8 CTAs".
impl std::fmt::Display for NcclCtas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            NcclCtas::Default => write!(f, "NCCL's choice"),
            NcclCtas::AtMost { max, min: None } => write!(f, "at most {max} CTA{}", if max == 1 { "" } else { "s" }),
            NcclCtas::AtMost { max, min: Some(min) } => write!(f, "{min} to {max} CTAs"),
        }
    }
}

/// "default", a max ("8") or a min and a max ("2-8"), checked.
impl std::str::FromStr for NcclCtas {
    type Err = LabError;
    fn from_str(s: &str) -> Result<NcclCtas> {
        let s = s.trim();
        let number =
            |n: &str| n.trim().parse::<u32>().map_err(|_| LabError::config(format!("NCCL CTAs \"{s}\": give default, a max (8) or a min and a max (2-8)")));
        let ctas = match s.split_once('-') {
            _ if s.eq_ignore_ascii_case("default") => NcclCtas::Default,
            Some((min, max)) => NcclCtas::AtMost { max: number(max)?, min: Some(number(min)?) },
            None => NcclCtas::at_most(number(s)?),
        };
        ctas.check()?;
        Ok(ctas)
    }
}

/// A line saying that `NCCL_MAX_CTAS` or `NCCL_MIN_CTAS` is set in this
/// process's environment, where NCCL takes it: it then overrides every
/// communicator's own CTA setting (NCCL reads it once per process;
/// `~/.nccl.conf` and `/etc/nccl.conf` reach the environment once NCCL
/// has started). `None` where neither is.
pub fn nccl_ctas_env_override() -> Option<String> {
    ctas_override_in(|k| std::env::var(k).ok())
}

/// [`nccl_ctas_env_override`] with the environment read by `get`.
fn ctas_override_in(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    // NCCL reads them with strtoll (base 0) and ignores values of 0 or less.
    let taken = |k: &str| get(k).filter(|v| strtoll(v).is_some_and(|n| n > 0)).map(|v| format!("{k}={}", v.trim()));
    let set: Vec<String> = ["NCCL_MIN_CTAS", "NCCL_MAX_CTAS"].into_iter().filter_map(taken).collect();
    let (verb, it) = if set.len() > 1 { ("are", "they override") } else { ("is", "it overrides") };
    (!set.is_empty()).then(|| format!("{} {verb} set: {it} every NCCL communicator's own CTA setting in this process", set.join(" and ")))
}

/// The number C's `strtoll(v, NULL, 0)` reads at the start of `v`
/// (decimal, `0x` hexadecimal or `0` octal), `None` where it reads none.
fn strtoll(v: &str) -> Option<i64> {
    let v = v.trim_start();
    let (sign, v) = match v.as_bytes().first() {
        Some(b'-') => (-1, &v[1..]),
        Some(b'+') => (1, &v[1..]),
        _ => (1, v),
    };
    let (radix, digits) = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        (16, h)
    } else if v.len() > 1 && v.starts_with('0') {
        (8, &v[1..])
    } else {
        (10, v)
    };
    let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
    match i64::from_str_radix(&digits[..end], radix) {
        Ok(n) => Some(sign * n),
        // "0x" or "0" followed by no digit of its base: strtoll reads the 0.
        Err(_) if radix != 10 => Some(0),
        Err(_) => None,
    }
}

/// One NCCL communicator per GPU of a group (one process driving every
/// GPU), made with a CTA setting ([`NcclCtas`]).
pub struct Communicators {
    /// The library its calls go to, loaded.
    _loaded: Nccl,
    comms: Vec<driver::NcclComm>,
    ordinals: Vec<usize>,
    ctas: NcclCtas,
}

// SAFETY: NCCL lets a communicator be used from any thread, one thread at
// a time; Communicators is not Sync, so only its owner's thread calls it.
unsafe impl Send for Communicators {}

impl Communicators {
    /// A communicator for each of `gpus` (distinct GPUs), with NCCL's own
    /// choice of CTAs.
    pub fn new(nccl: Nccl, gpus: &[Gpu]) -> Result<Communicators> {
        Self::with_ctas(nccl, gpus, NcclCtas::Default)
    }

    /// A communicator for each of `gpus` (distinct GPUs) whose collectives
    /// use as many CTAs as `ctas` says: NCCL's own choice through
    /// ncclCommInitAll, a cap through ncclCommInitRankConfig (NCCL 2.17
    /// or later).
    pub fn with_ctas(nccl: Nccl, gpus: &[Gpu], ctas: NcclCtas) -> Result<Communicators> {
        ctas.check()?;
        let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
        if ordinals.is_empty() || (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) {
            return Err(LabError::config(format!("NCCL communicators need distinct GPUs, one each: got {ordinals:?}")));
        }
        let comms = match ctas {
            NcclCtas::Default => driver::nccl_comm_init_all(&ordinals.iter().map(|&o| o as i32).collect::<Vec<_>>())?,
            NcclCtas::AtMost { max, min } => {
                if driver::nccl_version()? < driver::NcclConfig::VERSION as i32 {
                    return Err(LabError::Unsupported(format!("NCCL {} cannot cap a communicator's CTAs ({ctas}): NCCL 2.17 and later can", nccl.version()?)));
                }
                let contexts: Vec<&cudarc::driver::CudaContext> = gpus.iter().map(|g| &*g.ctx).collect();
                // check() bounds both by LIMIT, so they fit an int.
                let config = driver::NcclConfig::ctas(min.map(|m| m as i32), Some(max as i32));
                driver::nccl_comm_init_config(&contexts, &config)?
            }
        };
        Ok(Communicators { _loaded: nccl, comms, ordinals, ctas })
    }

    /// The CTA setting they were made with.
    pub fn ctas(&self) -> NcclCtas {
        self.ctas
    }

    pub fn len(&self) -> usize {
        self.comms.len()
    }
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// The GPUs of the group, by rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }

    /// An in-place sum all-reduce of the first `count` f32 of `bufs[i]` on
    /// `streams[i]`, one per GPU in the group's order, as one NCCL group;
    /// returns once every stream has run it (the buffers are borrowed
    /// until then). A runner's all-reduce is issued with the others of its
    /// loop instead (`Runner::all_reduce`).
    pub fn all_reduce_sum(&self, bufs: &[&DeviceBuffer], count: usize, streams: &[&Stream]) -> Result<()> {
        if bufs.len() != self.len() || streams.len() != self.len() {
            return Err(LabError::config(format!("an all-reduce over {} GPUs takes one buffer and one stream each", self.len())));
        }
        for (i, b) in bufs.iter().enumerate() {
            if b.gpu().ordinal() != self.ordinals[i] {
                return Err(LabError::config(format!("rank {i} of the all-reduce is GPU {}: its buffer is on GPU {}", self.ordinals[i], b.gpu().ordinal())));
            }
            if count == 0 || count.checked_mul(4).is_none_or(|bytes| bytes > b.bytes()) {
                return Err(LabError::config(format!("an all-reduce of {count} f32 does not fit GPU {}'s buffer of {} bytes", self.ordinals[i], b.bytes())));
            }
        }
        let ranks: Vec<(DeviceSpan, &Stream)> = bufs.iter().map(|b| DeviceSpan { ptr: b.span().ptr, bytes: count * 4 }).zip(streams.iter().copied()).collect();
        // SAFETY: each span is the start of its buffer and fits it (checked
        // above); the streams are synchronized below, while the borrows last.
        let queued = unsafe { self.all_reduce_spans(&ranks) };
        let _keep = driver::KeepCurrent::save()?;
        for s in streams {
            s.gpu().bind()?;
            s.synchronize()?;
        }
        queued
    }

    /// Enqueues an in-place sum all-reduce of each rank's span (all of one
    /// length, a whole number of f32) on its stream, as one NCCL group:
    /// `ranks[i]` is rank i's, on its GPU.
    ///
    /// # Safety
    /// Each span lies in device memory of its rank's GPU that stays
    /// allocated until its stream has run the call.
    pub(crate) unsafe fn all_reduce_spans(&self, ranks: &[(DeviceSpan, &Stream)]) -> Result<()> {
        if ranks.len() != self.len() {
            return Err(LabError::config(format!("an all-reduce over {} GPUs takes one buffer and one stream each (got {})", self.len(), ranks.len())));
        }
        let bytes = ranks[0].0.bytes;
        for (i, (span, s)) in ranks.iter().enumerate() {
            let want = self.ordinals[i];
            if s.gpu().ordinal() != want {
                return Err(LabError::config(format!("rank {i} of the all-reduce is GPU {want}: its stream is on GPU {}", s.gpu().ordinal())));
            }
            if span.bytes != bytes || bytes == 0 || bytes % 4 != 0 {
                return Err(LabError::config(format!(
                    "an all-reduce's ranks each sum the same whole number of f32: rank {i} has {} bytes, rank 0 {bytes}",
                    span.bytes
                )));
            }
        }
        let _keep = driver::KeepCurrent::save()?;
        driver::nccl_group_start()?;
        let mut issued = Ok(());
        for (&comm, (span, s)) in self.comms.iter().zip(ranks) {
            // SAFETY: the communicator is this rank's, owned by `self` until
            // it drops; the stream belongs to the same GPU (checked above);
            // the span is the caller's promise (this function's # Safety).
            issued = unsafe { driver::nccl_all_reduce_sum_f32(comm, span.ptr, bytes / 4, s.raw()) };
            if issued.is_err() {
                break;
            }
        }
        // Closes the group opened above, also after a failed call.
        let ended = driver::nccl_group_end();
        issued.and(ended)
    }
}

impl Drop for Communicators {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: made by `with_ctas` and owned by `self`, destroyed once, here;
            // no call on it is being issued (`self` is being dropped).
            let _ = unsafe { driver::nccl_comm_destroy(c) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_nccl_the_error_names_what_to_install() {
        // Only when this machine has none (CI); where it has one, loading works.
        match Nccl::load() {
            Ok(n) => assert!(n.version().unwrap().starts_with("2."), "{}", n.path),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("NCCL (libnccl.so.2) could not be loaded") && msg.contains("pip install nvidia-nccl-cu13") && msg.contains("libnccl.so.2:"),
                    "{msg}"
                );
            }
        }
    }

    /// On a GPU machine with NCCL: capped communicators over every GPU (a
    /// group of one where there is one) sum each rank's buffer, and a
    /// rig's communicators are made again with another setting.
    #[test]
    fn capped_communicators_sum_and_a_rig_changes_its_setting() {
        use crate::gpu::{plan::PlanRig, HostBuffer, PinnedBuffer};
        let test = "capped_communicators_sum_and_a_rig_changes_its_setting";
        let Some(_gpu) = crate::testing::gpu_or_skip(test) else { return };
        if let Err(e) = Nccl::load() {
            crate::testing::skip_unless_required(test, &e.to_string());
            return;
        }
        let n = driver::device_count().unwrap();
        let gpus: Vec<Gpu> = (0..n).map(|i| Gpu::open(i).unwrap()).collect();
        let count = 1 << 18;
        let bufs: Vec<_> = gpus.iter().map(|g| g.alloc(count * 4).unwrap()).collect();
        let streams: Vec<_> = gpus.iter().map(|g| g.stream().unwrap()).collect();
        for ctas in [NcclCtas::at_most(2), NcclCtas::AtMost { max: 4, min: Some(2) }] {
            let comms = Communicators::with_ctas(Nccl::load().unwrap(), &gpus, ctas).unwrap();
            assert_eq!((comms.ctas(), comms.ordinals().len()), (ctas, n));
            for (i, (b, s)) in bufs.iter().zip(&streams).enumerate() {
                s.fill_u32(b, (i as f32 + 1.0).to_bits()).unwrap();
            }
            comms.all_reduce_sum(&bufs.iter().collect::<Vec<_>>(), count, &streams.iter().collect::<Vec<_>>()).unwrap();
            let want = (1..=n).sum::<usize>() as f32;
            for (b, s) in bufs.iter().zip(&streams) {
                let mut back = PinnedBuffer::new(b.gpu(), count * 4).unwrap();
                s.download(&mut back, b, count * 4).unwrap();
                assert!(back.words().iter().all(|w| [*w as u32, (*w >> 32) as u32].iter().all(|h| f32::from_bits(*h) == want)), "{ctas}");
            }
        }
        let mut rig = PlanRig::over(&gpus, 1 << 10, 1, 1).unwrap().with_nccl().unwrap();
        assert_eq!(rig.nccl_ctas(), Some(NcclCtas::Default));
        rig.set_nccl_ctas(NcclCtas::at_most(2)).unwrap();
        assert_eq!(rig.nccl_ctas(), Some(NcclCtas::at_most(2)));
        assert!(rig.set_nccl_ctas(NcclCtas::at_most(0)).is_err());
        assert_eq!(rig.nccl_ctas(), Some(NcclCtas::at_most(2)), "a refused setting changes nothing");
    }

    #[test]
    fn a_cta_setting_is_checked_read_and_written() {
        assert_eq!("default".parse::<NcclCtas>().unwrap(), NcclCtas::Default);
        assert_eq!(" 8 ".parse::<NcclCtas>().unwrap(), NcclCtas::at_most(8));
        assert_eq!("2-8".parse::<NcclCtas>().unwrap(), NcclCtas::AtMost { max: 8, min: Some(2) });
        assert_eq!((NcclCtas::Default.max(), NcclCtas::at_most(4).max()), (None, Some(4)));
        for (s, words) in [
            ("0", "max CTAs 0: give 1 to 64"),
            ("65", "max CTAs 65: give 1 to 64"),
            ("9-8", "min CTAs 9: give 1 to the max, 8"),
            ("0-8", "min CTAs 0"),
            ("many", "give default"),
        ] {
            let e = s.parse::<NcclCtas>().unwrap_err().to_string();
            assert!(e.contains(words) && !e.contains('\n'), "{s}: {e}");
        }
        assert!(NcclCtas::at_most(64).check().is_ok() && NcclCtas::at_most(0).check().is_err());
        assert_eq!(
            [NcclCtas::Default, NcclCtas::at_most(1), NcclCtas::at_most(8), NcclCtas::AtMost { max: 8, min: Some(2) }].map(|c| c.to_string()),
            ["NCCL's choice", "at most 1 CTA", "at most 8 CTAs", "2 to 8 CTAs"]
        );
        // Kept in the results: the JSON reads back.
        for c in [NcclCtas::Default, NcclCtas::AtMost { max: 8, min: Some(2) }] {
            assert_eq!(serde_json::from_str::<NcclCtas>(&serde_json::to_string(&c).unwrap()).unwrap(), c);
        }
    }

    #[test]
    fn the_environments_cta_variables_are_named_where_nccl_takes_them() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string());
        assert_eq!(ctas_override_in(env(&[])), None);
        assert_eq!(ctas_override_in(env(&[("NCCL_MAX_CTAS", "0"), ("NCCL_MIN_CTAS", "")])), None, "0 and empty are ignored by NCCL");
        let line = ctas_override_in(env(&[("NCCL_MAX_CTAS", "8")])).unwrap();
        assert_eq!(line, "NCCL_MAX_CTAS=8 is set: it overrides every NCCL communicator's own CTA setting in this process");
        let line = ctas_override_in(env(&[("NCCL_MAX_CTAS", "0x10"), ("NCCL_MIN_CTAS", "2")])).unwrap();
        assert!(line.starts_with("NCCL_MIN_CTAS=2 and NCCL_MAX_CTAS=0x10 are set: they override"), "{line}");
        assert_eq!([" 12abc", "-3", "0x", "010", "x"].map(strtoll), [Some(12), Some(-3), Some(0), Some(8), None]);
    }
}
