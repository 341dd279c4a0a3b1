//! The history of a run: every operation with its start and end on one
//! monotonic clock shared by the threads, and what came of it.

use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

use bitfold_client::{Error, ErrorKind};

use super::layout::Layout;

/// What an operation did or asked.
#[derive(Debug, Clone)]
pub enum Action {
    /// OR `mask` into each `(vid, mask)`.
    Import(Vec<(u64, u64)>),
    /// Clear `mask` from each `(vid, mask)` that exists.
    Clear(Vec<(u64, u64)>),
    /// Delete every vector in the inclusive spans.
    Delete(Vec<(u64, u64)>),
    /// `P:vid`.
    Point(u64),
    /// `R:`: the AND over terms of the OR of each term's spans.
    Range(Vec<Vec<(u64, u64)>>),
    /// A `rebalance` step or run.
    Rebalance,
    /// A fault of the nemesis, described.
    Fault(String),
}

impl Action {
    /// Whether the action changes vectors.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Action::Import(_) | Action::Clear(_) | Action::Delete(_)
        )
    }

    /// Whether the action writes or reads `vid` itself (a range counts when
    /// one of its spans holds it).
    pub fn touches(&self, vid: u64) -> bool {
        let within = |spans: &[(u64, u64)]| spans.iter().any(|&(a, b)| a <= vid && vid <= b);
        match self {
            Action::Import(v) | Action::Clear(v) => v.iter().any(|&(x, _)| x == vid),
            Action::Delete(spans) => within(spans),
            Action::Point(v) => *v == vid,
            Action::Range(terms) => terms.iter().any(|t| within(t)),
            Action::Rebalance | Action::Fault(_) => false,
        }
    }

    /// The query text of a read.
    pub fn query(&self) -> String {
        match self {
            Action::Point(v) => format!("P:{v}"),
            Action::Range(terms) => {
                let terms: Vec<String> = terms
                    .iter()
                    .map(|spans| {
                        spans
                            .iter()
                            .copied()
                            .map(crate::util::span_text)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .collect();
                format!("R:{}", terms.join("&"))
            }
            _ => String::new(),
        }
    }
}

/// A vector as a read saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// `notFound`: the vector does not exist.
    Missing,
    /// The bits, all below 64.
    Bits(u64),
    /// Positions of which some hold no bit of a run (as the layout writes
    /// them): never written, always wrong.
    Beyond(Vec<u32>),
}

impl Seen {
    /// The vector holding bits at `positions`, as `layout` writes a run's bits.
    pub fn of(layout: Layout, positions: impl IntoIterator<Item = u32>) -> Seen {
        let positions: Vec<u32> = positions.into_iter().collect();
        let bits: Option<Vec<u32>> = positions.iter().map(|&p| layout.bit(p)).collect();
        match bits {
            Some(bits) => Seen::Bits(bits.iter().fold(0, |m, &b| m | 1 << b)),
            None => Seen::Beyond(positions),
        }
    }
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seen::Missing => write!(f, "absent"),
            Seen::Bits(m) => write!(f, "{}", bits(*m)),
            Seen::Beyond(b) => write!(f, "bits {b:?}"),
        }
    }
}

/// What came of an operation.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A write the master acknowledged; a fault or rebalance that worked.
    Done,
    /// A write the master refused before changing anything.
    Refused(String),
    /// An update the master recorded and will complete (docs/protocol.md §8),
    /// not yet applied everywhere: it takes effect, later perhaps.
    Recorded(String),
    /// A write that may have taken effect or not (some owners may keep it):
    /// a timeout, a lost connection, an error that does not say nothing changed.
    Unknown(String),
    /// A read's answer.
    Read(Seen),
    /// A read, fault or rebalance that failed: always allowed of a read.
    Failed(String),
}

/// One operation: who did it, when (nanoseconds on the run's clock), and how it ended.
#[derive(Debug, Clone)]
pub struct Op {
    /// Its place in the history, by start.
    pub id: usize,
    /// The thread: `writer`, `reader0`, `nemesis`, `final`...
    pub who: &'static str,
    /// What it did.
    pub action: Action,
    /// When it started.
    pub start: u64,
    /// When it ended.
    pub end: u64,
    /// What came of it.
    pub outcome: Outcome,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |t: u64| t as f64 / 1e6;
        write!(
            f,
            "#{} {:>8.1}-{:<8.1}ms {:<8} ",
            self.id,
            ms(self.start),
            ms(self.end),
            self.who
        )?;
        match &self.action {
            Action::Import(v) => write!(f, "import {}", masks(v))?,
            Action::Clear(v) => write!(f, "clear {}", masks(v))?,
            Action::Delete(spans) => write!(f, "delete {spans:?}")?,
            Action::Point(_) | Action::Range(_) => write!(f, "{}", self.action.query())?,
            Action::Rebalance => write!(f, "rebalance")?,
            Action::Fault(what) => write!(f, "FAULT {what}")?,
        }
        match &self.outcome {
            Outcome::Done => write!(f, " -> ok"),
            Outcome::Refused(m) => write!(f, " -> refused (no effect): {m}"),
            Outcome::Recorded(m) => write!(f, " -> recorded, incomplete: {m}"),
            Outcome::Unknown(m) => write!(f, " -> unknown: {m}"),
            Outcome::Read(Seen::Missing) => write!(f, " -> not found"),
            Outcome::Read(seen) => write!(f, " -> {seen}"),
            Outcome::Failed(m) => write!(f, " -> error: {m}"),
        }
    }
}

/// `{1,5,9}`: the bits of a mask.
pub fn bits(mask: u64) -> String {
    let set: Vec<String> = (0..64)
        .filter(|b| mask >> b & 1 == 1)
        .map(|b| b.to_string())
        .collect();
    format!("{{{}}}", set.join(","))
}

/// A state of a vector: its bits, or `absent`.
pub fn state(s: Option<u64>) -> String {
    s.map_or_else(|| "absent".to_string(), bits)
}

fn masks(v: &[(u64, u64)]) -> String {
    let parts: Vec<String> = v
        .iter()
        .map(|&(vid, m)| format!("{vid}:{}", bits(m)))
        .collect();
    parts.join(" ")
}

/// The operations of a run, recorded by every thread against one clock.
pub struct Recorder {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Recorder {
        Recorder {
            t0: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Runs `body`, timing it, and records `action` with its outcome.
    pub fn record(
        &self,
        who: &'static str,
        action: Action,
        body: impl FnOnce() -> Outcome,
    ) -> Outcome {
        let start = self.now();
        let outcome = body();
        let end = self.now();
        self.ops.lock().unwrap().push(Op {
            id: 0,
            who,
            action,
            start,
            end,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// The operations so far, by start, numbered.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap().clone();
        ops.sort_by_key(|op| (op.start, op.end));
        for (i, op) in ops.iter_mut().enumerate() {
            op.id = i;
        }
        ops
    }
}

/// What a write's error says of its effect. The master's messages
/// (`rpc/server/src/master/update.rs`, docs/protocol.md §8): "nothing was
/// changed" is returned before any slave is sent the write; "the write is
/// recorded but not yet complete" is in the master's journal and rolled
/// forward; any other error, a lost connection or a timeout (the master may
/// have been killed during it) is [`Outcome::Unknown`]. A refused
/// connection means the request was never sent.
///
/// With several masters (docs/protocol.md §12): `notLeader` comes from a
/// master that changed nothing (it answers so before it looks at the
/// call), so it is [`Outcome::Refused`]; but a client given several
/// masters never returns it, it tries the next one. When no master took
/// the call for the whole failover window, the client's error is
/// `unavailable: no master leads: ...`, naming each master's last failure
/// only: an earlier try may have reached a leader that died or was
/// deposed during it (and the client sends a write again on the next
/// master after a lost connection), so it is [`Outcome::Unknown`], even
/// when every failure it names is a refusal.
pub fn write_outcome(err: &Error) -> Outcome {
    let text = err.to_string();
    match err {
        Error::Query {
            kind: ErrorKind::BadQuery | ErrorKind::NotLeader,
            ..
        } => Outcome::Refused(text),
        Error::Query {
            kind: ErrorKind::Unavailable,
            message,
            ..
        } if message.starts_with("unavailable: no master leads") => Outcome::Unknown(text),
        Error::Query {
            kind: ErrorKind::Unavailable,
            message,
            ..
        } if message.contains("nothing was changed") => Outcome::Refused(text),
        Error::Query {
            kind: ErrorKind::Unavailable,
            message,
            ..
        } if message.contains("the write is recorded but not yet complete") => {
            Outcome::Recorded(text)
        }
        Error::Connect { reason, .. } if reason.starts_with("connection refused") => {
            Outcome::Refused(text)
        }
        _ => Outcome::Unknown(text),
    }
}
