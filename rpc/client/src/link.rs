//! The client thread, and the connection to the master it runs calls on:
//! re-established after a failure and, given several masters, moved to
//! the next one (or the leader one names) when a master is down or not the
//! leader, for the [`Client`](super::Client) and the
//! [`LocalClient`](super::LocalClient).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc as tokio_mpsc;

use crate::bitfold_capnp::{
    Format as WireFormat, master, move_outcome, outcome, result, update_outcome, vid_vector,
};
use crate::net::{self, Connection};
use crate::tls::{Role, Tls};

use super::{
    Answer, DEFAULT_FAILOVER, DEFAULT_TIMEOUT, Error, ErrorKind, Format, MasterState, MoveProgress,
    PlacementReport, SlaveStatus, Status,
};
use crate::error::START_HINT;
use crate::status::unix_seconds;

/// Where the client thread sends a call's result.
pub(super) type Reply<T> = mpsc::SyncSender<Result<T, Error>>;

/// The pause after every master has been tried once in turn, while none
/// leads: an election takes about a second.
const PAUSE: Duration = Duration::from_millis(150);

/// How long a client given several masters waits for `status` to learn
/// which leads.
const LEADER_CHECK: Duration = Duration::from_secs(2);

/// How long a call waits: for one master's answer, and for some master to
/// lead when there are several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Patience {
    /// How long one master may take to answer.
    pub(super) timeout: Duration,
    /// How long the masters are tried in turn, from the call's first failure.
    pub(super) failover: Duration,
}

impl Default for Patience {
    fn default() -> Patience {
        Patience {
            timeout: DEFAULT_TIMEOUT,
            failover: DEFAULT_FAILOVER,
        }
    }
}

/// One call from the [`Client`](super::Client) to its thread.
pub(super) enum Call {
    Query {
        message: String,
        format: Format,
        reply: Reply<Answer>,
    },
    Import {
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
        reply: Reply<()>,
    },
    Status {
        reply: Reply<Status>,
    },
    Clear {
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
        reply: Reply<u64>,
    },
    Delete {
        spans: Vec<(u64, u64)>,
        reply: Reply<u64>,
    },
    Rebalance {
        most: u32,
        reply: Reply<MoveProgress>,
    },
    Placement {
        reply: Reply<PlacementReport>,
    },
}

/// The client thread: connects, reports, then serves calls until the
/// [`Client`](super::Client) is dropped.
pub(super) fn serve_calls(
    masters: String,
    tls: Option<Tls>,
    mut inbox: tokio_mpsc::UnboundedReceiver<(Call, Patience)>,
    ready: mpsc::SyncSender<Result<(), Error>>,
) {
    let ran = net::block_on_local(async move {
        let link = Rc::new(Link::new(&masters, tls));
        let first = link.connect().await;
        let failed = first.is_err();
        let _ = ready.send(first);
        if failed {
            return;
        }
        while let Some((call, patience)) = inbox.recv().await {
            let link = link.clone();
            tokio::task::spawn_local(async move { link.run(call, patience).await });
        }
    });
    if let Err(err) = ran {
        tracing::error!("the client thread could not start its runtime: {err}");
    }
}

/// The connection to the master: to one of them, when there are several.
pub(super) struct Link {
    /// Every master, in the order given.
    masters: Vec<MasterLink>,
    /// The one calls go to.
    current: Cell<usize>,
    /// Whether the leader was sought since calls last moved to a master.
    leader_sought: Cell<bool>,
}

impl Link {
    /// A link to the master at `masters` (`HOST:PORT`, or several separated
    /// by commas), not connected yet.
    pub(super) fn new(masters: &str, tls: Option<Tls>) -> Link {
        let listed: Vec<&str> = masters
            .split(',')
            .map(str::trim)
            .filter(|addr| !addr.is_empty())
            .collect();
        let addrs = if listed.len() > 1 {
            listed
        } else {
            vec![listed.first().copied().unwrap_or(masters)]
        };
        Link {
            masters: addrs
                .into_iter()
                .map(|addr| MasterLink::new(addr.to_owned(), tls.clone()))
                .collect(),
            current: Cell::new(0),
            leader_sought: Cell::new(false),
        }
    }

    /// Connects to a master, unless connected already.
    pub(super) async fn connect(&self) -> Result<(), Error> {
        self.answer(Patience::default(), |m| m.connect()).await
    }

    /// Given several masters, moves calls to the one that leads, as the
    /// master in use says, if it is one of them (by address): a follower
    /// sends every call on to the leader, one more hop each. A master that
    /// does not answer in time, or names no leader, changes nothing.
    async fn find_leader(&self) {
        let at = self.current.get();
        let master = &self.masters[at];
        let Ok(status) = master.within(LEADER_CHECK, master.status()).await else {
            return;
        };
        let leader = status
            .masters
            .iter()
            .find(|m| m.state == "leader")
            .and_then(|leader| self.masters.iter().position(|m| m.addr == leader.addr));
        if let Some(leader) = leader
            && self.current.get() == at
        {
            self.current.set(leader);
        }
    }

    /// Runs `call`, within `patience`, and sends its result to the call's reply.
    pub(super) async fn run(&self, call: Call, patience: Patience) {
        match call {
            Call::Query {
                message,
                format,
                reply,
            } => {
                let answer = self.answer(patience, |m| m.query(&message, format)).await;
                let _ = reply.send(answer);
            }
            Call::Import { message, reply } => {
                let _ = reply.send(self.answer(patience, |m| m.import(&message)).await);
            }
            Call::Status { reply } => {
                let _ = reply.send(self.answer(patience, |m| m.status()).await);
            }
            Call::Clear { message, reply } => {
                let _ = reply.send(self.answer(patience, |m| m.clear(&message)).await);
            }
            Call::Delete { spans, reply } => {
                let _ = reply.send(self.answer(patience, |m| m.delete(&spans)).await);
            }
            Call::Rebalance { most, reply } => {
                let _ = reply.send(self.answer(patience, |m| m.rebalance(most)).await);
            }
            Call::Placement { reply } => {
                let _ = reply.send(self.answer(patience, |m| m.placement()).await);
            }
        }
    }

    /// What `attempt` gets of the master in use: one master answering
    /// `notLeader` is asked again until `patience.failover` has passed. With several masters, a
    /// master down or not the leader is left for the next (or the leader it
    /// names) and the call sent again, every write being safe to repeat;
    /// once every master has failed in turn the masters are tried again
    /// after a [`PAUSE`], until `patience.failover` has passed since the
    /// first failure. Then the error is `unavailable`, naming each master
    /// tried and why it failed.
    async fn answer<'a, T, F>(
        &'a self,
        patience: Patience,
        attempt: impl Fn(&'a MasterLink) -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>>,
    {
        if let [only] = &self.masters[..] {
            // One master of several, given alone, sends calls on to the
            // leader; while none leads it answers `notLeader`, having done
            // nothing: asked again until one leads, within the window.
            let mut first_failure = None;
            loop {
                match only.within(patience.timeout, attempt(only)).await {
                    Err(Error::Query {
                        kind: ErrorKind::NotLeader,
                        ..
                    }) if first_failure.get_or_insert_with(Instant::now).elapsed()
                        < patience.failover =>
                    {
                        tokio::time::sleep(PAUSE).await;
                    }
                    answered => return answered,
                }
            }
        }
        let mut failures: Vec<Option<String>> = vec![None; self.masters.len()];
        let mut first_failure = None;
        let mut attempts = 0;
        loop {
            let at = self.current.get();
            let master = &self.masters[at];
            let err = match master.within(patience.timeout, attempt(master)).await {
                Err(err) if moves_on(&err) => err,
                answered => {
                    // First answered, or after a failover: perhaps by a follower.
                    if answered.is_ok() && !self.leader_sought.replace(true) {
                        self.find_leader().await;
                    }
                    return answered;
                }
            };
            let since = *first_failure.get_or_insert_with(Instant::now);
            let deadline = since + patience.failover;
            attempts += 1;
            failures[at] = Some(why(&err));
            // A leader named that has failed this call already (a follower
            // that still names a dead leader) is left for the next in turn.
            let leader = self.named_leader(&err).filter(|&l| failures[l].is_none());
            self.leave(at, leader);
            if attempts >= self.masters.len() && Instant::now() >= deadline {
                return Err(self.no_leader(&failures, since.elapsed()));
            }
            if attempts % self.masters.len() == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(PAUSE.min(left)).await;
            }
        }
    }

    /// Moves calls from master `at` to `leader`, or else to the next
    /// master, unless another call has moved them already.
    fn leave(&self, at: usize, leader: Option<usize>) {
        self.masters[at].disconnect();
        if self.current.get() == at {
            let next = leader
                .filter(|&l| l != at)
                .unwrap_or((at + 1) % self.masters.len());
            self.current.set(next);
            self.leader_sought.set(false);
        }
    }

    /// The master whose address a `notLeader` message names as the leader.
    fn named_leader(&self, err: &Error) -> Option<usize> {
        let Error::Query {
            kind: ErrorKind::NotLeader,
            message,
            ..
        } = err
        else {
            return None;
        };
        message
            .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')'))
            .find_map(|word| self.masters.iter().position(|m| m.addr == word))
    }

    /// The error of a call no master answered as the leader, after trying
    /// them for `tried_for`.
    fn no_leader(&self, failures: &[Option<String>], tried_for: Duration) -> Error {
        let tried: Vec<(&str, &str)> = self
            .masters
            .iter()
            .zip(failures)
            .filter_map(|(m, why)| Some((m.addr.as_str(), why.as_deref()?)))
            .collect();
        let each: Vec<String> = tried
            .iter()
            .map(|(addr, why)| format!("{addr}: {why}"))
            .collect();
        Error::Query {
            kind: ErrorKind::Unavailable,
            message: format!(
                "unavailable: no master leads: {} (tried for {}: start the masters that are \
                 down, or retry once one leads)",
                each.join("; "),
                net::seconds(tried_for)
            ),
            failed_machines: tried.iter().map(|(addr, _)| addr.to_string()).collect(),
        }
    }
}

/// Whether `err` says the master called cannot answer now, so that another
/// one may: it is down (or its address is wrong), or it is not the leader.
fn moves_on(err: &Error) -> bool {
    matches!(
        err,
        Error::Connect { .. }
            | Error::Query {
                kind: ErrorKind::NotLeader,
                ..
            }
    )
}

/// Why a master failed a call, in a few words.
fn why(err: &Error) -> String {
    match err {
        Error::Connect { reason, .. } => reason.strip_suffix(START_HINT).unwrap_or(reason).into(),
        other => other.to_string(),
    }
}

/// The connection to one master, re-established after a failure.
struct MasterLink {
    addr: String,
    tls: Option<Tls>,
    connection: RefCell<Option<Rc<Connection<master::Client>>>>,
}

impl MasterLink {
    /// A link to the master at `addr`, not connected yet.
    fn new(addr: String, tls: Option<Tls>) -> MasterLink {
        MasterLink {
            addr,
            tls,
            connection: RefCell::new(None),
        }
    }

    /// Connects, unless connected already.
    async fn connect(&self) -> Result<(), Error> {
        self.client().await.map(|_| ())
    }

    /// Drops the connection (calls under way keep it until they end).
    fn disconnect(&self) {
        *self.connection.borrow_mut() = None;
    }

    async fn client(&self) -> Result<Rc<Connection<master::Client>>, Error> {
        if let Some(connection) = self.connection.borrow().as_ref() {
            // A master that was restarted closed the old connection: reconnect.
            if !connection.is_closed() {
                return Ok(connection.clone());
            }
        }
        let connect = tokio::time::timeout(
            Duration::from_secs(10),
            net::connect(
                &self.addr,
                net::Sent::default(),
                self.tls.as_ref(),
                Role::Master,
            ),
        );
        let connection = match connect.await {
            Ok(Ok(connection)) => Rc::new(connection),
            // Not `HOST:PORT` (no port, a port above 65535): nothing to start.
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(Error::Connect {
                    addr: self.addr.clone(),
                    reason: format!("{} (give it as HOST:PORT)", net::describe_io(&err)),
                });
            }
            Ok(Err(err)) if net::is_handshake_failure(&err) => {
                return Err(Error::Connect {
                    addr: self.addr.clone(),
                    reason: err.to_string(),
                });
            }
            Ok(Err(err)) => return Err(self.connect_error(net::describe_io(&err))),
            Err(_) => return Err(self.connect_error("no answer within 10 s".into())),
        };
        *self.connection.borrow_mut() = Some(connection.clone());
        Ok(connection)
    }

    fn connect_error(&self, reason: String) -> Error {
        Error::unreachable(&self.addr, reason)
    }

    /// A failed call: drop the connection so the next call reconnects.
    fn lost(&self, err: capnp::Error) -> Error {
        *self.connection.borrow_mut() = None;
        // A master that is not the leader fails the calls whose results
        // have no error field (`status`, `placement`) with this text.
        let text = err.extra.strip_prefix("remote exception: ");
        let not_leader = ErrorKind::NotLeader.to_string();
        if let Some(text) = text.filter(|t| t.starts_with(&not_leader)) {
            return Error::Query {
                kind: ErrorKind::NotLeader,
                message: text.to_owned(),
                failed_machines: Vec::new(),
            };
        }
        match err.kind {
            // TLS 1.3 tells a client its certificate was refused only after
            // the handshake, so the refusal arrives as a lost connection.
            capnp::ErrorKind::Disconnected if err.extra.contains(net::HANDSHAKE_FAILED) => {
                Error::Connect {
                    addr: self.addr.clone(),
                    reason: err.extra,
                }
            }
            // A master with TLS closes a plain connection at its first
            // bytes: the client reads the end of the stream, or (when the
            // close found its bytes unread) a reset.
            capnp::ErrorKind::PrematureEndOfFile | capnp::ErrorKind::Disconnected
                if self.tls.is_none() && ended_unanswered(&err) =>
            {
                Error::Connect {
                    addr: self.addr.clone(),
                    reason: "the master closed the connection without answering (if it runs \
                             with --tls, pass --tls DIR)"
                        .into(),
                }
            }
            capnp::ErrorKind::Disconnected => {
                self.connect_error(format!("connection lost ({err})"))
            }
            _ => Error::Protocol(err.to_string()),
        }
    }

    /// `work`, or a connect error when the master does not answer in time.
    async fn within<T>(
        &self,
        timeout: Duration,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                *self.connection.borrow_mut() = None;
                Err(self.connect_error(format!("no answer within {}", net::seconds(timeout))))
            }
        }
    }

    async fn query(&self, message: &str, format: Format) -> Result<Answer, Error> {
        let connection = self.client().await?;
        let mut request = connection.client.query_request();
        request.get().set_message(message);
        request.get().set_format(match format {
            Format::Words => WireFormat::Words,
            Format::Roaring => WireFormat::Roaring,
            Format::Count => WireFormat::Count,
        });
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let which = (|| Ok(response.get()?.get_result()?.which()?))();
        match which.map_err(Error::unreadable)? {
            result::Words(words) => Ok(Answer::Words(net::keep_received(
                words.map_err(Error::unreadable)?,
            ))),
            result::Roaring(bytes) => Ok(Answer::Roaring(net::keep_received(
                bytes.map_err(Error::unreadable)?,
            ))),
            result::Count(count) => Ok(Answer::Count(count)),
            result::Error(error) => Err(Error::read(error.map_err(Error::unreadable)?)),
        }
    }

    async fn import(
        &self,
        message: &capnp::message::Builder<capnp::message::HeapAllocator>,
    ) -> Result<(), Error> {
        let connection = self.client().await?;
        let mut request = connection.client.import_request();
        copy_vectors(message, |vectors| request.get().set_vectors(vectors))?;
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let which = (|| Ok(response.get()?.get_outcome()?.which()?))();
        match which.map_err(Error::unreadable)? {
            outcome::Ok(()) => Ok(()),
            outcome::Error(error) => Err(Error::read(error.map_err(Error::unreadable)?)),
        }
    }

    async fn clear(
        &self,
        message: &capnp::message::Builder<capnp::message::HeapAllocator>,
    ) -> Result<u64, Error> {
        let connection = self.client().await?;
        let mut request = connection.client.clear_request();
        copy_vectors(message, |vectors| request.get().set_vectors(vectors))?;
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        update_changed(response.get().and_then(|r| r.get_outcome()))
    }

    async fn delete(&self, spans: &[(u64, u64)]) -> Result<u64, Error> {
        let connection = self.client().await?;
        let mut request = connection.client.delete_request();
        let mut list = request.get().init_spans(spans.len() as u32);
        for (i, &(first, last)) in spans.iter().enumerate() {
            let mut span = list.reborrow().get(i as u32);
            span.set_first(first);
            span.set_last(last);
        }
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        update_changed(response.get().and_then(|r| r.get_outcome()))
    }

    async fn rebalance(&self, most: u32) -> Result<MoveProgress, Error> {
        let connection = self.client().await?;
        let mut request = connection.client.rebalance_request();
        request.get().set_most(most);
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let which = (|| Ok(response.get()?.get_outcome()?.which()?))();
        match which.map_err(Error::unreadable)? {
            move_outcome::Progress(p) => {
                let p = p.map_err(Error::unreadable)?;
                Ok(MoveProgress {
                    done: p.get_done(),
                    total: p.get_total(),
                    copied: p.get_copied(),
                    copied_bytes: p.get_copied_bytes(),
                    removed: p.get_removed(),
                    finished: p.get_finished(),
                })
            }
            move_outcome::Error(error) => Err(Error::read(error.map_err(Error::unreadable)?)),
        }
    }

    async fn placement(&self) -> Result<PlacementReport, Error> {
        let connection = self.client().await?;
        let request = connection.client.placement_request();
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let read = (|| -> capnp::Result<PlacementReport> {
            let r = response.get()?.get_report()?;
            Ok(PlacementReport {
                vectors: r.get_vectors(),
                under_replicated: r.get_under_replicated(),
                lost: r.get_lost(),
                misplaced: r.get_misplaced(),
                moving: r.get_moving(),
            })
        })();
        read.map_err(Error::unreadable)
    }

    async fn status(&self) -> Result<Status, Error> {
        let connection = self.client().await?;
        let request = connection.client.status_request();
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let status = (|| -> capnp::Result<Status> {
            let list = response.get()?.get_slaves()?;
            crate::wire::check_sized(list, "slaves")?;
            let list = list
                .iter()
                .map(|s| {
                    let millis = s.get_since_unix_millis();
                    let since = if millis >= 0 {
                        SystemTime::UNIX_EPOCH + Duration::from_millis(millis as u64)
                    } else {
                        SystemTime::UNIX_EPOCH
                    };
                    let reason = s.get_reason()?.to_string()?;
                    Ok(SlaveStatus {
                        name: s.get_name()?.to_string()?,
                        addr: s.get_addr()?.to_string()?,
                        up: s.get_up(),
                        since,
                        vectors: s.get_vectors(),
                        bytes: s.get_bytes(),
                        read_bytes: s.get_read_bytes(),
                        sent_bytes: s.get_sent_bytes(),
                        reason: (!reason.is_empty()).then_some(reason),
                        certificate_expires: unix_seconds(s.get_certificate_not_after()),
                    })
                })
                .collect::<capnp::Result<_>>()?;
            let masters = response.get()?.get_masters()?;
            crate::wire::check_sized(masters, "masters")?;
            let masters = masters
                .iter()
                .map(|m| {
                    let reason = m.get_reason()?.to_string()?;
                    Ok(MasterState {
                        name: m.get_name()?.to_string()?,
                        addr: m.get_addr()?.to_string()?,
                        state: m.get_state()?.to_string()?,
                        log_index: m.get_log_index(),
                        applied: m.get_applied(),
                        term: m.get_term(),
                        reason: (!reason.is_empty()).then_some(reason),
                    })
                })
                .collect::<capnp::Result<_>>()?;
            let master = response.get()?.get_certificate_not_after();
            Ok(Status {
                slaves: list,
                masters,
                master_certificate_expires: unix_seconds(master),
            })
        })();
        status.map_err(Error::unreadable)
    }
}

/// Copies the vectors of `message` into a request with `set`.
fn copy_vectors(
    message: &capnp::message::Builder<capnp::message::HeapAllocator>,
    set: impl FnOnce(capnp::struct_list::Reader<'_, vid_vector::Owned>) -> capnp::Result<()>,
) -> Result<(), Error> {
    let vectors = message
        .get_root_as_reader()
        .map_err(|e| Error::Protocol(e.to_string()))?;
    set(vectors).map_err(|e| Error::Protocol(e.to_string()))
}

/// The count of an update's outcome, or its error.
fn update_changed(outcome: capnp::Result<update_outcome::Reader<'_>>) -> Result<u64, Error> {
    let which = outcome.and_then(|outcome| Ok(outcome.which()?));
    match which.map_err(Error::unreadable)? {
        update_outcome::Changed(changed) => Ok(changed),
        update_outcome::Error(error) => Err(Error::read(error.map_err(Error::unreadable)?)),
    }
}

/// Whether `err` is the end of a connection the peer closed without
/// answering: the end of the stream, or a reset.
fn ended_unanswered(err: &capnp::Error) -> bool {
    err.kind == capnp::ErrorKind::PrematureEndOfFile || err.extra.contains("reset by peer")
}
