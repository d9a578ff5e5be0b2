//! NCCL, loaded at run time: collective communication between GPUs (lab
//! 8's all-reduce of "gradients" beside compute). The library is found
//! wherever it is — `$OVERLAP_LAB_NCCL`, the loader's search path, or the
//! PyPI wheel `nvidia-nccl-cu13` (what PyTorch installs) — and its absence
//! is a clear error naming every place searched, never a panic. (cudarc's
//! own NCCL bindings look only for `libnccl.so` and `libnccl.so.<CUDA
//! major>`, and the wheels ship `libnccl.so.2`.)
//!
//! [`raw`] holds the calls on raw handles, each an `unsafe fn`; the safe
//! [`Communicators`] own one communicator per GPU.
//!
//! NVLink multicast (NCCL's NVLS) stays off: [`Nccl::load`] sets the
//! variables of [`MULTICAST_OFF`] where they are unset, and a child
//! process this crate starts (PyTorch's reference) gets them too: a
//! program that uses multicast can put a host's GPUs, which others may
//! share, out of service.

use super::{DeviceBuffer, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The raw NCCL calls (the C API of nccl.h), resolved once from the loaded
/// library.
pub mod raw {
    use std::ffi::{c_char, c_int, c_void};

    pub type Comm = *mut c_void;
    pub type NcclResult = c_int;
    /// ncclFloat32 in ncclDataType_t.
    pub const FLOAT32: c_int = 7;
    /// ncclSum in ncclRedOp_t.
    pub const SUM: c_int = 0;

    /// The entry points lab 8 uses.
    pub struct Api {
        pub(super) _lib: libloading::Library,
        pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
        pub comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult,
        pub comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
        pub all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> NcclResult,
        pub group_start: unsafe extern "C" fn() -> NcclResult,
        pub group_end: unsafe extern "C" fn() -> NcclResult,
        pub error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    }

    impl Api {
        /// # Safety
        /// `lib` is a build of NCCL 2.x (the symbols have nccl.h's types).
        pub(super) unsafe fn resolve(lib: libloading::Library) -> Result<Api, String> {
            macro_rules! sym {
                ($name:literal) => {
                    // SAFETY: the caller's promise that these are nccl.h's functions.
                    *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
                };
            }
            Ok(Api {
                get_version: sym!("ncclGetVersion"),
                comm_init_all: sym!("ncclCommInitAll"),
                comm_destroy: sym!("ncclCommDestroy"),
                all_reduce: sym!("ncclAllReduce"),
                group_start: sym!("ncclGroupStart"),
                group_end: sym!("ncclGroupEnd"),
                error_string: sym!("ncclGetErrorString"),
                _lib: lib,
            })
        }
    }
}

/// The variables that keep NVLink multicast off in NCCL, PyTorch and
/// NVSHMEM, and their values.
pub const MULTICAST_OFF: [(&str, &str); 3] = [("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")];

/// [`MULTICAST_OFF`] for a child process's environment: each variable as
/// this process has it if set, else its value there.
pub fn multicast_off_env() -> Vec<(String, String)> {
    MULTICAST_OFF.iter().map(|&(k, v)| (k.to_string(), std::env::var(k).unwrap_or_else(|_| v.to_string()))).collect()
}

/// NCCL, loaded.
pub struct Nccl {
    api: &'static raw::Api,
    /// Where it was loaded from.
    pub path: String,
}

static LOADED: OnceLock<std::result::Result<(raw::Api, String), String>> = OnceLock::new();

impl Nccl {
    /// Loads NCCL once per process (see the module doc for where it looks).
    pub fn load() -> Result<Nccl> {
        let loaded = LOADED.get_or_init(|| {
            for (k, v) in MULTICAST_OFF {
                if std::env::var_os(k).is_none() {
                    // Before NCCL reads its environment (at its first call).
                    std::env::set_var(k, v);
                }
            }
            let places = candidates(std::env::var_os("OVERLAP_LAB_NCCL"), std::env::var_os("LD_LIBRARY_PATH"), std::env::var_os("PATH"));
            let mut tried = Vec::new();
            for place in &places {
                // SAFETY: loading a shared library runs its initializers; NCCL's are benign.
                match unsafe { libloading::Library::new(place) } {
                    // SAFETY: a library named libnccl is NCCL.
                    Ok(lib) => match unsafe { raw::Api::resolve(lib) } {
                        Ok(api) => return Ok((api, place.display().to_string())),
                        // Another file of that name (an old or partial NCCL): try the next.
                        Err(e) => tried.push(format!("  {}: {}", place.display(), first_line(&e))),
                    },
                    Err(e) => tried.push(format!("  {}: {}", place.display(), first_line(&e.to_string()))),
                }
            }
            Err(format!(
                "searched:\n{}\nInstall it (`pip install nvidia-nccl-cu13`, as PyTorch does, or the distribution's libnccl2), or point OVERLAP_LAB_NCCL at libnccl.so.2",
                tried.join("\n")
            ))
        });
        match loaded {
            Ok((api, path)) => Ok(Nccl { api, path: path.clone() }),
            Err(why) => Err(LabError::MissingLibrary { library: "NCCL (libnccl.so.2)", why: why.clone() }),
        }
    }

    /// "2.27.7".
    pub fn version(&self) -> Result<String> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("ncclGetVersion", unsafe { (self.api.get_version)(&mut v) })?;
        // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9.
        Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }

    fn check(&self, call: &'static str, r: raw::NcclResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any result code.
        let text = unsafe { std::ffi::CStr::from_ptr((self.api.error_string)(r)) }.to_string_lossy().into_owned();
        Err(LabError::Driver { call, message: format!("NCCL error {r}: {text}") })
    }
}

/// The first line of a loader's message (dlopen's can run long).
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// Where [`Nccl::load`] looks, in order: `$OVERLAP_LAB_NCCL`; the names
/// the loader resolves itself (its cache, `LD_LIBRARY_PATH`); then the
/// PyPI wheel's `nvidia/nccl/lib/libnccl.so.2` beside any NVIDIA wheel
/// library directory on `LD_LIBRARY_PATH` (`nvidia/cu13/lib`) and in the
/// site-packages of each `python3` on `PATH` and of the system Pythons.
fn candidates(env: Option<std::ffi::OsString>, ld_path: Option<std::ffi::OsString>, path: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = env.into_iter().filter(|e| !e.is_empty()).map(PathBuf::from).collect();
    v.push("libnccl.so.2".into());
    v.push("libnccl.so".into());
    let wheel = |site: PathBuf| site.join("nvidia/nccl/lib/libnccl.so.2");
    for dir in ld_path.iter().flat_map(std::env::split_paths) {
        // .../site-packages/nvidia/<pkg>/lib -> .../site-packages
        if let Some(site) =
            dir.ancestors().nth(3).filter(|_| dir.ends_with("lib") && dir.parent().and_then(|p| p.parent()).is_some_and(|n| n.ends_with("nvidia")))
        {
            v.push(wheel(site.to_path_buf()));
        }
    }
    let mut prefixes: Vec<PathBuf> =
        path.iter().flat_map(std::env::split_paths).filter(|d| d.join("python3").is_file()).filter_map(|d| d.parent().map(PathBuf::from)).collect();
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { continue };
        let mut pythons: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3"))).collect();
        pythons.sort();
        for py in pythons {
            v.extend(["site-packages", "dist-packages"].map(|s| wheel(py.join(s))));
        }
    }
    let mut unique = Vec::new();
    for p in v {
        if !unique.contains(&p) {
            unique.push(p);
        }
    }
    unique
}

/// One NCCL communicator per GPU of a group (ncclCommInitAll: one process
/// driving every GPU).
pub struct Communicators {
    nccl: Nccl,
    comms: Vec<raw::Comm>,
    ordinals: Vec<usize>,
}

// SAFETY: an NCCL communicator may move to another thread; it is used by
// one thread at a time (Communicators is not Sync).
unsafe impl Send for Communicators {}

impl Communicators {
    /// A communicator for each of `gpus` (distinct GPUs).
    pub fn new(nccl: Nccl, gpus: &[Gpu]) -> Result<Communicators> {
        let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
        if ordinals.is_empty() || (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i])) {
            return Err(LabError::config(format!("NCCL communicators need distinct GPUs, one each: got {ordinals:?}")));
        }
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms: Vec<raw::Comm> = vec![std::ptr::null_mut(); devs.len()];
        // NCCL sets each device current through the CUDA runtime.
        let _keep = super::driver::KeepCurrent::save()?;
        // SAFETY: `comms` has room for one handle per device listed.
        nccl.check("ncclCommInitAll", unsafe { (nccl.api.comm_init_all)(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) })?;
        Ok(Communicators { nccl, comms, ordinals })
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
        let _keep = super::driver::KeepCurrent::save()?;
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
        let api = self.nccl.api;
        let _keep = super::driver::KeepCurrent::save()?;
        // SAFETY: group calls take no arguments.
        self.nccl.check("ncclGroupStart", unsafe { (api.group_start)() })?;
        let mut issued = Ok(());
        for (comm, (span, s)) in self.comms.iter().zip(ranks) {
            let p = span.ptr as *mut std::ffi::c_void;
            // SAFETY: the caller's promise on the span; the stream and
            // communicator belong to the same GPU (checked).
            issued = self.nccl.check("ncclAllReduce", unsafe { (api.all_reduce)(p, p, bytes / 4, raw::FLOAT32, raw::SUM, *comm, s.raw() as *mut _) });
            if issued.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above, also after a failed call.
        let ended = self.nccl.check("ncclGroupEnd", unsafe { (api.group_end)() });
        issued.and(ended)
    }
}

impl Drop for Communicators {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: each communicator is destroyed once, here.
            let _ = unsafe { (self.nccl.api.comm_destroy)(c) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_looked_for_where_pytorch_and_the_loader_put_it() {
        let dir = crate::testing::temp_dir("nccl-search");
        let site = dir.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(dir.join("venv/bin")).unwrap();
        std::fs::write(dir.join("venv/bin/python3"), "").unwrap();
        std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
        let ld = std::env::join_paths([site.join("nvidia/cu13/lib")]).unwrap();
        let path = std::env::join_paths([dir.join("venv/bin")]).unwrap();
        let c = candidates(Some("/opt/my/libnccl.so.2".into()), Some(ld), Some(path));
        assert_eq!(c[0], PathBuf::from("/opt/my/libnccl.so.2"), "the variable comes first");
        assert_eq!(c[1..3], [PathBuf::from("libnccl.so.2"), PathBuf::from("libnccl.so")]);
        let wheel = site.join("nvidia/nccl/lib/libnccl.so.2");
        assert_eq!(c.iter().filter(|p| **p == wheel).count(), 1, "beside the NVRTC wheel and under the venv's python3, once: {c:?}");
        assert_eq!(candidates(Some("".into()), None, None)[0], std::path::Path::new("libnccl.so.2"), "an empty variable is no place");
    }

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
}
