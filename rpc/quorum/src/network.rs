//! The messages between masters: Raft's requests (a vote, entries to
//! append, a snapshot's chunk) and their answers, encoded with postcard,
//! sent over a [`Transport`] the caller provides.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::AnyError;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::{Member, Records};

/// A message's answer, or why there is none (the master could not be
/// reached, or did not answer in time).
pub type Sent = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// How one master sends a message to another, at `addr`, and gets its
/// answer within `timeout`. bitfold's servers carry it in a `Master.raft`
/// call, over TLS when the cluster uses it.
pub trait Transport: Send + Sync + 'static {
    /// Sends `message` to the master at `addr`.
    fn send(&self, addr: &str, message: Vec<u8>, timeout: Duration) -> Sent;
}

/// A message from one master to another. Raft's name the id they are for:
/// a master that lost its data and joined again as a new member listens
/// where the member it was did, and must not answer for it.
#[derive(Serialize, Deserialize)]
pub(crate) enum Message {
    Vote(u64, VoteRequest<u64>),
    Append(u64, AppendEntriesRequest<Records>),
    Snapshot(u64, InstallSnapshotRequest<Records>),
    /// Whether the master holds a log (see `join`).
    Hello,
    /// Make the sender a member (see `join`).
    Join(crate::join::Join),
}

/// Its answer.
#[derive(Serialize, Deserialize)]
pub(crate) enum Reply {
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// The last entry of the master's log and more (see `join`).
    Hello(crate::join::Greeting),
    /// Whether the sender is a member now, or why not.
    Joined(Result<(), String>),
    /// The message could not be read, or is not for this master.
    Refused(String),
}

/// Makes a [`Peer`] for each master Raft talks to.
pub(crate) struct Network {
    pub(crate) transport: Arc<dyn Transport>,
    /// The most bytes a message of several entries may take.
    pub(crate) message_bytes: usize,
    /// Why each master could not be reached last (none once it answers).
    pub(crate) unreachable: Arc<Mutex<BTreeMap<u64, String>>>,
}

impl RaftNetworkFactory<Records> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &Member) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
            unreachable: self.unreachable.clone(),
            message_bytes: self.message_bytes,
        }
    }
}

/// Another master, as Raft sends to it.
pub(crate) struct Peer {
    target: u64,
    addr: String,
    transport: Arc<dyn Transport>,
    unreachable: Arc<Mutex<BTreeMap<u64, String>>>,
    message_bytes: usize,
}

type Failed<E = RaftError<u64>> = RPCError<u64, Member, E>;

/// The largest change one entry may carry: a message between masters is
/// one Cap'n Proto `Data`, under 512 MiB.
pub const CHANGE_BYTES: usize = 256 << 20;

fn encode<E: std::error::Error>(message: &Message) -> Result<Vec<u8>, Box<Failed<E>>> {
    postcard::to_stdvec(message).map_err(|e| {
        Box::new(Failed::Network(NetworkError::new(&AnyError::error(
            e.to_string(),
        ))))
    })
}

impl Peer {
    async fn send<E: std::error::Error>(
        &self,
        message: &Message,
        option: &RPCOption,
    ) -> Result<Reply, Failed<E>> {
        self.send_bytes(encode(message).map_err(|e| *e)?, option)
            .await
    }

    async fn send_bytes<E: std::error::Error>(
        &self,
        bytes: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Reply, Failed<E>> {
        let answer = self
            .transport
            .send(&self.addr, bytes, option.hard_ttl())
            .await;
        let mut unreachable = self
            .unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let answer = match answer {
            Ok(answer) => {
                unreachable.remove(&self.target);
                answer
            }
            Err(e) => {
                unreachable.insert(self.target, e.clone());
                return Err(Failed::Unreachable(Unreachable::new(&AnyError::error(e))));
            }
        };
        drop(unreachable);
        match postcard::from_bytes(&answer) {
            Ok(Reply::Refused(why)) => {
                Err(self.malformed(format!("it refused the message: {why}")))
            }
            Ok(reply) => Ok(reply),
            Err(e) => Err(self.malformed(format!("its answer is malformed: {e}"))),
        }
    }

    fn malformed<E: std::error::Error>(&self, why: String) -> Failed<E> {
        Failed::Network(NetworkError::new(&AnyError::error(format!(
            "master at {}: {why}",
            self.addr
        ))))
    }

    fn remote<E: std::error::Error>(&self, e: E) -> Failed<E> {
        Failed::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<Records> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Records>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, Failed> {
        let entries = rpc.entries.len() as u64;
        let bytes = encode(&Message::Append(self.target, rpc)).map_err(|e| *e)?;
        if bytes.len() > self.message_bytes && entries > 1 {
            return Err(PayloadTooLarge::new_entries_hint(entries / 2).into());
        }
        match self.send_bytes(bytes, &option).await? {
            Reply::Append(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(self.malformed("it answered another kind of message".into())),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<Records>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, Failed<RaftError<u64, InstallSnapshotError>>> {
        match self
            .send(&Message::Snapshot(self.target, rpc), &option)
            .await?
        {
            Reply::Snapshot(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(self.malformed("it answered another kind of message".into())),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, Failed> {
        match self.send(&Message::Vote(self.target, rpc), &option).await? {
            Reply::Vote(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(self.malformed("it answered another kind of message".into())),
        }
    }
}
