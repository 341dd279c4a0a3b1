//! Which master answers a connection's calls (docs/protocol.md §12): the
//! one master, or, among several whose records Raft replicates, the one
//! that leads now. A master that leads starts serving from the replicated
//! records as a restarted master would (rolling forward what a write left
//! half done), and stops when it no longer leads or a write of its records
//! fails; until then, and afterwards, every call is answered `notLeader`,
//! naming the leader when it knows one. A query or a write is answered
//! only once the leader has proven, by a majority's answer, that it still
//! leads.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bitfold_proto::ErrorKind;
use bitfold_quorum::{Opening, Quorum, QuorumOptions};
use tokio::sync::oneshot;

use super::guard::Guarded;
use super::links::Links;
use super::reply::Failure;
use super::{Master, MasterOptions, Shared, start};
use crate::access::Caller;
use crate::bitfold_capnp::master;
use crate::catalog::Catalog;
use crate::cluster::ClusterFile;
use crate::metrics::{self, MasterMetrics};
use crate::net::{self, Connection};
use crate::tls::{Role, Tls};

/// The methods a leader answers only once a majority of masters has just
/// answered it: a query (so that it is current) and a write (so that a
/// leader cut off from the others refuses it at once as `notLeader`,
/// rather than after Raft's write timeout with an outcome it cannot know).
/// `status` and `placement` are answered as this master sees things, so
/// that `status` shows which masters are down even then.
const PROVEN: [&str; 5] = ["query", "import", "clear", "delete", "rebalance"];

/// How long a master waits to open its connection to the leader, on which
/// it sends calls on (a paused leader takes the connection but never
/// answers).
const LINK_TIMEOUT: Duration = Duration::from_secs(2);

/// The master a connection's calls go to.
pub(super) enum Serving {
    /// The one master.
    One(Rc<Master>),
    /// Whichever of several leads, if this one does.
    Replicated(Rc<Replicated>),
}

/// One master of several, as its process serves it.
pub(super) struct Replicated {
    name: String,
    shared: Shared,
    /// Its Raft node, opening or running.
    node: RefCell<Node>,
    /// The master serving while this one leads.
    current: RefCell<Option<Rc<Master>>>,
    /// How it reaches the other masters (TLS with a master's certificate).
    tls: Option<Tls>,
    /// Its connection to the leader, by address, for the calls it sends on.
    leader: RefCell<Option<(String, Rc<Connection<master::Client>>)>>,
}

/// A master's Raft node as it starts.
enum Node {
    /// Its records are open; Raft does not run yet.
    Opening(Arc<Opening>),
    /// Raft runs.
    Running(Arc<Quorum>),
}

impl Serving {
    /// What the process counts.
    pub(super) fn metrics(&self) -> &MasterMetrics {
        match self {
            Serving::One(master) => &master.metrics,
            Serving::Replicated(replicated) => &replicated.shared.metrics,
        }
    }

    /// The master that answers `method` now, or why none does here; a
    /// query or a write is answered only by a leader that has proven it
    /// still leads ([`PROVEN`]).
    pub(super) async fn master(&self, method: &str) -> Result<Rc<Master>, Failure> {
        let replicated = match self {
            Serving::One(master) => return Ok(master.clone()),
            Serving::Replicated(replicated) => replicated,
        };
        let current = replicated.current.borrow().clone();
        let Some(master) = current else {
            return Err(replicated.not_leader());
        };
        if PROVEN.contains(&method) {
            let proven = match replicated.quorum() {
                Some(quorum) => quorum.ensure_current().await.is_ok(),
                None => false,
            };
            if !proven {
                return Err(replicated.unproven());
            }
        }
        Ok(master)
    }

    /// A connection to the leader, if another master leads, on which this
    /// one's calls are sent on (marked `forwarding` when opened). A call
    /// holds it until answered: dropping a connection ends it, and a call
    /// under way on it would then never be answered.
    pub(super) async fn leader_link(&self) -> Option<Rc<Connection<master::Client>>> {
        let Serving::Replicated(replicated) = self else {
            return None;
        };
        let (name, addr) = replicated.quorum()?.leader()?;
        if name == replicated.name {
            return None;
        }
        if let Some(link) = replicated.open_link(&addr) {
            return Some(link);
        }
        let tls = replicated.tls.as_ref();
        let open = async {
            let link: Connection<master::Client> =
                net::connect(&addr, net::Sent::default(), tls, Role::Master)
                    .await
                    .map_err(|e| e.to_string())?;
            link.client
                .forwarding_request()
                .send()
                .promise
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(link)
        };
        let why = match tokio::time::timeout(LINK_TIMEOUT, open).await {
            Ok(Ok(link)) => {
                // Another call may have connected meanwhile: keep the first.
                if let Some(link) = replicated.open_link(&addr) {
                    return Some(link);
                }
                let link = Rc::new(link);
                *replicated.leader.borrow_mut() = Some((addr, link.clone()));
                return Some(link);
            }
            Ok(Err(why)) => why,
            Err(_) => format!("no answer within {}", net::seconds(LINK_TIMEOUT)),
        };
        tracing::info!(
            "master {} cannot reach the leader {name} at {addr}: {why}",
            replicated.name
        );
        None
    }

    /// Forgets the connection to the leader `used` (a call on it failed),
    /// unless another has replaced it already.
    pub(super) fn drop_leader_link(&self, used: &Rc<Connection<master::Client>>) {
        if let Serving::Replicated(replicated) = self {
            let mut leader = replicated.leader.borrow_mut();
            if leader
                .as_ref()
                .is_some_and(|(_, held)| Rc::ptr_eq(held, used))
            {
                leader.take();
            }
        }
    }

    /// Answers a Raft message from another master.
    pub(super) async fn raft(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Serving::One(_) => Err(
                "this master is the only one (its cluster file lists no [[masters]]): it takes \
                 no Raft messages"
                    .into(),
            ),
            Serving::Replicated(replicated) => {
                let node = match &*replicated.node.borrow() {
                    Node::Opening(opening) => return Ok(opening.answer(message)),
                    Node::Running(quorum) => quorum.clone(),
                };
                Ok(node.answer(message).await)
            }
        }
    }

    /// The `/metrics` page.
    fn render_metrics(&self) -> String {
        match self {
            Serving::One(master) => master.render_metrics(),
            Serving::Replicated(replicated) => match &*replicated.current.borrow() {
                Some(master) => master.render_metrics(),
                None => replicated
                    .shared
                    .metrics
                    .render(std::iter::empty(), replicated.shared.sent.bytes()),
            },
        }
    }

    fn sent(&self) -> net::Sent {
        match self {
            Serving::One(master) => master.sent.clone(),
            Serving::Replicated(replicated) => replicated.shared.sent.clone(),
        }
    }
}

impl Replicated {
    /// The open connection to the leader at `addr`, if there is one.
    fn open_link(&self, addr: &str) -> Option<Rc<Connection<master::Client>>> {
        match &*self.leader.borrow() {
            Some((open, link)) if open == addr && !link.is_closed() => Some(link.clone()),
            _ => None,
        }
    }

    /// Its Raft node, once Raft runs.
    fn quorum(&self) -> Option<Arc<Quorum>> {
        match &*self.node.borrow() {
            Node::Opening(_) => None,
            Node::Running(quorum) => Some(quorum.clone()),
        }
    }

    /// The `notLeader` failure of a leader that could not prove it still
    /// leads: another leads now, or no majority of masters answered it
    /// (those it cannot reach named).
    fn unproven(&self) -> Failure {
        let Some(quorum) = self.quorum() else {
            return self.not_leader();
        };
        if quorum.leader().is_some_and(|(name, _)| name != self.name) {
            return self.not_leader();
        }
        let down: Vec<String> = quorum
            .standing()
            .masters
            .into_iter()
            .filter(|m| m.state == "down")
            .map(|m| format!("{} at {}: {}", m.name, m.addr, m.reason))
            .collect();
        let why = if down.is_empty() {
            String::new()
        } else {
            format!(" (down: {})", down.join("; "))
        };
        Failure::new(
            ErrorKind::NotLeader,
            format!(
                "not the leader: master {} cannot prove it still leads: no majority of the \
                 masters answered it{why}",
                self.name
            ),
        )
    }

    /// The `notLeader` failure: this master does not lead, and who does.
    fn not_leader(&self) -> Failure {
        let who = match self.quorum().and_then(|quorum| quorum.leader()) {
            Some((name, addr)) if name == self.name => {
                format!("master {name} at {addr} has just been elected and is starting to serve")
            }
            Some((name, addr)) => format!("master {name} at {addr} leads"),
            None => "no master leads now (an election is under way, or most masters are down)"
                .to_owned(),
        };
        Failure::new(
            ErrorKind::NotLeader,
            format!("not the leader: master {} does not lead; {who}", self.name),
        )
    }
}

/// Listens on `options.listen` and gives each connection `serving`, as
/// its caller may call it, until `stop` completes.
pub(super) async fn listen(
    options: &MasterOptions,
    serving: Serving,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), crate::Error> {
    let listener = crate::bind(&options.listen).await?;
    let addr = crate::local_addr(&listener)?;
    let tls = options.tls.clone();
    let serving = Rc::new(serving);
    if let Some(listen) = &options.metrics {
        let serving = serving.clone();
        metrics::serve(listen, tls.clone(), move || serving.render_metrics()).await?;
    }
    if let Some(tls) = &tls {
        tokio::task::spawn_local(tls.clone().watch());
    }
    let sent = serving.sent();
    let serve = {
        let tls = tls.clone();
        move |peer: &net::Peer| {
            let guarded = Guarded {
                serving: serving.clone(),
                caller: Caller::new(peer, tls.as_ref()),
                forwarded: Cell::new(false),
            };
            let client: master::Client = capnp_rpc::new_client(guarded);
            Ok(client.client)
        }
    };
    on_ready(addr);
    tokio::select! {
        () = net::accept_loop(listener, serve, sent, tls) => {}
        () = stop => {}
    }
    Ok(())
}

/// Runs master `options.replication`'s name, one of several: opens its
/// records, answers the other masters while Raft starts (which may wait
/// for them: see `bitfold_quorum::Opening::start`), then serves as the
/// master while it leads.
pub(super) fn run_replicated(
    options: MasterOptions,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), crate::Error> {
    let replication = options
        .replication
        .clone()
        .ok_or_else(|| crate::Error::Config("no [[masters]] to run among".into()))?;
    let links = Links::start(options.tls.clone()).map_err(|e| {
        crate::Error::Config(format!("cannot start the links to the other masters: {e}"))
    })?;
    let masters = replication
        .masters
        .iter()
        .map(|m| (m.name.clone(), m.addr.clone()))
        .collect();
    let quorum = QuorumOptions::new(replication.name.clone(), masters, options.data_dir.clone());
    let opening = Arc::new(Opening::open(quorum).map_err(crate::Error::Config)?);
    // The node is dropped here, once the runtime and every task holding it are gone.
    let kept: Arc<Mutex<Option<Arc<Quorum>>>> = Arc::default();
    let served = net::block_on_local(async {
        let replicated = Rc::new(Replicated {
            name: replication.name.clone(),
            shared: Shared {
                metrics: Rc::new(MasterMetrics::new()),
                sent: net::Sent::default(),
                quorum: None,
            },
            node: RefCell::new(Node::Opening(opening.clone())),
            current: RefCell::new(None),
            tls: options.tls.clone(),
            leader: RefCell::new(None),
        });
        let (failed, failure) = oneshot::channel();
        let started = start_raft(opening, Arc::new(links));
        let running = {
            let replicated = replicated.clone();
            let options = options.clone();
            let kept = kept.clone();
            async move {
                match started.await {
                    Ok(quorum) => {
                        let quorum = Arc::new(quorum);
                        *kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(quorum.clone());
                        *replicated.node.borrow_mut() = Node::Running(quorum);
                        lead(replicated, options).await;
                    }
                    Err(e) => {
                        let _ = failed.send(e);
                    }
                }
            }
        };
        tokio::task::spawn_local(running);
        let mut failure = std::pin::pin!(failure);
        let stopped = async {
            tokio::select! {
                () = stop => None,
                failed = &mut failure => failed.ok(),
            }
        };
        let (tx, rx) = oneshot::channel();
        let stop = async move {
            let _ = tx.send(stopped.await);
        };
        listen(&options, Serving::Replicated(replicated), on_ready, stop).await?;
        match rx.await {
            Ok(Some(why)) => Err(crate::Error::Config(why)),
            _ => Ok(()),
        }
    });
    drop(kept);
    served?
}

/// Starts Raft on a thread of its own (it may wait for the other masters),
/// with `links` to them.
async fn start_raft(opening: Arc<Opening>, links: Arc<Links>) -> Result<Quorum, String> {
    let (started, start) = oneshot::channel();
    std::thread::Builder::new()
        .name("raft-start".into())
        .spawn(move || {
            let _ = started.send(opening.start(links));
        })
        .map_err(|e| format!("cannot start Raft: {e}"))?;
    start
        .await
        .unwrap_or_else(|_| Err("Raft's start stopped".into()))
}

/// Serves as the master while this one leads, again each time it leads.
async fn lead(replicated: Rc<Replicated>, options: MasterOptions) {
    let name = &replicated.name;
    let Some(quorum) = replicated.quorum() else {
        return;
    };
    let shared = Shared {
        quorum: Some(quorum.clone()),
        ..replicated.shared.clone()
    };
    loop {
        quorum.leading().await;
        tracing::info!("master {name} leads: starting from the replicated records");
        let options = reread(&options);
        let started = async {
            let catalog =
                Catalog::with_directory(quorum.records()).map_err(crate::Error::Catalog)?;
            let on_disk = start::read(&catalog, &options.cluster).map_err(crate::Error::Config)?;
            Master::start(options.clone(), catalog, on_disk, shared.clone()).await
        };
        match started.await {
            Ok((master, tasks)) => {
                *replicated.current.borrow_mut() = Some(master);
                tracing::warn!("master {name} leads and serves");
                quorum.deposed().await;
                replicated.current.borrow_mut().take();
                drop(tasks);
                tracing::warn!(
                    "master {name} no longer serves: it does not lead, or a write failed"
                );
            }
            Err(e) => {
                tracing::error!("master {name} leads but cannot serve: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// `options` with the cluster file read again: a master that comes to lead
/// takes the slaves' addresses from the file as it is now (it may have
/// been edited since this process started, as `rebalance` reads it).
fn reread(options: &MasterOptions) -> MasterOptions {
    let mut options = options.clone();
    if let Some(path) = &options.cluster_file {
        match ClusterFile::load(path) {
            Ok(file) => options.cluster = file.cluster,
            Err(e) => tracing::warn!(
                "master leads with the cluster file as it was when it started, since it cannot \
                 read it again: {e}"
            ),
        }
    }
    options
}
