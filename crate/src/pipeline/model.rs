//! The pipeline with no GPU: records the schedule a loop issues and tracks
//! where every element's value came from, so a checker can say which
//! element is wrong and why, and the queue model can time the schedule.

use super::issue::{DevRef, EventRef, HostRef, Issue, StreamRef};
use super::schedule::{Access, OpKind, Schedule, StreamKind};
use crate::error::{LabError, Result};

/// Where an element's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Never written.
    Unset,
    /// Input element i.
    Input(u32),
    /// The kernel applied to input element i.
    Output(u32),
    /// The kernel applied to something that was not an input.
    Garbage,
}

/// Buffers of a model pipeline: (name, is host, elements).
struct ModelBuffer {
    name: String,
    cells: Vec<Provenance>,
}

/// Records a schedule with no GPU and tracks every element's provenance.
pub struct ModelPipeline {
    pub schedule: Schedule,
    /// Elements per producer batch (labs with a producer).
    pub batch_elements: usize,
    streams: usize,
    events: usize,
    hosts: Vec<ModelBuffer>,
    devices: Vec<ModelBuffer>,
}

impl ModelPipeline {
    pub fn new() -> ModelPipeline {
        ModelPipeline { schedule: Schedule::new(), batch_elements: 0, streams: 0, events: 0, hosts: vec![], devices: vec![] }
    }
    /// A non-blocking stream at the default priority.
    pub fn stream(&mut self) -> StreamRef {
        self.stream_of(StreamKind::NonBlocking, 0)
    }
    /// A stream of `kind` at `priority` (lower runs first).
    pub fn stream_of(&mut self, kind: StreamKind, priority: i32) -> StreamRef {
        self.streams += 1;
        self.schedule.declare_stream(self.streams - 1, kind, priority);
        StreamRef(self.streams - 1)
    }
    /// A host buffer of `n` elements holding inputs 0..n (`input`) or nothing.
    pub fn host(&mut self, name: &str, n: usize, input: bool) -> HostRef {
        let cells = (0..n).map(|i| if input { Provenance::Input(i as u32) } else { Provenance::Unset }).collect();
        self.hosts.push(ModelBuffer { name: name.into(), cells });
        HostRef(self.hosts.len() - 1)
    }
    pub fn device(&mut self, name: &str, n: usize) -> DevRef {
        self.devices.push(ModelBuffer { name: name.into(), cells: vec![Provenance::Unset; n] });
        DevRef(self.devices.len() - 1)
    }
    pub fn host_cells(&self, h: HostRef) -> &[Provenance] {
        &self.hosts[h.0].cells
    }
    pub fn device_cells(&self, d: DevRef) -> &[Provenance] {
        &self.devices[d.0].cells
    }

    fn check_stream(&self, s: StreamRef) -> Result<()> {
        if s.0 >= self.streams {
            return Err(LabError::config(format!("stream {} was never created", s.0)));
        }
        Ok(())
    }
    fn range(b: &ModelBuffer, at: usize, n: usize) -> Result<std::ops::Range<usize>> {
        match at.checked_add(n) {
            Some(end) if n > 0 && end <= b.cells.len() => Ok(at..end),
            _ => Err(LabError::config(format!("{n} elements at {at} do not fit {} ({} elements)", b.name, b.cells.len()))),
        }
    }
    fn access(b: &ModelBuffer, r: &std::ops::Range<usize>, write: bool) -> Access {
        Access { buffer: b.name.clone(), start: r.start as u64 * 4, end: r.end as u64 * 4, write }
    }
}

impl Default for ModelPipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Issue for ModelPipeline {
    fn h2d(&mut self, s: StreamRef, dst: DevRef, dst_at: usize, src: HostRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.check_stream(s)?;
        let (rs, rd) = (Self::range(&self.hosts[src.0], src_at, n)?, Self::range(&self.devices[dst.0], dst_at, n)?);
        let acc = vec![Self::access(&self.hosts[src.0], &rs, false), Self::access(&self.devices[dst.0], &rd, true)];
        self.schedule.gpu_op(0, s.0, OpKind::H2d, label, acc);
        let vals: Vec<Provenance> = self.hosts[src.0].cells[rs].to_vec();
        self.devices[dst.0].cells[rd].copy_from_slice(&vals);
        Ok(())
    }
    fn d2h(&mut self, s: StreamRef, dst: HostRef, dst_at: usize, src: DevRef, src_at: usize, n: usize, label: &str) -> Result<()> {
        self.check_stream(s)?;
        let (rs, rd) = (Self::range(&self.devices[src.0], src_at, n)?, Self::range(&self.hosts[dst.0], dst_at, n)?);
        let acc = vec![Self::access(&self.devices[src.0], &rs, false), Self::access(&self.hosts[dst.0], &rd, true)];
        self.schedule.gpu_op(0, s.0, OpKind::D2h, label, acc);
        let vals: Vec<Provenance> = self.devices[src.0].cells[rs].to_vec();
        self.hosts[dst.0].cells[rd].copy_from_slice(&vals);
        Ok(())
    }
    fn compute(&mut self, s: StreamRef, input: DevRef, in_at: usize, output: DevRef, out_at: usize, n: usize, label: &str) -> Result<()> {
        self.check_stream(s)?;
        let (ri, ro) = (Self::range(&self.devices[input.0], in_at, n)?, Self::range(&self.devices[output.0], out_at, n)?);
        let acc = vec![Self::access(&self.devices[input.0], &ri, false), Self::access(&self.devices[output.0], &ro, true)];
        self.schedule.gpu_op(0, s.0, OpKind::Kernel, label, acc);
        let vals: Vec<Provenance> = self.devices[input.0].cells[ri]
            .iter()
            .map(|p| match p {
                Provenance::Input(i) => Provenance::Output(*i),
                _ => Provenance::Garbage,
            })
            .collect();
        self.devices[output.0].cells[ro].copy_from_slice(&vals);
        Ok(())
    }
    fn event(&mut self) -> Result<EventRef> {
        self.events += 1;
        Ok(EventRef(self.events - 1))
    }
    fn record(&mut self, e: EventRef, s: StreamRef) -> Result<()> {
        self.check_stream(s)?;
        self.schedule.record_event(e.0, s.0);
        Ok(())
    }
    fn wait(&mut self, s: StreamRef, e: EventRef) -> Result<()> {
        self.check_stream(s)?;
        self.schedule.stream_wait_event(s.0, e.0);
        Ok(())
    }
    fn host_wait(&mut self, e: EventRef) -> Result<()> {
        self.schedule.host_wait_event(0, e.0);
        Ok(())
    }
    fn host_sync(&mut self, s: StreamRef) -> Result<()> {
        self.check_stream(s)?;
        self.schedule.host_wait_stream(0, s.0);
        Ok(())
    }
    fn produce(&mut self, h: HostRef, at: usize, n: usize, batch: usize, label: &str) -> Result<()> {
        let r = Self::range(&self.hosts[h.0], at, n)?;
        let acc = vec![Self::access(&self.hosts[h.0], &r, true)];
        self.schedule.host_op(0, label, acc);
        for (j, cell) in self.hosts[h.0].cells[r].iter_mut().enumerate() {
            *cell = Provenance::Input((batch * self.batch_elements.max(n) + j) as u32);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provenance_flows_through_copies_and_kernel() {
        let mut m = ModelPipeline::new();
        let s = m.stream();
        let (hi, ho) = (m.host("host in", 8, true), m.host("host out", 8, false));
        let (di, dout) = (m.device("device in", 8), m.device("device out", 8));
        m.h2d(s, di, 0, hi, 0, 8, "up").unwrap();
        m.compute(s, di, 0, dout, 0, 4, "k").unwrap();
        m.d2h(s, ho, 0, dout, 0, 8, "down").unwrap();
        let cells = m.host_cells(ho);
        assert_eq!(cells[0], Provenance::Output(0));
        assert_eq!(cells[3], Provenance::Output(3));
        assert_eq!(cells[4], Provenance::Unset, "the kernel covered only 4 elements");
        assert!(m.schedule.races().is_empty());
        assert!(m.h2d(StreamRef(5), di, 0, hi, 0, 1, "x").is_err());
        assert!(m.h2d(s, di, 4, hi, 0, 8, "x").unwrap_err().to_string().contains("do not fit"));
    }
}
