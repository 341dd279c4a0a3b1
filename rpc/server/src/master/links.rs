//! How a master reaches the others of a replicated cluster: Raft's
//! messages (`bitfold_quorum::Transport`) carried in `Master.raft` calls,
//! over TLS when the cluster uses it (the other end must hold a master's
//! certificate). The connections live on a thread of their own, so a
//! master waiting for a majority never holds up the messages that make it.

use std::collections::HashMap;
use std::time::Duration;

use bitfold_quorum::Transport;
use bitfold_quorum::network::Sent;
use tokio::sync::{mpsc, oneshot};

use crate::bitfold_capnp::master;
use crate::net::{self, Connection};
use crate::tls::{Role, Tls};

/// One message to send, and where its answer goes.
struct Outgoing {
    addr: String,
    message: Vec<u8>,
    timeout: Duration,
    answer: oneshot::Sender<Result<Vec<u8>, String>>,
}

/// The links to the other masters: a queue to the thread that holds them.
pub(super) struct Links {
    queue: mpsc::UnboundedSender<Outgoing>,
}

impl Links {
    /// Starts the thread that sends to the other masters (with `tls`).
    pub(super) fn start(tls: Option<Tls>) -> std::io::Result<Links> {
        let (queue, outgoing) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("master-links".into())
            .spawn(move || {
                if let Err(e) = net::block_on_local(send_all(outgoing, tls)) {
                    tracing::error!("the links to the other masters stopped: {e}");
                }
            })?;
        Ok(Links { queue })
    }
}

impl Transport for Links {
    fn send(&self, addr: &str, message: Vec<u8>, timeout: Duration) -> Sent {
        let (answer, answered) = oneshot::channel();
        let queued = self.queue.send(Outgoing {
            addr: addr.to_owned(),
            message,
            timeout,
            answer,
        });
        Box::pin(async move {
            queued.map_err(|_| "this master is stopping".to_owned())?;
            answered
                .await
                .unwrap_or_else(|_| Err("this master is stopping".to_owned()))
        })
    }
}

/// Sends each message on its own task, over one connection per master,
/// opened when first needed and again after one fails.
async fn send_all(mut outgoing: mpsc::UnboundedReceiver<Outgoing>, tls: Option<Tls>) {
    let open: std::rc::Rc<
        std::cell::RefCell<HashMap<String, std::rc::Rc<Connection<master::Client>>>>,
    > = Default::default();
    while let Some(out) = outgoing.recv().await {
        let open = open.clone();
        let tls = tls.clone();
        tokio::task::spawn_local(async move {
            let sent = tokio::time::timeout(out.timeout, async {
                let existing = open.borrow().get(&out.addr).cloned();
                let link = match existing {
                    Some(link) if !link.is_closed() => link,
                    _ => {
                        let link = net::connect(
                            &out.addr,
                            net::Sent::default(),
                            tls.as_ref(),
                            Role::Master,
                        )
                        .await
                        .map_err(|e| format!("cannot connect: {e}"))?;
                        let link = std::rc::Rc::new(link);
                        open.borrow_mut().insert(out.addr.clone(), link.clone());
                        link
                    }
                };
                let mut request = link.client.raft_request();
                request.get().set_request(&out.message);
                let reply = request.send().promise.await.map_err(|e| e.to_string())?;
                let reply = reply
                    .get()
                    .and_then(|r| r.get_reply())
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(reply.to_vec())
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", out.timeout)));
            if sent.is_err() {
                open.borrow_mut().remove(&out.addr);
            }
            let _ = out.answer.send(sent);
        });
    }
}
