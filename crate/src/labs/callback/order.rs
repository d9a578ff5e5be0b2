//! How a slot's reader is ordered after the D2H that filled it, in the
//! lab's words. The schedule finds such a race for any wiring; this record
//! names the missing link (no event, an event on the wrong stream, a stream
//! that never waited). On a GPU the loop also refuses an unordered reader with
//! it before launching one, since on the GPU the race would be real.

use super::{On, Slot};
use crate::error::{LabError, Result};

/// Per slot: what orders a reader after its D2H.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotOrder {
    /// The stream its D2H went onto.
    pub d2h_on: Option<On>,
    /// "Scores ready" was recorded on that stream after the D2H.
    pub ready_recorded: bool,
    /// Streams that waited for "scores ready" after it was recorded.
    pub waited: [bool; 2],
}

/// Who reads a slot's scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// A host function on a stream.
    HostFn(On),
    /// A host thread that waits on the "scores ready" event itself.
    WaitingThread,
}

impl SlotOrder {
    /// The D2H of a fresh iteration went onto `on`.
    pub fn d2h(on: On) -> SlotOrder {
        SlotOrder { d2h_on: Some(on), ..SlotOrder::default() }
    }
    /// "Scores ready" recorded on `on`: it counts only behind the D2H (same
    /// stream), and recording again re-arms it, so earlier waits lapse.
    pub fn record(&mut self, on: On) {
        *self = SlotOrder { d2h_on: self.d2h_on, ready_recorded: self.d2h_on == Some(on), waited: [false; 2] };
    }
    pub fn wait(&mut self, on: On) {
        self.waited[on as usize] = true;
    }
    /// Whether `reader` runs after the D2H: a host function on the same
    /// stream, or on a stream that waited for the event recorded behind it;
    /// a thread once that event is recorded (it waits on it itself).
    pub fn orders(&self, reader: Reader) -> bool {
        match reader {
            Reader::HostFn(on) => self.d2h_on == Some(on) || (self.ready_recorded && self.waited[on as usize]),
            Reader::WaitingThread => self.ready_recorded,
        }
    }
    /// Ok if `reader` is ordered after the D2H, else the race, explained.
    pub fn check(&self, reader: Reader, slot: Slot, iteration: usize) -> Result<()> {
        self.missing(reader, slot, iteration).map_or(Ok(()), |why| Err(LabError::schedule(why)))
    }

    /// None if `reader` is ordered after the D2H, else what link is missing.
    pub fn missing(&self, reader: Reader, slot: Slot, iteration: usize) -> Option<String> {
        if self.orders(reader) {
            return None;
        }
        let who = match reader {
            Reader::HostFn(On::Compute) => "a host function on the compute stream",
            Reader::HostFn(On::Callback) => "a host function on the callback stream",
            Reader::WaitingThread => "the event-waiting thread",
        };
        let missing = match (self.d2h_on, reader) {
            (None, _) => "no D2H of its scores was issued".to_string(),
            (Some(_), _) if !self.ready_recorded => "no \"scores ready\" event was recorded after its D2H, on the D2H's stream".to_string(),
            (Some(_), Reader::HostFn(on)) => format!("the {} stream never waited for the \"scores ready\" event", on.name()),
            (Some(_), Reader::WaitingThread) => unreachable!("a thread is ordered once the event is recorded"),
        };
        Some(format!(
            "iteration {iteration}: {who} reads slot {} but is not ordered after its D2H ({missing}): it could read scores that have not arrived (a race)",
            slot.0
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_is_ordered_by_its_stream_or_by_a_wait_on_a_fresh_event() {
        let s = Slot(2);
        let mut o = SlotOrder::default();
        assert!(o.check(Reader::HostFn(On::Compute), s, 7).unwrap_err().to_string().contains("no D2H of its scores"));
        o = SlotOrder::d2h(On::Compute);
        assert!(o.orders(Reader::HostFn(On::Compute)));
        let e = o.check(Reader::HostFn(On::Callback), s, 7).unwrap_err().to_string();
        assert!(e.contains("iteration 7: a host function on the callback stream reads slot 2") && e.contains("no \"scores ready\" event"), "{e}");
        o.record(On::Callback); // on the wrong stream: not behind the D2H
        assert!(!o.orders(Reader::WaitingThread));
        o.record(On::Compute);
        assert!(o.orders(Reader::WaitingThread));
        let e = o.check(Reader::HostFn(On::Callback), s, 7).unwrap_err().to_string();
        assert!(e.contains("the callback stream never waited"), "{e}");
        o.wait(On::Callback);
        assert!(o.orders(Reader::HostFn(On::Callback)));
        o.record(On::Compute); // re-armed: the earlier wait no longer counts
        assert!(!o.orders(Reader::HostFn(On::Callback)));
    }
}
