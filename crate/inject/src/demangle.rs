//! Kernel names for people: demangled by the C++ runtime's own
//! `__cxa_demangle` (libstdc++'s, the demangler Kineto calls), not the
//! `cpp_demangle` crate the converter falls back on, which spells some
//! names otherwise (`(unsigned long)2` where libstdc++ writes `2ul`). On an
//! H200 some of PyTorch's kernel names still differed from torch.profiler's
//! past their first 90 characters, so `compare_traces.py` pairs two traces'
//! ops by their order on each stream, not by name. Each name is demangled
//! once: CUPTI hands a kernel's name as the same static string every time.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

type CxaDemangle = unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;

/// `__cxa_demangle`: the process's own, else libstdc++'s, else none.
fn demangler() -> Option<CxaDemangle> {
    static FOUND: OnceLock<Option<CxaDemangle>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        // SAFETY: looks a symbol up by a NUL-terminated name; a non-null
        // result is the C++ ABI's demangler, of this signature.
        let in_process = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__cxa_demangle".as_ptr()) };
        let found = if in_process.is_null() {
            // SAFETY: loads the system's libstdc++ (kept for the process's
            // life) and looks the same symbol up in it.
            unsafe {
                let lib = libc::dlopen(c"libstdc++.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
                if lib.is_null() {
                    std::ptr::null_mut()
                } else {
                    libc::dlsym(lib, c"__cxa_demangle".as_ptr())
                }
            }
        } else {
            in_process
        };
        // SAFETY: a non-null `__cxa_demangle` has this signature (the C++ ABI).
        (!found.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, CxaDemangle>(found) })
    })
}

/// Names demangled so far, by the address CUPTI gave the mangled one.
#[derive(Default)]
pub struct Demangled(HashMap<usize, String>);

impl Demangled {
    /// `mangled` demangled, or as it is where it is no mangled C++ name or
    /// no demangler is loaded.
    ///
    /// # Safety
    /// `mangled` is a NUL-terminated string that lives as long as the
    /// process (CUPTI's kernel names do).
    pub unsafe fn name(&mut self, mangled: *const c_char) -> String {
        self.0
            .entry(mangled as usize)
            .or_insert_with(|| {
                // SAFETY: NUL-terminated and alive (# Safety).
                let raw = unsafe { CStr::from_ptr(mangled) }.to_string_lossy().into_owned();
                let Some(demangle) = demangler().filter(|_| raw.starts_with("_Z")) else { return raw };
                let mut status: c_int = -1;
                // SAFETY: the ABI's demangler with a NUL-terminated name and
                // no buffer of ours; it returns a malloc'd string or null.
                let out = unsafe { demangle(mangled, std::ptr::null_mut(), std::ptr::null_mut(), &mut status) };
                if out.is_null() || status != 0 {
                    return raw;
                }
                // SAFETY: a NUL-terminated string the demangler malloc'd,
                // copied, then freed once.
                unsafe {
                    let name = CStr::from_ptr(out).to_string_lossy().into_owned();
                    libc::free(out.cast());
                    name
                }
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mangled_kernel_name_is_demangled_as_libstdcxx_writes_it_and_others_kept() {
        static MANGLED: &CStr = c"_Z4workPKfPfmiff";
        static PLAIN: &CStr = c"nvjet_sm90_tst_128x128";
        let mut d = Demangled::default();
        // SAFETY: static NUL-terminated strings.
        let (a, b) = unsafe { (d.name(MANGLED.as_ptr()), d.name(PLAIN.as_ptr())) };
        if demangler().is_some() {
            assert_eq!(a, "work(float const*, float*, unsigned long, int, float, float)");
        }
        assert_eq!(b, "nvjet_sm90_tst_128x128");
    }
}
