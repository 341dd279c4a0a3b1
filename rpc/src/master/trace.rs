//! What the master saw of one query: its kind, and each attempt's plan,
//! outcome and time. Counted in the metrics when the query ends, and
//! logged once (one `warn` line) when it took at least
//! [`super::MasterOptions::slow`].

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use crate::client::ErrorKind;
use crate::metrics::{MasterMetrics, QueryKind, outcome_label};

/// The most bytes of a query's text a slow-query line shows.
const SHOWN_QUERY_BYTES: usize = 200;

/// One query's record, from its arrival.
pub(super) struct Trace {
    started: Instant,
    kind: Cell<QueryKind>,
    /// Each attempt's plan and, once it ended, how.
    attempts: RefCell<Vec<String>>,
    /// When the attempt not ended yet began.
    open: Cell<Option<Instant>>,
}

impl Trace {
    /// A record of a query arriving now (of unknown kind until parsed).
    pub(super) fn new() -> Trace {
        Trace {
            started: Instant::now(),
            kind: Cell::new(QueryKind::Unparsed),
            attempts: RefCell::new(Vec::new()),
            open: Cell::new(None),
        }
    }

    /// Records what the query parsed as.
    pub(super) fn kind(&self, kind: QueryKind) {
        self.kind.set(kind);
    }

    /// Records an attempt that is about to call a slave, and its plan.
    pub(super) fn begin(&self, plan: String) {
        self.attempts.borrow_mut().push(plan);
        self.open.set(Some(Instant::now()));
    }

    /// Records how the attempt begun last ended (nothing if none is open).
    pub(super) fn end(&self, how: &str) {
        if let Some(began) = self.open.take()
            && let Some(last) = self.attempts.borrow_mut().last_mut()
        {
            last.push_str(&format!(": {how} after {}", millis(began.elapsed())));
        }
    }

    /// Counts the query in `metrics` and, if it took at least `slow`, logs
    /// it: its text (cut to 200 bytes), kind, outcome, the bytes of the
    /// answer (`answer_bytes` is asked only then), the total time and every
    /// attempt's plan.
    pub(super) fn finish(
        &self,
        metrics: &MasterMetrics,
        slow: Option<Duration>,
        message: &[u8],
        outcome: Result<(), ErrorKind>,
        answer_bytes: impl FnOnce() -> u64,
    ) {
        self.end("cut off by the query timeout");
        let took = self.started.elapsed();
        let kind = self.kind.get();
        metrics.query(kind, outcome, took.as_secs_f64());
        if slow.is_none_or(|slow| took < slow) {
            return;
        }
        let shown = &message[..message.len().min(SHOWN_QUERY_BYTES)];
        let attempts = self.attempts.borrow();
        let plan = if attempts.is_empty() {
            "no slave was called".to_owned()
        } else {
            attempts
                .iter()
                .enumerate()
                .map(|(i, attempt)| format!("attempt {}: {attempt}", i + 1))
                .collect::<Vec<_>>()
                .join("; ")
        };
        tracing::warn!(
            query = %String::from_utf8_lossy(shown),
            kind = kind.label(),
            outcome = outcome_label(outcome),
            answer_bytes = answer_bytes(),
            took = %millis(took),
            plan = %plan,
            "slow query"
        );
    }
}

/// Names the machine runs of a chain: `s0 (3 vids) -> s2 (1 vid)`.
pub(super) fn describe_chain(chain: &[(u32, u64)], name: impl Fn(usize) -> String) -> String {
    chain
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| {
            let vids = run.len();
            let plural = if vids == 1 { "" } else { "s" };
            format!("{} ({vids} vid{plural})", name(run[0].0 as usize))
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

fn millis(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_named_by_its_runs_of_machines() {
        let chain = [(0, 10), (0, 11), (0, 12), (2, 13), (0, 14)];
        let text = describe_chain(&chain, |i| format!("s{i}"));
        assert_eq!(text, "s0 (3 vids) -> s2 (1 vid) -> s0 (1 vid)");
    }

    #[test]
    fn an_attempt_ends_once() {
        let trace = Trace::new();
        trace.end("answered");
        trace.begin("coordinator s1".into());
        trace.end("answered");
        trace.end("answered");
        let attempts = trace.attempts.borrow();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].matches("answered").count(), 1, "{attempts:?}");
    }
}
