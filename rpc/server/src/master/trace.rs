//! What the master saw of one query: its kind, each attempt's plan,
//! outcome and time, and the hops its machines reported. Counted in the
//! metrics when the query ends, and logged once (one `warn` line) when it
//! took at least [`super::MasterOptions::slow`].

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::bitfold_capnp::HopKind;
use crate::chain::Node;
use crate::hop::Hop;
use crate::metrics::{MasterMetrics, QueryKind, outcome_label};
use bitfold_proto::ErrorKind;

use super::layout::Layout;

/// The most bytes of a query's text a slow-query line shows.
const SHOWN_QUERY_BYTES: usize = 200;

/// One query's record, from its arrival.
pub(super) struct Trace {
    started: Instant,
    /// Whether the query may be logged as slow: only then are the plans
    /// and outcomes of its attempts put in words.
    logged: bool,
    kind: Cell<QueryKind>,
    /// Each attempt's plan and, once it ended, how (empty unless `logged`).
    attempts: RefCell<Vec<String>>,
    /// When the attempt not ended yet began.
    open: Cell<Option<Instant>>,
    /// The hops each attempt that reported any reported.
    hops: RefCell<Vec<Reported>>,
}

/// What one attempt's coordinator reported, kept as it came: it is
/// described only if the query is logged.
struct Reported {
    /// The attempt, counted from 1.
    attempt: usize,
    /// Its hops, or why they could not be read.
    hops: Result<Vec<Hop>, String>,
    /// The layout the attempt's machine table was written from.
    layout: Rc<Layout>,
}

impl Reported {
    fn describe(&self) -> String {
        let described = match &self.hops {
            Ok(hops) => describe_hops(hops, |i| match self.layout.slaves().get(i) {
                Some(slave) => slave.name.clone(),
                None => format!("machine {i}"),
            }),
            Err(err) => format!("unreadable ({err})"),
        };
        format!("attempt {}: {described}", self.attempt)
    }
}

impl Trace {
    /// A record of a query arriving now (of unknown kind until parsed);
    /// `logged` when the master logs slow queries.
    pub(super) fn new(logged: bool) -> Trace {
        Trace {
            started: Instant::now(),
            logged,
            kind: Cell::new(QueryKind::Unparsed),
            attempts: RefCell::new(Vec::new()),
            open: Cell::new(None),
            hops: RefCell::new(Vec::new()),
        }
    }

    /// A record for one piece of the query, answered beside the others;
    /// [`Trace::absorb`] takes it back once the piece is answered.
    pub(super) fn piece(&self) -> Trace {
        Trace::new(self.logged)
    }

    /// Takes in the attempts and hops of a piece's record, each attempt
    /// named by its `piece` where the cluster cuts vectors.
    pub(super) fn absorb(&self, piece: Option<u32>, record: Trace) {
        let before = self.attempts.borrow().len();
        let named = |text: String| match piece {
            Some(piece) if self.logged => format!("piece {piece}, {text}"),
            _ => text,
        };
        let attempts = record.attempts.into_inner();
        self.attempts
            .borrow_mut()
            .extend(attempts.into_iter().map(named));
        self.hops
            .borrow_mut()
            .extend(record.hops.into_inner().into_iter().map(|mut reported| {
                reported.attempt += before;
                reported
            }));
    }

    /// Records what the query parsed as.
    pub(super) fn kind(&self, kind: QueryKind) {
        self.kind.set(kind);
    }

    /// Records an attempt that is about to call a slave, and its plan
    /// (`plan` is asked only when the query may be logged).
    pub(super) fn begin(&self, plan: impl FnOnce() -> String) {
        if !self.logged {
            self.attempts.borrow_mut().push(String::new());
            return;
        }
        self.attempts.borrow_mut().push(plan());
        self.open.set(Some(Instant::now()));
    }

    /// Records the hops the attempt begun last reported (or why they could
    /// not be read), its machine table written from `layout`.
    pub(super) fn hops(&self, reported: capnp::Result<Vec<Hop>>, layout: Rc<Layout>) {
        if reported.as_ref().is_ok_and(Vec::is_empty) {
            return;
        }
        self.hops.borrow_mut().push(Reported {
            attempt: self.attempts.borrow().len(),
            hops: reported.map_err(|err| err.to_string()),
            layout,
        });
    }

    /// Records how the attempt begun last ended (nothing if none is open;
    /// `how` is asked only when the query may be logged).
    pub(super) fn end(&self, how: impl FnOnce() -> String) {
        if let Some(began) = self.open.take()
            && let Some(last) = self.attempts.borrow_mut().last_mut()
        {
            last.push_str(&format!(": {} after {}", how(), millis(began.elapsed())));
        }
    }

    /// Counts the query in `metrics` and, if it took at least `slow`, logs
    /// it: its text (cut to 200 bytes), kind, outcome, the bytes of the
    /// answer (`answer_bytes` is asked only then), the total time, every
    /// attempt's plan and the hops reported.
    pub(super) fn finish(
        &self,
        metrics: &MasterMetrics,
        slow: Option<Duration>,
        message: &[u8],
        outcome: Result<(), ErrorKind>,
        answer_bytes: impl FnOnce() -> u64,
    ) {
        self.end(|| "cut off by the query timeout".to_owned());
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
        let hops = self.hops.borrow();
        let hops = if hops.is_empty() {
            "none reported".to_owned()
        } else {
            let described: Vec<String> = hops.iter().map(Reported::describe).collect();
            described.join("; ")
        };
        tracing::warn!(
            query = %String::from_utf8_lossy(shown),
            kind = kind.label(),
            outcome = outcome_label(outcome),
            answer_bytes = answer_bytes(),
            took = %millis(took),
            plan = %plan,
            hops = %hops,
            "slow query"
        );
    }
}

/// Names the machine runs of a chain: `s0 (3 vids) -> s2 (1 vid)`.
pub(super) fn describe_chain(chain: &[Node], name: impl Fn(usize) -> String) -> String {
    chain
        .chunk_by(|a, b| a.machine == b.machine)
        .map(|run| {
            let vids: u64 = run.iter().map(|node| node.run.count()).sum();
            let plural = if vids == 1 { "" } else { "s" };
            format!("{} ({vids} vid{plural})", name(run[0].machine as usize))
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// Names each hop's machine and says what it did:
/// `s0 handle term 1 (3 vids, read 24576 B, sent 8192 B, 0.120 ms), s1 and (...)`.
fn describe_hops(hops: &[Hop], name: impl Fn(usize) -> String) -> String {
    hops.iter()
        .map(|hop| {
            let what = match hop.kind {
                HopKind::Handle => format!("handle term {}", u64::from(hop.term) + 1),
                HopKind::Gather => "gather".to_owned(),
                HopKind::And => "and".to_owned(),
            };
            let vids = match (hop.kind, hop.vids) {
                (HopKind::And, _) => String::new(),
                (_, 1) => "1 vid, ".to_owned(),
                (_, n) => format!("{n} vids, "),
            };
            format!(
                "{} {what} ({vids}read {} B, sent {} B, {})",
                name(hop.machine as usize),
                hop.read_bytes,
                hop.sent_bytes,
                millis(Duration::from_micros(hop.micros))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn millis(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_named_by_its_runs_of_machines() {
        let node = |machine, first, last| Node {
            machine,
            run: crate::chain::VidRun { first, last },
        };
        let chain = [
            node(0, 10, 11),
            node(0, 12, 12),
            node(2, 13, 13),
            node(0, 14, 14),
        ];
        let text = describe_chain(&chain, |i| format!("s{i}"));
        assert_eq!(text, "s0 (3 vids) -> s2 (1 vid) -> s0 (1 vid)");
    }

    #[test]
    fn hops_are_named_by_machine_with_their_bytes_and_time() {
        let hop = |machine, kind, term, vids| Hop {
            machine,
            kind,
            term,
            vids,
            read_bytes: 100 * vids,
            sent_bytes: 40,
            micros: 1500,
        };
        let hops = [
            hop(0, HopKind::Handle, 1, 3),
            hop(2, HopKind::Gather, 0, 1),
            hop(1, HopKind::And, 0, 0),
        ];
        let text = describe_hops(&hops, |i| format!("s{i}"));
        assert_eq!(
            text,
            "s0 handle term 2 (3 vids, read 300 B, sent 40 B, 1.500 ms), \
             s2 gather (1 vid, read 100 B, sent 40 B, 1.500 ms), \
             s1 and (read 0 B, sent 40 B, 1.500 ms)"
        );
    }

    #[test]
    fn hops_are_logged_under_the_attempt_that_reported_them() {
        let layout = Rc::new(Layout {
            current: crate::local::loopback(3, 1),
            target: None,
        });
        let trace = Trace::new(true);
        trace.begin(|| "coordinator s1".into());
        trace.hops(Ok(Vec::new()), layout.clone());
        trace.end(|| "failed: s0 (refused)".into());
        trace.begin(|| "coordinator s2".into());
        let hop = Hop {
            machine: 2,
            kind: HopKind::And,
            term: 0,
            vids: 0,
            read_bytes: 8,
            sent_bytes: 8,
            micros: 1,
        };
        trace.hops(Ok(vec![hop, Hop { machine: 7, ..hop }]), layout);
        trace.end(|| "answered".into());
        let hops: Vec<String> = trace.hops.borrow().iter().map(Reported::describe).collect();
        assert_eq!(hops.len(), 1, "an attempt without hops adds none: {hops:?}");
        assert!(hops[0].starts_with("attempt 2: s2 and ("), "{hops:?}");
        assert!(hops[0].contains("machine 7 and ("), "{hops:?}");
    }

    #[test]
    fn an_attempt_ends_once() {
        let trace = Trace::new(true);
        trace.end(|| "answered".into());
        trace.begin(|| "coordinator s1".into());
        trace.end(|| "answered".into());
        trace.end(|| "answered".into());
        let attempts = trace.attempts.borrow();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].matches("answered").count(), 1, "{attempts:?}");
    }
}
