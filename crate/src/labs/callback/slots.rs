//! The slot book: which pinned score slot belongs to which iteration.
//!
//! A few slots carry hundreds of iterations. The enqueue loop takes a free
//! slot before it copies scores into it; whoever finishes the argmin (a
//! host function, the worker, the event-waiting thread) gives it back. Every
//! take bumps the slot's generation, so a reader can prove nothing took its
//! slot while it was reading, and a late give-back of an old lease is caught
//! instead of freeing someone else's slot. Plain CPU state: no CUDA here.

use crate::error::{LabError, Result};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why iteration `t` can never get a slot when every slot is held, as
/// the loop says it on a GPU and on the model: `uncopied` lists the held
/// slots nothing was copied into, as (slot, iteration) (an iteration that
/// took more than one); with none, no argmin was ever issued to free them.
pub fn no_slot_ever(t: usize, uncopied: &[(usize, usize)]) -> LabError {
    if uncopied.is_empty() {
        return LabError::schedule(format!("iteration {t} would wait for a slot forever: every slot holds scores whose argmin was never issued"));
    }
    let held: Vec<String> = uncopied.iter().map(|(slot, it)| format!("slot {slot} (iteration {it})")).collect();
    LabError::schedule(format!(
        "iteration {t} would wait for a slot forever: {} taken and never copied into, so no argmin frees them (an iteration takes one slot)",
        held.join(", ")
    ))
}

/// The right to use one slot for one iteration. Not `Clone`: given back once.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    pub slot: usize,
    pub generation: u64,
    pub iteration: usize,
}

#[derive(Debug, Default)]
struct BookState {
    generation: Vec<u64>,
    /// The iteration holding each slot.
    holder: Vec<Option<usize>>,
    free: VecDeque<usize>,
    failed: Option<String>,
    /// Every misuse seen: a slot taken while held, a stale give-back.
    misuse: Vec<String>,
}

#[derive(Debug)]
pub struct SlotBook {
    state: Mutex<BookState>,
    returned: Condvar,
    timeout: Duration,
}

impl SlotBook {
    /// `slots` free slots; `take` fails if none comes back within `timeout`.
    pub fn new(slots: usize, timeout: Duration) -> SlotBook {
        let state = BookState { generation: vec![0; slots], holder: vec![None; slots], free: (0..slots).collect(), ..Default::default() };
        SlotBook { state: Mutex::new(state), returned: Condvar::new(), timeout }
    }

    fn lock(&self) -> MutexGuard<'_, BookState> {
        // A panic elsewhere while holding the lock leaves plain data behind.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn slots(&self) -> usize {
        self.lock().generation.len()
    }

    /// Waits for a free slot (oldest returned first) and leases it to `iteration`.
    pub fn take(&self, iteration: usize) -> Result<Lease> {
        let deadline = Instant::now() + self.timeout;
        let mut s = self.lock();
        loop {
            if let Some(why) = &s.failed {
                return Err(LabError::schedule(format!("iteration {iteration} could not get a slot: {why}")));
            }
            if let Some(slot) = s.free.pop_front() {
                return Ok(Self::lease(&mut s, slot, iteration));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LabError::schedule(format!(
                    "iteration {iteration} waited {:.1} s for a free slot: none of the {} slots came back (held by iterations {:?})",
                    self.timeout.as_secs_f64(),
                    s.generation.len(),
                    s.holder
                )));
            }
            s = self.returned.wait_timeout(s, deadline - now).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Takes slot `slot` at once, held or not: what `buffers[t % n]` does.
    /// Taking a held slot is recorded as misuse; its holder's reads and
    /// give-back then fail their generation check.
    pub fn take_at(&self, slot: usize, iteration: usize) -> Result<Lease> {
        let mut s = self.lock();
        if slot >= s.generation.len() {
            return Err(LabError::config(format!("slot {slot} does not exist ({} slots)", s.generation.len())));
        }
        s.free.retain(|&f| f != slot);
        if let Some(held_by) = s.holder[slot] {
            let msg = format!("slot {slot} was taken for iteration {iteration} while iteration {held_by} still held it (reused too early)");
            s.misuse.push(msg);
        }
        Ok(Self::lease(&mut s, slot, iteration))
    }

    fn lease(s: &mut BookState, slot: usize, iteration: usize) -> Lease {
        s.generation[slot] += 1;
        s.holder[slot] = Some(iteration);
        Lease { slot, generation: s.generation[slot], iteration }
    }

    /// Whether `lease` still owns its slot (nobody took it since).
    pub fn is_current(&self, lease: &Lease) -> bool {
        self.lock().generation[lease.slot] == lease.generation
    }

    /// Gives a slot back. A stale lease (the slot was taken again meanwhile)
    /// is an error and frees nothing.
    pub fn give_back(&self, lease: Lease) -> Result<()> {
        let mut s = self.lock();
        if s.generation[lease.slot] != lease.generation || s.holder[lease.slot] != Some(lease.iteration) {
            let msg = format!(
                "iteration {} gave back slot {} after iteration {:?} had taken it again (generation {} vs {})",
                lease.iteration, lease.slot, s.holder[lease.slot], lease.generation, s.generation[lease.slot]
            );
            s.misuse.push(msg.clone());
            return Err(LabError::schedule(msg));
        }
        s.holder[lease.slot] = None;
        s.free.push_back(lease.slot);
        drop(s);
        self.returned.notify_all();
        Ok(())
    }

    /// Makes every waiting and later `take` fail with `why` (a broken worker).
    pub fn fail(&self, why: impl Into<String>) {
        let mut s = self.lock();
        s.failed.get_or_insert(why.into());
        drop(s);
        self.returned.notify_all();
    }

    /// Waits until every slot is back (or fails after the timeout).
    pub fn wait_all_back(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut s = self.lock();
        while s.holder.iter().any(Option::is_some) {
            let now = Instant::now();
            if s.failed.is_some() || now >= deadline {
                return Err(LabError::schedule(format!("slots still held at the end of the run by iterations {:?}", s.holder)));
            }
            s = self.returned.wait_timeout(s, deadline - now).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        Ok(())
    }

    pub fn misuse(&self) -> Vec<String> {
        self.lock().misuse.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    #[test]
    fn four_slots_carry_many_iterations_and_no_slot_is_taken_while_held() {
        let book = Arc::new(SlotBook::new(4, Duration::from_secs(10)));
        let (tx, rx) = mpsc::channel::<Lease>();
        let reader = {
            let book = book.clone();
            std::thread::spawn(move || {
                let mut seen = 0;
                for lease in rx {
                    assert!(book.is_current(&lease), "slot {} taken while iteration {} read it", lease.slot, lease.iteration);
                    std::thread::yield_now();
                    assert!(book.is_current(&lease));
                    book.give_back(lease).unwrap();
                    seen += 1;
                }
                seen
            })
        };
        let mut generations = [0u64; 4];
        for t in 0..500 {
            let lease = book.take(t).unwrap();
            assert!(lease.generation > generations[lease.slot], "a generation never repeats");
            generations[lease.slot] = lease.generation;
            tx.send(lease).unwrap();
        }
        drop(tx);
        assert_eq!(reader.join().unwrap(), 500);
        book.wait_all_back().unwrap();
        assert_eq!(generations.iter().sum::<u64>(), 500, "4 slots carried all 500 iterations");
        assert!(book.misuse().is_empty());
    }

    #[test]
    fn taking_a_held_slot_is_caught_by_the_reader_and_the_give_back() {
        let book = SlotBook::new(2, Duration::from_secs(1));
        let first = book.take(0).unwrap();
        let early = book.take_at(first.slot, 2).unwrap();
        assert!(!book.is_current(&first), "the reader of iteration 0 sees its slot was taken");
        let e = book.give_back(first).unwrap_err().to_string();
        assert!(e.contains("iteration 0 gave back slot 0 after iteration Some(2)"), "{e}");
        assert!(book.misuse()[0].contains("taken for iteration 2 while iteration 0 still held it"), "{:?}", book.misuse());
        book.give_back(early).unwrap();
    }

    #[test]
    fn a_slot_that_never_comes_back_is_an_error_not_a_hang() {
        let book = SlotBook::new(1, Duration::from_millis(50));
        let _held = book.take(0).unwrap();
        let e = book.take(1).unwrap_err().to_string();
        assert!(e.contains("iteration 1 waited") && e.contains("held by iterations [Some(0)]"), "{e}");
        assert!(book.wait_all_back().is_err());
    }

    #[test]
    fn a_failed_book_wakes_the_waiter_with_the_reason() {
        let book = Arc::new(SlotBook::new(1, Duration::from_secs(30)));
        let _held = book.take(0).unwrap();
        let b = book.clone();
        let waiter = std::thread::spawn(move || b.take(1));
        std::thread::sleep(Duration::from_millis(20));
        book.fail("the worker panicked");
        let e = waiter.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("the worker panicked"), "{e}");
    }
}
