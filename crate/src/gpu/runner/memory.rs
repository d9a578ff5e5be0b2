//! Memory as operations of the loop: allocating and freeing device memory
//! (blocking or stream-ordered), page-locked host memory, and pinning the
//! lab's own host memory in place. Each is timed on the host clock (what
//! the call costs the CPU, including anything it waits for). A buffer the
//! loop allocates gets its address when the call runs, so a deferring
//! runner records the ops that use it before it exists.

use super::command::{Base, Command, What};
use super::timing::Mark;
use super::{DeviceEntry, HostEntry, Runner};
use crate::error::{LabError, Result};
use crate::gpu::{driver, trace, Stream};
use crate::pipeline::issue::{check_alloc, unique_name, DevRef, Holding, HostRef, StreamRef};
use crate::pipeline::op::{Access, Memory, OpKind};
use std::ffi::c_void;

impl<'a> Runner<'a> {
    /// Records a memory call as operation `kind` on `s` (stream-ordered)
    /// or on the CPU (blocking), and makes it: `call`. A release that
    /// races with earlier use of its buffer is refused before the call:
    /// freeing memory the GPU may still touch is never made.
    fn memory_call(
        &mut self,
        s: Option<StreamRef>,
        kind: OpKind,
        label: &str,
        accesses: Vec<Access>,
        call: impl FnOnce() -> Result<()> + Send + 'a,
    ) -> Result<()> {
        self.not_captured("a memory call")?;
        self.lanes.on_loop_thread("a memory call")?;
        let id = match s {
            Some(s) => {
                let lane = self.lane(s)?;
                // The stream's next op does not start where this one was issued.
                self.reusable_end[lane] = None;
                self.schedule.gpu_op(0, lane, kind, label, accesses)
            }
            None => {
                self.forget_reusable_ends();
                self.schedule.host_call(0, kind, label, accesses)
            }
        };
        if let (OpKind::Free(_), Some(r)) = (kind, self.schedule.races().iter().find(|r| r.later == id)) {
            self.marks.push(Mark::None);
            return Err(LabError::schedule(format!("refused to release memory the GPU may still use: {}", r.what)));
        }
        let slot = self.host_slot();
        self.marks.push(Mark::Host(slot));
        // An op on another GPU's stream made that GPU current.
        let own = (self.gpus.len() > 1).then(|| self.exec.gpu.clone());
        let label = label.to_string();
        self.dispatch(Command {
            thread: 0,
            what: What::Host {
                timed: Some(slot),
                call: Box::new(move || {
                    let _r = trace::range(&label);
                    if let Some(g) = own {
                        g.bind()?;
                    }
                    call()
                }),
            },
        })
    }

    /// What a new allocation named `name` is tracked by ([`unique_name`]).
    fn new_name(&self, name: &str) -> String {
        unique_name(self.devices.iter().map(|d| d.hold.name.as_str()).chain(self.hosts.iter().map(|h| h.hold.name.as_str())), name)
    }

    fn stream_ref(&self, s: StreamRef) -> Result<&'a Stream> {
        self.streams
            .get(s.0)
            .copied()
            .filter(|_| s.0 < self.lanes.len())
            .ok_or_else(|| LabError::config(format!("stream {} was never added to the runner", s.0)))
    }

    /// cuMemAllocAsync on `s`: `bytes` from the device's pool.
    pub fn alloc_async(&mut self, s: StreamRef, bytes: usize, name: &str) -> Result<DevRef> {
        check_alloc(name, bytes, "bytes")?;
        let name = &self.new_name(name);
        let stream = self.stream_ref(s)?;
        if stream.gpu().ordinal() != self.exec.gpu.ordinal() {
            return Err(LabError::config(format!(
                "cuMemAllocAsync on a stream of GPU {}: this runner allocates on its own GPU ({}) only",
                stream.gpu().ordinal(),
                self.exec.gpu.ordinal()
            )));
        }
        let base = Base::later();
        let at = base.clone();
        let whole = Access::write(name, 0, bytes as u64);
        self.memory_call(Some(s), OpKind::Alloc(Memory::Pool), &Memory::Pool.label(true, name), vec![whole], move || {
            // SAFETY: the stream is borrowed for the runner's life.
            at.set(unsafe { driver::mem_alloc_async(bytes, stream.raw()) }?);
            Ok(())
        })?;
        self.devices.push(DeviceEntry { base, bytes, hold: Holding::allocated(name, Memory::Pool), gpu: self.exec.gpu.clone() });
        Ok(DevRef(self.devices.len() - 1))
    }
    /// cuMemAlloc (blocking).
    pub fn alloc(&mut self, bytes: usize, name: &str) -> Result<DevRef> {
        check_alloc(name, bytes, "bytes")?;
        let name = &self.new_name(name);
        let base = Base::later();
        let at = base.clone();
        let whole = Access::write(name, 0, bytes as u64);
        self.memory_call(None, OpKind::Alloc(Memory::Device), &Memory::Device.label(true, name), vec![whole], move || {
            at.set(driver::device_alloc(bytes)?);
            Ok(())
        })?;
        self.devices.push(DeviceEntry { base, bytes, hold: Holding::allocated(name, Memory::Device), gpu: self.exec.gpu.clone() });
        Ok(DevRef(self.devices.len() - 1))
    }
    /// Releases device buffer `d` by `how`'s call (on `s` when stream-ordered).
    fn release_device(&mut self, s: Option<StreamRef>, d: DevRef, how: Memory) -> Result<()> {
        let stream = s.map(|s| self.stream_ref(s)).transpose()?;
        let e = self.device_entry(d)?;
        let (label, base, whole) = (e.hold.release_label(how)?, e.base.clone(), Access::write(&e.hold.name, 0, e.bytes as u64));
        self.memory_call(s, OpKind::Free(how), &label, vec![whole], move || {
            // SAFETY: the loop's own allocation of this kind, released once
            // (checked); every use is ordered before it (memory_call refuses a race).
            unsafe {
                match stream {
                    Some(st) => driver::mem_free_async(base.get(), st.raw()),
                    None => driver::device_free(base.get()),
                }
            }
        })?;
        self.devices[d.0].hold.released_by(how);
        Ok(())
    }
    /// cuMemFreeAsync on `s`.
    pub fn free_async(&mut self, s: StreamRef, d: DevRef) -> Result<()> {
        self.release_device(Some(s), d, Memory::Pool)
    }
    /// cuMemFree (blocking).
    pub fn free(&mut self, d: DevRef) -> Result<()> {
        self.release_device(None, d, Memory::Device)
    }
    /// cuMemHostAlloc (blocking): page-locked, cached host memory.
    pub fn alloc_pinned(&mut self, bytes: usize, name: &str) -> Result<HostRef> {
        check_alloc(name, bytes, "bytes")?;
        if bytes % 8 != 0 {
            return Err(LabError::config(format!("{name}: {bytes} bytes of host memory: give a multiple of 8 (an even number of f32 elements)")));
        }
        let name = &self.new_name(name);
        let whole = Access::write(name, 0, bytes as u64);
        let label = Memory::Pinned.label(true, name);
        let base = Base::later();
        let at = base.clone();
        self.memory_call(None, OpKind::Alloc(Memory::Pinned), &label, vec![whole], move || {
            at.set(driver::host_alloc(bytes, driver::HOST_ALLOC_PINNED)? as u64);
            Ok(())
        })?;
        self.hosts.push(HostEntry { base, words: bytes / 8, hold: Holding::allocated(name, Memory::Pinned), page_locked: true });
        Ok(HostRef(self.hosts.len() - 1))
    }
    /// Releases host buffer `h` by `how`'s call (cuMemFreeHost, or
    /// cuMemHostUnregister: then it is the lab's ordinary memory again).
    fn release_host(&mut self, h: HostRef, how: Memory) -> Result<()> {
        let e = self.host_entry(h)?;
        let (label, base, whole) = (e.hold.release_label(how)?, e.base.clone(), Access::write(&e.hold.name, 0, e.words as u64 * 8));
        self.memory_call(None, OpKind::Free(how), &label, vec![whole], move || {
            let ptr = base.get() as *mut c_void;
            // SAFETY: allocated or registered by the loop as `how` says, released
            // once (checked); every copy of it is ordered before this (refused otherwise).
            unsafe {
                if how == Memory::Registered {
                    driver::host_unregister(ptr)
                } else {
                    driver::host_free(ptr)
                }
            }
        })?;
        let e = &mut self.hosts[h.0];
        e.hold.released_by(how);
        if how == Memory::Registered {
            e.page_locked = false;
        }
        Ok(())
    }
    /// cuMemFreeHost (blocking).
    pub fn free_pinned(&mut self, h: HostRef) -> Result<()> {
        self.release_host(h, Memory::Pinned)
    }
    /// cuMemHostRegister (blocking): pins the lab's ordinary buffer `h` in place.
    pub fn pin(&mut self, h: HostRef) -> Result<()> {
        let e = self.host_entry(h)?;
        e.hold.live()?;
        if e.page_locked {
            return Err(LabError::config(format!("{} is already page-locked: pin ordinary memory only", e.hold.name)));
        }
        let (base, bytes, label) = (e.base.clone(), e.words * 8, Memory::Registered.label(true, &e.hold.name));
        self.memory_call(None, OpKind::Alloc(Memory::Registered), &label, vec![], move || {
            // SAFETY: the runner holds the buffer's exclusive borrow for its
            // life and unregisters it before that ends (unpin, or finish).
            unsafe { driver::host_register(base.get() as *mut c_void, bytes) }
        })?;
        let e = &mut self.hosts[h.0];
        (e.page_locked, e.hold.memory) = (true, Some(Memory::Registered));
        Ok(())
    }
    /// cuMemHostUnregister (blocking): `h` is ordinary memory again.
    pub fn unpin(&mut self, h: HostRef) -> Result<()> {
        self.release_host(h, Memory::Registered)
    }
}
