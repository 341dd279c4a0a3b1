//! The client thread: its one connection to the master, re-established after
//! a failure, and the calls it runs on it for the [`Client`](super::Client).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc as tokio_mpsc;

use crate::bitfold_capnp::{
    Format as WireFormat, master, move_outcome, outcome, result, update_outcome, vid_vector,
};
use crate::net::{self, Connection};
use crate::tls::{Role, Tls};

use super::{Answer, Error, Format, MoveProgress, PlacementReport, SlaveStatus, Status};
use crate::status::unix_seconds;

/// Where the client thread sends a call's result.
pub(super) type Reply<T> = mpsc::SyncSender<Result<T, Error>>;

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
    addr: String,
    tls: Option<Tls>,
    mut inbox: tokio_mpsc::UnboundedReceiver<(Call, Duration)>,
    ready: mpsc::SyncSender<Result<(), Error>>,
) {
    let ran = net::block_on_local(async move {
        let link = Rc::new(Link::new(addr, tls));
        let first = link.connect().await;
        let failed = first.is_err();
        let _ = ready.send(first);
        if failed {
            return;
        }
        while let Some((call, timeout)) = inbox.recv().await {
            let link = link.clone();
            tokio::task::spawn_local(async move { link.run(call, timeout).await });
        }
    });
    if let Err(err) = ran {
        tracing::error!("the client thread could not start its runtime: {err}");
    }
}

/// The connection to the master, re-established after a failure.
pub(super) struct Link {
    addr: String,
    tls: Option<Tls>,
    connection: RefCell<Option<Rc<Connection<master::Client>>>>,
}

impl Link {
    /// A link to the master at `addr`, not connected yet.
    pub(super) fn new(addr: String, tls: Option<Tls>) -> Link {
        Link {
            addr,
            tls,
            connection: RefCell::new(None),
        }
    }

    /// Connects, unless connected already.
    pub(super) async fn connect(&self) -> Result<(), Error> {
        self.client().await.map(|_| ())
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

    /// Runs `call`, giving up after `timeout`, and sends its result to the call's reply.
    pub(super) async fn run(&self, call: Call, timeout: Duration) {
        match call {
            Call::Query {
                message,
                format,
                reply,
            } => {
                let answer = self.within(timeout, self.query(&message, format)).await;
                let _ = reply.send(answer);
            }
            Call::Import { message, reply } => {
                let _ = reply.send(self.within(timeout, self.import(message)).await);
            }
            Call::Status { reply } => {
                let _ = reply.send(self.within(timeout, self.status()).await);
            }
            Call::Clear { message, reply } => {
                let _ = reply.send(self.within(timeout, self.clear(message)).await);
            }
            Call::Delete { spans, reply } => {
                let _ = reply.send(self.within(timeout, self.delete(&spans)).await);
            }
            Call::Rebalance { most, reply } => {
                let _ = reply.send(self.within(timeout, self.rebalance(most)).await);
            }
            Call::Placement { reply } => {
                let _ = reply.send(self.within(timeout, self.placement()).await);
            }
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
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
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
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
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
            let master = response.get()?.get_certificate_not_after();
            Ok(Status {
                slaves: list,
                master_certificate_expires: unix_seconds(master),
            })
        })();
        status.map_err(Error::unreadable)
    }
}

/// Copies the vectors of `message` into a request with `set`, then frees
/// the message.
fn copy_vectors(
    message: capnp::message::Builder<capnp::message::HeapAllocator>,
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
