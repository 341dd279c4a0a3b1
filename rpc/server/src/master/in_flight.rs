//! The queries in flight, so that a delete can wait for the ones planned
//! before it.
//!
//! A query names the vids of its terms from the catalog when it is planned.
//! A delete first takes its vids out of the catalog, then waits for every
//! query planned earlier to finish, and only then has the owners remove the
//! vectors: no query is ever planned on a vector its owner has already
//! dropped, so a delete never makes a query fail (it sees each vector before
//! or after the delete).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use tokio::sync::Notify;

/// Counts queries by the catalog generation they were planned under.
#[derive(Default)]
pub(super) struct InFlight {
    generation: Cell<u64>,
    counts: RefCell<BTreeMap<u64, usize>>,
    finished: Notify,
}

/// One query in flight; dropping it (however the query ends) counts it out.
pub(super) struct Ticket {
    owner: Rc<InFlight>,
    generation: u64,
}

impl InFlight {
    /// Counts a query in, under the current generation.
    pub(super) fn enter(self: &Rc<Self>) -> Ticket {
        let generation = self.generation.get();
        *self.counts.borrow_mut().entry(generation).or_default() += 1;
        Ticket {
            owner: Rc::clone(self),
            generation,
        }
    }

    /// Starts a new generation and waits until no query of an earlier one
    /// is in flight.
    pub(super) async fn drain(&self) {
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        loop {
            let finished = self.finished.notified();
            if self.counts.borrow().range(..generation).next().is_none() {
                return;
            }
            finished.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.borrow_mut();
        if let Some(count) = counts.get_mut(&self.generation) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.generation);
            }
        }
        drop(counts);
        self.owner.finished.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_waits_for_earlier_queries_only() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            let in_flight = Rc::new(InFlight::default());
            let early = in_flight.enter();
            let drained = Rc::new(Cell::new(false));
            let waiter = {
                let (in_flight, drained) = (in_flight.clone(), drained.clone());
                tokio::task::spawn_local(async move {
                    in_flight.drain().await;
                    drained.set(true);
                })
            };
            tokio::task::yield_now().await;
            let late = in_flight.enter();
            tokio::task::yield_now().await;
            assert!(
                !drained.get(),
                "a query planned before the delete is in flight"
            );
            drop(early);
            waiter.await.unwrap();
            assert!(drained.get());
            drop(late);
            in_flight.drain().await;
        });
    }
}
