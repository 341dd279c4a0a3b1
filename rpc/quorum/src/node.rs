//! One master's Raft node ([`Quorum`]): its log and records directory
//! under the master's data directory, Raft running on a thread of its own,
//! and what it reports of every master.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bitfold_engine::store::{Directory, MmapDirectory, write_sealed};
use openraft::error::{InitializeError, RaftError};
use openraft::{Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::directory::ReplicatedDirectory;
use crate::files::FileMachine;
use crate::log::LogStore;
use crate::network::{Message, Network, Reply, Transport};
use crate::{Member, REMOVE_THE_DATA, Records, join, member_id, read_kept};

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
    /// stands for election: between this and twice this (default 600 ms),
    /// after openraft's leader lease (twice this again) when it knew a
    /// leader, so about 1.8 to 2.4 s after a leader dies.
    pub election_timeout: Duration,
    /// The longest a write waits for a majority of masters (default 10 s).
    pub write_timeout: Duration,
    /// A snapshot of the records is taken every this many log entries,
    /// and the log before it dropped (default 1000).
    pub snapshot_every: u64,
    /// The most bytes one message of several entries takes; more are sent
    /// fewer at a time (default 2 MiB: a follower must write a message's
    /// entries within Raft's heartbeat interval).
    pub message_bytes: usize,
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
            message_bytes: 2 << 20,
        }
    }
}

/// One master's Raft node. Dropping it stops Raft.
pub struct Quorum {
    raft: Raft<Records>,
    runtime: Option<tokio::runtime::Runtime>,
    me: u64,
    records: Arc<dyn Directory>,
    machine: FileMachine,
    write_timeout: Duration,
    /// How often the leader tells the others it leads.
    heartbeat: Duration,
    /// How long after a majority answered it a leader answers queries
    /// without asking again (half the election timeout).
    lease: Duration,
    /// Why each master Raft could not reach last failed (none once it answers).
    unreachable: Arc<Mutex<BTreeMap<u64, String>>>,
    /// Told when a write through [`Quorum::records`] failed: the master
    /// serving from them must start again from what is recorded.
    failed: Arc<Notify>,
    /// The number this process drew, told in `hello` answers.
    process: u64,
    /// If this process founded the cluster: the masters it heard say their
    /// data directory was new before it did (see `join`).
    founded_with: Vec<(String, u64)>,
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
    /// Every master Raft's membership holds, by name.
    pub masters: Vec<MemberState>,
}

/// A master's Raft folder and records opened, before Raft runs: it can
/// already tell another master whether it holds a log ([`Opening::answer`]).
pub struct Opening {
    options: QuorumOptions,
    raft_dir: Arc<dyn Directory>,
    records: Arc<dyn Directory>,
    log: LogStore,
    machine: FileMachine,
    identity: Option<Identity>,
    /// The number this process drew, told in `hello` answers.
    process: u64,
}

impl Opening {
    /// Opens the Raft folder and records of master `options.name`; a
    /// damaged file is refused with an error naming it.
    pub fn open(options: QuorumOptions) -> Result<Opening, String> {
        let raft_dir: Arc<dyn Directory> = Arc::new(
            MmapDirectory::open(options.data_dir.join("raft")).map_err(|e| e.to_string())?,
        );
        let records: Arc<dyn Directory> = Arc::new(
            MmapDirectory::open(options.data_dir.join("records")).map_err(|e| e.to_string())?,
        );
        let log = LogStore::open(raft_dir.clone())?;
        let machine = FileMachine::open(records.clone(), raft_dir.clone())?;
        let identity = Identity::read(&*raft_dir, &options.name)?;
        Ok(Opening {
            options,
            raft_dir,
            records,
            log,
            machine,
            identity,
            process: join::process_number(),
        })
    }

    /// Answers a message another master sent while this one opens: only
    /// `hello` gets an answer.
    pub fn answer(&self, message: &[u8]) -> Vec<u8> {
        join::answer_hello(&self.log, self.process, message)
    }

    /// Starts Raft: as before for a master that ran; for a new data
    /// directory, as a new cluster of every master of the file if the
    /// other masters hold no log either (or as a founding member of a
    /// cluster founded after a founder heard this process), else as a new
    /// member joining the running cluster (it catches up from a snapshot).
    /// Blocks until Raft runs; call it off any async runtime.
    pub fn start(&self, transport: Arc<dyn Transport>) -> Result<Quorum, String> {
        let options = &self.options;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("raft")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the Raft thread: {e}"))?;
        let me = Member {
            name: options.name.clone(),
            addr: options
                .masters
                .iter()
                .find(|(name, _)| *name == options.name)
                .map(|(_, addr)| addr.clone())
                .ok_or_else(|| format!("master {} is not one of the masters", options.name))?,
        };
        let (identity, founded_with) = match self.identity {
            Some(identity) => (identity, None),
            None if !self.log.is_new() => (Identity::founding(&me.name), None),
            None => {
                match runtime.block_on(join::how_to_start(&*transport, options, self.process))? {
                    join::Start::Found(heard) => (Identity::founding(&me.name), Some(heard)),
                    join::Start::Founder => (Identity::founding(&me.name), None),
                    join::Start::Join => (Identity::joining(&me.name, self.process), None),
                }
            }
        };
        identity.write(&*self.raft_dir, &me.name)?;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        let config = Config {
            cluster_name: "bitfold-masters".into(),
            heartbeat_interval: millis(options.heartbeat),
            election_timeout_min: millis(options.election_timeout),
            election_timeout_max: 2 * millis(options.election_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_every),
            max_in_snapshot_log_to_keep: options.snapshot_every / 10,
            max_payload_entries: 64,
            ..Config::default()
        }
        .validate()
        .map_err(|e| format!("the Raft settings are inconsistent: {e}"))?;
        let unreachable = Arc::new(Mutex::new(BTreeMap::new()));
        let network = Network {
            transport: transport.clone(),
            unreachable: unreachable.clone(),
            message_bytes: options.message_bytes,
        };
        let raft = runtime
            .block_on(Raft::new(
                identity.id,
                Arc::new(config),
                network,
                self.log.clone(),
                self.machine.clone(),
            ))
            .map_err(|e| format!("cannot start Raft: {e}"))?;
        if founded_with.is_some() {
            let members: BTreeMap<u64, Member> = options
                .masters
                .iter()
                .map(|(name, addr)| {
                    let member = Member {
                        name: name.clone(),
                        addr: addr.clone(),
                    };
                    (member_id(name), member)
                })
                .collect();
            match runtime.block_on(raft.initialize(members)) {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(format!("cannot start a new cluster of masters: {e}")),
            }
        }
        if !identity.joined {
            let join = join::Join {
                id: identity.id,
                member: me.clone(),
                masters: options
                    .masters
                    .iter()
                    .map(|(name, _)| name.clone())
                    .collect(),
            };
            let raft_dir = self.raft_dir.clone();
            let others: Vec<String> = options
                .masters
                .iter()
                .filter(|(name, _)| *name != me.name)
                .map(|(_, addr)| addr.clone())
                .collect();
            runtime.spawn(async move {
                join::join(&*transport, &others, &join).await;
                let joined = Identity {
                    joined: true,
                    ..identity
                };
                if let Err(e) = joined.write(&*raft_dir, &join.member.name) {
                    tracing::error!("{e}");
                }
            });
        }
        Ok(Quorum {
            raft,
            runtime: Some(runtime),
            me: identity.id,
            records: self.records.clone(),
            machine: self.machine.clone(),
            write_timeout: options.write_timeout,
            heartbeat: options.heartbeat,
            lease: options.election_timeout / 2,
            unreachable,
            failed: Arc::new(Notify::new()),
            process: self.process,
            founded_with: founded_with.unwrap_or_default(),
        })
    }
}

/// Which Raft id this master has, kept in its Raft folder's `identity`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Identity {
    id: u64,
    /// Whether it is a member (false while a new member is joining).
    joined: bool,
}

const IDENTITY: &str = "identity";

impl Identity {
    /// A founding master's: the id every master of a new cluster gives it.
    fn founding(name: &str) -> Identity {
        Identity {
            id: member_id(name),
            joined: true,
        }
    }

    /// A joining master's: an id no master had, so that a master back
    /// with its data lost is never counted as the member it was (whose
    /// votes and log it no longer holds).
    fn joining(name: &str, process: u64) -> Identity {
        Identity {
            id: member_id(&format!("{name}#{process}")),
            joined: false,
        }
    }

    fn read(dir: &dyn Directory, name: &str) -> Result<Option<Identity>, String> {
        let Some((held, identity)) =
            read_kept::<(String, Identity)>(dir, IDENTITY, REMOVE_THE_DATA)?
        else {
            return Ok(None);
        };
        if held != name {
            return Err(format!(
                "{} belongs to master {held}, not {name}: start master {held} on it, or give \
                 {name} a data directory of its own",
                dir.path(IDENTITY).display()
            ));
        }
        Ok(Some(identity))
    }

    fn write(&self, dir: &dyn Directory, name: &str) -> Result<(), String> {
        let body = postcard::to_stdvec(&(name, self)).map_err(|e| e.to_string())?;
        write_sealed(dir, IDENTITY, &body).map_err(|e| e.to_string())
    }
}

impl Quorum {
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
            Ok(Message::Vote(to, _) | Message::Append(to, _) | Message::Snapshot(to, _))
                if to != self.me =>
            {
                Reply::Refused(format!(
                    "the master here is a new member (it lost its data and joined again), \
                     not the one the message is for ({to})"
                ))
            }
            Ok(Message::Vote(_, request)) => Reply::Vote(self.raft.vote(request).await),
            Ok(Message::Append(_, request)) => {
                Reply::Append(self.raft.append_entries(request).await)
            }
            Ok(Message::Snapshot(_, request)) => {
                Reply::Snapshot(self.raft.install_snapshot(request).await)
            }
            Ok(Message::Hello) => Reply::Hello(join::Greeting {
                last: self.log_state(),
                process: self.process,
                founded_with: self.founded_with.clone(),
            }),
            Ok(Message::Join(join)) => Reply::Joined(join::admit(&self.raft, self.me, join).await),
            Err(e) => Reply::Refused(format!("malformed message: {e}")),
        };
        postcard::to_stdvec(&reply).unwrap_or_else(|e| {
            postcard::to_stdvec(&Reply::Refused(format!("cannot encode the answer: {e}")))
                .unwrap_or_default()
        })
    }

    /// This master's Raft id: its founding id ([`member_id`] of its name),
    /// or one no master had if it joined as a new member.
    pub fn id(&self) -> u64 {
        self.me
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

    /// Proves this master still leads, so that a query it answers is
    /// current: a majority answered it within the last half election
    /// timeout (a lease: no other can have been elected since, as the
    /// others refuse to vote while they hear from a leader), else a round
    /// of messages now.
    pub async fn ensure_current(&self) -> Result<(), String> {
        {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let lease = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
            if metrics.state == ServerState::Leader
                && metrics.current_leader == Some(self.me)
                && metrics.millis_since_quorum_ack.is_some_and(|ms| ms < lease)
            {
                return Ok(());
            }
        }
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The master that leads, by this master's knowledge: its name and address.
    pub fn leader(&self) -> Option<(String, String)> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let member = metrics
            .membership_config
            .membership()
            .get_node(&leader)?
            .clone();
        Some((member.name, member.addr))
    }

    /// The last log entry this master holds, if any.
    fn log_state(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_log_index
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
        let members: BTreeMap<u64, Member> = metrics
            .membership_config
            .nodes()
            .map(|(id, member)| (*id, member.clone()))
            .collect();
        let mut masters: Vec<MemberState> = members
            .iter()
            .map(|(id, Member { name, addr })| {
                let matched = metrics
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).copied().flatten())
                    .map(|l| l.index);
                let leads = metrics.state == ServerState::Leader;
                let (state, reason) = if *id == self.me {
                    (own_state(metrics.state), String::new())
                } else if let Some(reason) = unreachable.get(id) {
                    ("down", reason.clone())
                } else if leads && matched.is_none() {
                    // A member the leader has never heard acknowledge an
                    // entry: not started yet, or its address now holds a
                    // new member (it lost its data and joins again).
                    ("down", "it has not acknowledged any entry yet".to_owned())
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
        masters.sort_by(|a, b| a.name.cmp(&b.name));
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
