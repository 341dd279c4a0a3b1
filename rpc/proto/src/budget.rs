//! Time budgets: every RPC's deadline comes from the query's remaining time.
//!
//! The budget travels with each call (as microseconds, so clocks need not
//! agree) and shrinks at every hop: a caller with `remaining` time waits at
//! most `remaining - MARGIN` for its callee, and grants the callee less than
//! that, keeping back a reserve for each level of calls below it. So an
//! inner hop always times out, and reports the machine that failed, before
//! the hop above it gives up on it.

use std::time::{Duration, Instant};

/// Time a caller keeps for itself to build its reply after a callee gives up.
pub const MARGIN: Duration = Duration::from_millis(5);

/// The least and most a caller keeps back per level of calls below its callee.
const RESERVE_MIN: Duration = Duration::from_millis(5);
const RESERVE_MAX: Duration = Duration::from_millis(250);

/// A deadline on this machine's clock.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    deadline: Instant,
}

/// What a call made now may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTime {
    /// How long the caller waits for the answer.
    pub wait: Duration,
    /// The budget granted to the callee.
    pub grant: Duration,
}

impl Budget {
    /// A budget of `time` from `start`.
    pub fn starting(start: Instant, time: Duration) -> Budget {
        Budget {
            deadline: start + time,
        }
    }

    /// A budget of `time` from now.
    pub fn new(time: Duration) -> Budget {
        Budget::starting(Instant::now(), time)
    }

    /// A budget received on the wire, counted from when the call arrived.
    pub fn from_micros(start: Instant, micros: u64) -> Budget {
        Budget::starting(start, Duration::from_micros(micros))
    }

    /// Time left.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The times for a call whose callee will make `levels_below` levels of
    /// nested calls itself; `None` when too little time is left to try.
    pub fn call(&self, levels_below: usize) -> Option<CallTime> {
        split(self.remaining(), levels_below)
    }
}

fn split(remaining: Duration, levels_below: usize) -> Option<CallTime> {
    let wait = remaining.checked_sub(MARGIN)?;
    let share = u32::try_from(4 * (levels_below + 1)).unwrap_or(u32::MAX);
    let reserve = (wait / share).clamp(RESERVE_MIN, RESERVE_MAX);
    let grant = wait.checked_sub(reserve)?;
    (grant > MARGIN).then_some(CallTime { wait, grant })
}

/// The hops of a chain whose nodes are on `machines`, in order: one per run
/// of equal machines. A coordinator running the chain waits on that many
/// levels of calls.
pub fn hops(machines: impl IntoIterator<Item = u32>) -> usize {
    let mut count = 0;
    let mut last = None;
    for machine in machines {
        if last != Some(machine) {
            count += 1;
            last = Some(machine);
        }
    }
    count
}

/// A duration as whole microseconds for the wire.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_calls_give_up_before_outer_ones() {
        // Follow a chain of 20 hops down from a 5 s budget: every callee's
        // own wait ends before its caller's wait does.
        let mut remaining = Duration::from_secs(5);
        for levels_below in (0..20).rev() {
            let call = split(remaining, levels_below).expect("time is left");
            assert!(call.grant < call.wait && call.wait < remaining);
            let inner = split(call.grant, levels_below.saturating_sub(1));
            if let Some(inner) = inner {
                assert!(inner.wait + MARGIN <= call.wait);
            }
            remaining = call.grant;
        }
        assert!(
            remaining > Duration::from_secs(1),
            "{remaining:?} left at the end"
        );
    }

    #[test]
    fn no_time_no_call() {
        assert_eq!(split(Duration::from_millis(3), 0), None);
        assert_eq!(split(Duration::from_millis(12), 0), None);
        assert!(split(Duration::from_millis(30), 0).is_some());
    }
}
