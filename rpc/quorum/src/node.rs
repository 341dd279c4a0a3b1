//! One master's Raft node ([`Quorum`]): its log and records directory
//! under the master's data directory, Raft running on a thread of its own,
//! and what it reports of every master.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bitfold_engine::store::{Directory, MmapDirectory};
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use tokio::sync::Notify;

use crate::directory::ReplicatedDirectory;
use crate::files::FileMachine;
use crate::log::LogStore;
use crate::network::{Message, Network, Reply, Transport};
use crate::{Records, member_id};

/// How one master of several runs its Raft node.
#[derive(Debug, Clone)]
pub struct QuorumOptions {
    /// This master's name in the cluster file.
    pub name: String,
    /// Every master of the cluster file: its name and address.
    pub masters: Vec<(String, String)>,
    /// The master's data directory: its Raft log goes in `raft/`, its
    /// copy of the records in `records/`.
    pub data_dir: PathBuf,
    /// How often the leader tells the others it leads (default 100 ms).
    pub heartbeat: Duration,
    /// How long a master waits without hearing from a leader before it
    /// stands for election: between this and twice this (default 600 ms).
    pub election_timeout: Duration,
    /// The longest a write waits for a majority of masters (default 10 s).
    pub write_timeout: Duration,
    /// A snapshot of the records is taken every this many log entries,
    /// and the log before it dropped (default 1000).
    pub snapshot_every: u64,
}

impl QuorumOptions {
    /// Options with the defaults for the timings.
    pub fn new(name: String, masters: Vec<(String, String)>, data_dir: PathBuf) -> QuorumOptions {
        QuorumOptions {
            name,
            masters,
            data_dir,
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(600),
            write_timeout: Duration::from_secs(10),
            snapshot_every: 1000,
        }
    }
}

/// One master's Raft node. Dropping it stops Raft.
pub struct Quorum {
    raft: Raft<Records>,
    runtime: Option<tokio::runtime::Runtime>,
    me: u64,
    /// Every master: its id, name and address.
    masters: Vec<(u64, String, String)>,
    records: Arc<dyn Directory>,
    machine: FileMachine,
    write_timeout: Duration,
    /// How often the leader tells the others it leads.
    heartbeat: Duration,
    /// Why each master Raft could not reach last failed (none once it answers).
    unreachable: Arc<Mutex<BTreeMap<u64, String>>>,
    /// Told when a write through [`Quorum::records`] failed: the master
    /// serving from them must start again from what is recorded.
    failed: Arc<Notify>,
}

/// How one master stands, as the master answering sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    /// Its name in the cluster file.
    pub name: String,
    /// Its address.
    pub addr: String,
    /// `leader`, `follower`, `learner` or `down`.
    pub state: &'static str,
    /// The last log entry it holds (as far as the leader knows, for another master).
    pub log_index: u64,
    /// Why it is down; empty otherwise.
    pub reason: String,
}

/// What a master's Raft node knows of every master.
#[derive(Debug, Clone)]
pub struct Standing {
    /// The term it is in.
    pub term: u64,
    /// The last entry it applied.
    pub applied: u64,
    /// Every master of the cluster file, in its order.
    pub masters: Vec<MemberState>,
}

impl Quorum {
    /// Opens the Raft node of master `options.name` and starts it; a new
    /// data directory starts a new cluster of every master of the file.
    pub fn open(options: QuorumOptions, transport: Arc<dyn Transport>) -> Result<Quorum, String> {
        let me = member_id(&options.name);
        let masters: Vec<(u64, String, String)> = options
            .masters
            .iter()
            .map(|(name, addr)| (member_id(name), name.clone(), addr.clone()))
            .collect();
        let raft_dir: Arc<dyn Directory> = Arc::new(
            MmapDirectory::open(options.data_dir.join("raft")).map_err(|e| e.to_string())?,
        );
        let records: Arc<dyn Directory> = Arc::new(
            MmapDirectory::open(options.data_dir.join("records")).map_err(|e| e.to_string())?,
        );
        let log = LogStore::open(raft_dir.clone())?;
        let new = log.is_new();
        let machine = FileMachine::open(records.clone(), raft_dir)?;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        let config = Config {
            cluster_name: "bitfold-masters".into(),
            heartbeat_interval: millis(options.heartbeat),
            election_timeout_min: millis(options.election_timeout),
            election_timeout_max: 2 * millis(options.election_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_every),
            max_in_snapshot_log_to_keep: options.snapshot_every / 10,
            ..Config::default()
        }
        .validate()
        .map_err(|e| format!("the Raft settings are inconsistent: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("raft")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the Raft thread: {e}"))?;
        let unreachable = Arc::new(Mutex::new(BTreeMap::new()));
        let network = Network {
            transport,
            unreachable: unreachable.clone(),
        };
        let raft = runtime
            .block_on(Raft::new(
                me,
                Arc::new(config),
                network,
                log,
                machine.clone(),
            ))
            .map_err(|e| format!("cannot start Raft: {e}"))?;
        if new {
            let members: BTreeMap<u64, BasicNode> = masters
                .iter()
                .map(|(id, _, addr)| (*id, BasicNode::new(addr)))
                .collect();
            match runtime.block_on(raft.initialize(members)) {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(format!("cannot start a new cluster of masters: {e}")),
            }
        }
        Ok(Quorum {
            raft,
            runtime: Some(runtime),
            me,
            masters,
            records,
            machine,
            write_timeout: options.write_timeout,
            heartbeat: options.heartbeat,
            unreachable,
            failed: Arc::new(Notify::new()),
        })
    }

    /// The records directory as the leader's master writes it: each write
    /// returns once a majority of masters holds it.
    pub fn records(&self) -> Arc<dyn Directory> {
        let handle = self
            .runtime
            .as_ref()
            .expect("the runtime lives as long as the node")
            .handle()
            .clone();
        Arc::new(ReplicatedDirectory::new(
            self.records.clone(),
            self.raft.clone(),
            handle,
            self.write_timeout,
            self.failed.clone(),
        ))
    }

    /// Answers a message another master sent (see [`Transport`]).
    pub async fn answer(&self, message: &[u8]) -> Vec<u8> {
        let reply = match postcard::from_bytes::<Message>(message) {
            Ok(Message::Vote(request)) => Reply::Vote(self.raft.vote(request).await),
            Ok(Message::Append(request)) => Reply::Append(self.raft.append_entries(request).await),
            Ok(Message::Snapshot(request)) => {
                Reply::Snapshot(self.raft.install_snapshot(request).await)
            }
            Err(e) => Reply::Refused(format!("malformed message: {e}")),
        };
        postcard::to_stdvec(&reply).unwrap_or_else(|e| {
            postcard::to_stdvec(&Reply::Refused(format!("cannot encode the answer: {e}")))
                .unwrap_or_default()
        })
    }

    /// Whether this master leads now.
    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.me)
    }

    /// Waits until this master leads and has applied every entry of its
    /// log (so every entry committed before it led): its records are then
    /// current, and nothing it proposed earlier can still change them. A
    /// leader whose write timed out (its master stopped serving) keeps that
    /// write's entry and commits it once a majority answers again: a master
    /// started before then would serve from records without it, and the
    /// entry would change them underneath (a pending write it never rolls
    /// forward, though a later start does).
    pub async fn leading(&self) {
        let mut metrics = self.raft.metrics();
        loop {
            // The guard `wait_for` returns locks the metrics: dropped at once,
            // or Raft could not publish them again.
            let leads = metrics
                .wait_for(|m| {
                    m.state == ServerState::Leader
                        && m.current_leader == Some(self.me)
                        && m.last_applied.as_ref().map(|l| l.index) >= m.last_log_index
                })
                .await
                .is_ok();
            if !leads {
                tracing::error!("Raft stopped on this master: restart it");
                return std::future::pending().await;
            }
            if self.raft.ensure_linearizable().await.is_ok() {
                return;
            }
            // No majority answered (they are down, or far): ask again after
            // a heartbeat. At once, it would spin, dialling the masters
            // that are down without a pause; each dial takes an ephemeral
            // port, and one may be a down master's own port, which a dial
            // to it then holds (TCP connects a port to itself), so that
            // master could not start again on its address.
            tokio::time::sleep(self.heartbeat).await;
        }
    }

    /// Waits until this master no longer leads, or a write through its
    /// records failed (the master must start again from what is recorded).
    pub async fn deposed(&self) {
        let mut metrics = self.raft.metrics();
        tokio::select! {
            _ = async { metrics.wait_for(|m| m.state != ServerState::Leader).await.is_ok() } => {}
            () = self.failed.notified() => {}
        }
    }

    /// Proves this master still leads (a majority answered it after the
    /// last write it applied): a query it answers then is current.
    pub async fn ensure_current(&self) -> Result<(), String> {
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The master that leads, by this master's knowledge: its name and address.
    pub fn leader(&self) -> Option<(String, String)> {
        let leader = self.raft.metrics().borrow().current_leader?;
        self.masters
            .iter()
            .find(|(id, _, _)| *id == leader)
            .map(|(_, name, addr)| (name.clone(), addr.clone()))
    }

    /// How every master stands, as this one sees it.
    pub fn standing(&self) -> Standing {
        let metrics = self.raft.metrics().borrow().clone();
        let voters: BTreeSet<u64> = metrics.membership_config.voter_ids().collect();
        let unreachable = self
            .unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let masters = self
            .masters
            .iter()
            .map(|(id, name, addr)| {
                let matched = metrics
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).copied().flatten())
                    .map(|l| l.index);
                let (state, reason) = if *id == self.me {
                    (own_state(metrics.state), String::new())
                } else if let Some(reason) = unreachable.get(id) {
                    ("down", reason.clone())
                } else if metrics.current_leader == Some(*id) {
                    ("leader", String::new())
                } else if voters.contains(id) {
                    ("follower", String::new())
                } else {
                    ("learner", String::new())
                };
                let log_index = if *id == self.me {
                    metrics.last_log_index.unwrap_or(0)
                } else {
                    matched.unwrap_or(0)
                };
                MemberState {
                    name: name.clone(),
                    addr: addr.clone(),
                    state,
                    log_index,
                    reason,
                }
            })
            .collect();
        Standing {
            term: metrics.current_term,
            applied: self.machine.applied(),
            masters,
        }
    }
}

fn own_state(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Learner => "learner",
        _ => "follower",
    }
}

impl Drop for Quorum {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            let raft = self.raft.clone();
            runtime.spawn(async move { raft.shutdown().await });
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
