//! NCCL's raw calls (the C API of nccl.h) and the loading of the library
//! they come from, in the same thin layer as the driver's and cuBLAS's
//! (`nccl_*`). The library is found at run time wherever it is —
//! `$OVERLAP_LAB_NCCL`, the loader's search path, or the PyPI wheel
//! `nvidia-nccl-cu13` (what PyTorch installs) — and its absence is an
//! error naming every place searched, never a panic. (cudarc's own NCCL
//! bindings look only for `libnccl.so` and `libnccl.so.<CUDA major>`, and
//! the wheels ship `libnccl.so.2`.) The safe types that own communicators
//! are in `crate::gpu::nccl`.
//!
//! Loading sets the variables of [`MULTICAST_OFF`] where they are unset,
//! before NCCL first reads its environment: NVLink multicast (NCCL's NVLS)
//! stays off.
//!
//! A communicator's settings (`ncclConfig_t`) go in through
//! [`nccl_comm_init_config`] as [`NcclConfig`], the struct's first 32
//! bytes. That is sound because of how NCCL reads it (NVIDIA/nccl,
//! `src/init.cc`, `parseCommConfig`, the same from 2.17.1 to 2.30.7): it
//! copies `min(config->size, sizeof(ncclConfig_t))` bytes over a
//! `NCCL_CONFIG_INITIALIZER` default, refuses a `magic` other than
//! `0xcafebeef`, and sets back to their defaults the fields newer than
//! `config->version` (below 2.17: `cgaClusterSize`, `minCTAs`,
//! `maxCTAs`). The prefix's layout is `src/nccl.h.in`'s (`size_t size;
//! unsigned magic, version; int blocking, cgaClusterSize, minCTAs,
//! maxCTAs;` then the later fields); an unset field is `INT_MIN`
//! (`NCCL_CONFIG_UNDEF_INT`). NCCL refuses a min or max of 0 or less, and
//! a min above the max, whenever the min is set (an unset max counts as
//! `INT_MIN` there, so a min needs a max); it caps both at `MAXCHANNELS`
//! (64). `NCCL_MIN_CTAS` and `NCCL_MAX_CTAS`, where set above 0, override
//! the config (`envConfigOverride`, read once per process).

use super::{CUdeviceptr, CUstream, KeepCurrent};
use crate::error::{LabError, Result};
use cudarc::driver::CudaContext;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// An NCCL communicator (`ncclComm_t`): one rank of a group, on one GPU.
pub type NcclComm = *mut c_void;
type NcclResult = c_int;
/// ncclFloat32 in ncclDataType_t.
const FLOAT32: c_int = 7;
/// ncclSum in ncclRedOp_t.
const SUM: c_int = 0;

/// `ncclUniqueId`: the handle every rank of a new group starts from
/// (`NCCL_UNIQUE_ID_BYTES` = 128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId(pub [c_char; 128]);

/// The first fields of `ncclConfig_t` (NCCL 2.17's, which added
/// `cgaClusterSize`, `minCTAs` and `maxCTAs`): see the module doc for why
/// NCCL reads only these 32 bytes of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclConfig {
    /// `size_of::<NcclConfig>()`: how many bytes NCCL copies.
    pub size: usize,
    /// [`NcclConfig::MAGIC`].
    pub magic: u32,
    /// The NCCL version whose fields are set: [`NcclConfig::VERSION`].
    pub version: u32,
    /// 1: `ncclCommInitRankConfig` returns once the communicator is made.
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
}

impl NcclConfig {
    /// `NCCL_API_MAGIC`.
    pub const MAGIC: u32 = 0xcafe_beef;
    /// NCCL_VERSION(2, 17, 0): the first with the CTA fields.
    pub const VERSION: u32 = 21700;
    /// `NCCL_CONFIG_UNDEF_INT`: a field left to NCCL.
    pub const UNSET: c_int = c_int::MIN;

    /// A blocking communicator with at least `min` and at most `max` CTAs
    /// per collective (`None`: NCCL's own), every other field NCCL's.
    /// NCCL checks the values (see the module doc).
    pub fn ctas(min: Option<c_int>, max: Option<c_int>) -> NcclConfig {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: Self::MAGIC,
            version: Self::VERSION,
            blocking: 1,
            cga_cluster_size: Self::UNSET,
            min_ctas: min.unwrap_or(Self::UNSET),
            max_ctas: max.unwrap_or(Self::UNSET),
        }
    }
}

/// The variables that keep NVLink multicast off in NCCL, PyTorch and
/// NVSHMEM, and their values.
pub const MULTICAST_OFF: [(&str, &str); 3] = [("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")];

/// The entry points the crate uses, resolved once from the loaded library.
struct Api {
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    comm_init_all: unsafe extern "C" fn(*mut NcclComm, c_int, *const c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult,
    /// Since NCCL 2.14: an older NCCL still serves [`nccl_comm_init_all`].
    comm_init_rank_config: Option<unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> NcclResult>,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

impl Api {
    /// # Safety
    /// `lib` is a build of NCCL 2.x (its symbols have nccl.h's types).
    unsafe fn resolve(lib: libloading::Library) -> std::result::Result<Api, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the caller's promise that `lib` is NCCL 2.x, whose
                // symbol of this name has the type of the field it fills.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
            };
        }
        Ok(Api {
            get_version: sym!("ncclGetVersion"),
            comm_init_all: sym!("ncclCommInitAll"),
            get_unique_id: sym!("ncclGetUniqueId"),
            // SAFETY: as for `sym!`: NCCL's symbol of this name, where it
            // has one, has the field's type.
            comm_init_rank_config: unsafe { lib.get(b"ncclCommInitRankConfig\0") }.ok().map(|f| *f),
            comm_destroy: sym!("ncclCommDestroy"),
            all_reduce: sym!("ncclAllReduce"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            error_string: sym!("ncclGetErrorString"),
            _lib: lib,
        })
    }
}

/// The library once loaded (and where from), or why it could not be.
static LOADED: OnceLock<std::result::Result<(Api, String), String>> = OnceLock::new();

/// The library once loaded, and where from (see the module doc for where
/// it looks); loads it on the first call.
fn loaded() -> Result<&'static (Api, String)> {
    let found = LOADED.get_or_init(|| {
        for (k, v) in MULTICAST_OFF {
            if std::env::var_os(k).is_none() {
                // Before NCCL reads its environment (at its first call).
                std::env::set_var(k, v);
            }
        }
        let places = nccl_candidates(std::env::var_os("OVERLAP_LAB_NCCL"), std::env::var_os("LD_LIBRARY_PATH"), std::env::var_os("PATH"));
        let mut tried = Vec::new();
        for place in &places {
            // SAFETY: loading a shared library runs its initializers; a
            // library named libnccl is NCCL, whose initializers only set up
            // its own state.
            match unsafe { libloading::Library::new(place) } {
                // SAFETY: a library named libnccl is NCCL; a file of that name
                // that lacks its symbols fails to resolve and is skipped.
                Ok(lib) => match unsafe { Api::resolve(lib) } {
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
    found.as_ref().map_err(|why| LabError::MissingLibrary { library: "NCCL (libnccl.so.2)", why: why.clone() })
}

/// Loads NCCL once per process (see the module doc for where it looks) and
/// says where it was found.
pub fn nccl_load() -> Result<&'static str> {
    Ok(&loaded()?.1)
}

/// The loaded library's entry points (loading it first if need be).
fn api() -> Result<&'static Api> {
    Ok(&loaded()?.0)
}

fn check(api: &Api, call: &'static str, r: NcclResult) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string
    // for any result code.
    let text = unsafe { CStr::from_ptr((api.error_string)(r)) }.to_string_lossy().into_owned();
    Err(LabError::Driver { call, message: format!("NCCL error {r}: {text}") })
}

/// ncclGetVersion: e.g. 22707 for 2.27.7.
pub fn nccl_version() -> Result<i32> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: writes one int into `v`, which outlives the call.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// ncclCommInitAll: one communicator per device of `devices` (distinct
/// ordinals), in their order; the caller destroys each
/// ([`nccl_comm_destroy`]). The calling thread's current context is kept
/// (NCCL sets each device current through the CUDA runtime).
pub fn nccl_comm_init_all(devices: &[i32]) -> Result<Vec<NcclComm>> {
    let api = api()?;
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); devices.len()];
    let _keep = KeepCurrent::save()?;
    let n = c_int::try_from(devices.len()).map_err(|_| LabError::config("too many GPUs for one NCCL group"))?;
    // SAFETY: `comms` has room for one handle per device listed, and both
    // arrays outlive the call.
    check(api, "ncclCommInitAll", unsafe { (api.comm_init_all)(comms.as_mut_ptr(), n, devices.as_ptr()) })?;
    Ok(comms)
}

/// ncclCommInitRankConfig, rank by rank in one group from this thread (what
/// ncclCommInitAll does inside, with a config): one communicator per
/// context of `contexts` (primary contexts of distinct GPUs), in their
/// order, each made with `config`; the caller destroys each
/// ([`nccl_comm_destroy`]). NCCL takes a rank's GPU from `cudaGetDevice`,
/// which follows the context current on the thread, so each rank's is made
/// current before its call; the calling thread's current context is kept.
/// A failure mid-group is returned once the group has ended (NCCL then
/// frees what the group had begun, as in ncclCommInitAll).
pub fn nccl_comm_init_config(contexts: &[&CudaContext], config: &NcclConfig) -> Result<Vec<NcclComm>> {
    let api = api()?;
    let Some(init_rank) = api.comm_init_rank_config else {
        return Err(LabError::Unsupported(format!("NCCL {} has no ncclCommInitRankConfig (NCCL 2.14 and later have)", nccl_version()?)));
    };
    let n = c_int::try_from(contexts.len()).map_err(|_| LabError::config("too many GPUs for one NCCL group"))?;
    let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); contexts.len()];
    let _keep = KeepCurrent::save()?;
    let mut id = NcclUniqueId([0; 128]);
    // SAFETY: writes one ncclUniqueId into `id`, which outlives the call.
    check(api, "ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    nccl_group_start()?;
    let mut made = Ok(());
    for ((rank, ctx), comm) in (0..n).zip(contexts).zip(comms.iter_mut()) {
        made = super::bind(ctx);
        if made.is_err() {
            // NCCL knows nothing of this failure, and would end the group
            // waiting for the ranks not issued. A rank it refuses marks its
            // group failed, so that ncclGroupEnd frees those issued instead.
            let (mut none, mut cfg) = (std::ptr::null_mut(), *config);
            // SAFETY: as below; rank `n` is out of range, refused before
            // NCCL makes anything.
            let _ = unsafe { init_rank(&mut none, n, id, n, &mut cfg) };
            break;
        }
        // NCCL copies the config at the call (parseCommConfig): each rank
        // gets its own copy, as the C signature takes a mutable pointer.
        let mut cfg = *config;
        // SAFETY: `comm` and `cfg` are valid for writes and outlive the call
        // (NCCL writes the handle at once and copies the config); the id
        // is passed by value; the rank is below `n`.
        made = check(api, "ncclCommInitRankConfig", unsafe { init_rank(comm, n, id, rank, &mut cfg) });
        if made.is_err() {
            break;
        }
    }
    // Closes the group opened above (it makes the communicators), also
    // after a failed call.
    let ended = nccl_group_end();
    made.and(ended)?;
    Ok(comms)
}

/// ncclCommDestroy.
///
/// # Safety
/// `comm` came from [`nccl_comm_init_all`] or [`nccl_comm_init_config`],
/// is destroyed once, and no call on it is still being issued.
pub unsafe fn nccl_comm_destroy(comm: NcclComm) -> Result<()> {
    let api = api()?;
    // SAFETY: the caller's promise: a live communicator, destroyed once.
    check(api, "ncclCommDestroy", unsafe { (api.comm_destroy)(comm) })
}

/// ncclGroupStart: the calls that follow, up to [`nccl_group_end`], are
/// issued as one (each rank's part of a collective from one thread).
pub fn nccl_group_start() -> Result<()> {
    let api = api()?;
    // SAFETY: takes no arguments; it only opens a group on this thread.
    check(api, "ncclGroupStart", unsafe { (api.group_start)() })
}

/// ncclGroupEnd: issues the group's calls.
pub fn nccl_group_end() -> Result<()> {
    let api = api()?;
    // SAFETY: takes no arguments; what it issues was checked by each
    // call's own contract ([`nccl_all_reduce_sum_f32`]).
    check(api, "ncclGroupEnd", unsafe { (api.group_end)() })
}

/// ncclAllReduce, in place: the `count` f32 at `buf` become their sum over
/// every rank of `comm`'s group, on `stream`.
///
/// # Safety
/// `comm` is a live communicator of the GPU that `stream` (live) belongs
/// to; `buf .. buf + 4·count` lies in device memory of that GPU that stays
/// allocated until the stream has run the call.
pub unsafe fn nccl_all_reduce_sum_f32(comm: NcclComm, buf: CUdeviceptr, count: usize, stream: CUstream) -> Result<()> {
    let api = api()?;
    let p = buf as *mut c_void;
    // SAFETY: the caller's promise on the communicator, stream and memory;
    // source and destination are the same range (in place), which NCCL allows.
    check(api, "ncclAllReduce", unsafe { (api.all_reduce)(p, p, count, FLOAT32, SUM, comm, stream as *mut c_void) })
}

/// The first line of a loader's message (dlopen's can run long).
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// Where [`nccl_load`] looks, in order: `$OVERLAP_LAB_NCCL`; the names
/// the loader resolves itself (its cache, `LD_LIBRARY_PATH`); then the
/// PyPI wheel's `nvidia/nccl/lib/libnccl.so.2` beside any NVIDIA wheel
/// library directory on `LD_LIBRARY_PATH` (`nvidia/cu13/lib`) and in the
/// site-packages of each `python3` on `PATH` and of the system Pythons.
fn nccl_candidates(env: Option<std::ffi::OsString>, ld_path: Option<std::ffi::OsString>, path: Option<std::ffi::OsString>) -> Vec<PathBuf> {
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
        let c = nccl_candidates(Some("/opt/my/libnccl.so.2".into()), Some(ld), Some(path));
        assert_eq!(c[0], PathBuf::from("/opt/my/libnccl.so.2"), "the variable comes first");
        assert_eq!(c[1..3], [PathBuf::from("libnccl.so.2"), PathBuf::from("libnccl.so")]);
        let wheel = site.join("nvidia/nccl/lib/libnccl.so.2");
        assert_eq!(c.iter().filter(|p| **p == wheel).count(), 1, "beside the NVRTC wheel and under the venv's python3, once: {c:?}");
        assert_eq!(nccl_candidates(Some("".into()), None, None)[0], std::path::Path::new("libnccl.so.2"), "an empty variable is no place");
    }

    #[test]
    fn the_config_is_the_first_32_bytes_of_ncclconfig_t() {
        use std::mem::{align_of, offset_of, size_of};
        // nccl.h.in: size_t size; unsigned int magic, version; int
        // blocking, cgaClusterSize, minCTAs, maxCTAs; (then netName, ...).
        assert_eq!((size_of::<NcclConfig>(), align_of::<NcclConfig>()), (32, 8));
        assert_eq!(
            [
                offset_of!(NcclConfig, size),
                offset_of!(NcclConfig, magic),
                offset_of!(NcclConfig, version),
                offset_of!(NcclConfig, blocking),
                offset_of!(NcclConfig, cga_cluster_size),
                offset_of!(NcclConfig, min_ctas),
                offset_of!(NcclConfig, max_ctas)
            ],
            [0, 8, 12, 16, 20, 24, 28]
        );
        assert_eq!(size_of::<NcclUniqueId>(), 128);
        let c = NcclConfig::ctas(None, Some(8));
        assert_eq!((c.size, c.magic, c.version, c.blocking), (32, 0xcafebeef, 21700, 1));
        assert_eq!((c.cga_cluster_size, c.min_ctas, c.max_ctas), (i32::MIN, i32::MIN, 8), "unset fields are NCCL_CONFIG_UNDEF_INT");
        assert_eq!(NcclConfig::ctas(Some(2), Some(4)).min_ctas, 2);
    }
}
