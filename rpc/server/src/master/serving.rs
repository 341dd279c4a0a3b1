//! Which master answers a connection's calls (docs/protocol.md §12): the
//! one master, or, among several whose records Raft replicates, the one
//! that leads now. A master that leads starts serving from the replicated
//! records as a restarted master would (rolling forward what a write left
//! half done), and stops when it no longer leads or a write of its records
//! fails; until then, and afterwards, every call is answered `notLeader`,
//! naming the leader when it knows one. A query or a write is answered
//! only once the leader has proven, by a majority's answer, that it still
//! leads.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bitfold_proto::ErrorKind;
use bitfold_quorum::{Quorum, QuorumOptions};

use super::guard::Guarded;
use super::links::Links;
use super::reply::Failure;
use super::{Master, MasterOptions, Shared, start};
use crate::access::Caller;
use crate::bitfold_capnp::master;
use crate::catalog::Catalog;
use crate::metrics::{self, MasterMetrics};
use crate::net;

/// The methods a leader answers only once a majority of masters has just
/// answered it: a query (so that it is current) and a write (so that a
/// leader cut off from the others refuses it at once as `notLeader`,
/// rather than after Raft's write timeout with an outcome it cannot know).
/// `status` and `placement` are answered as this master sees things, so
/// that `status` shows which masters are down even then.
const PROVEN: [&str; 5] = ["query", "import", "clear", "delete", "rebalance"];

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
    quorum: Arc<Quorum>,
    /// The master serving while this one leads.
    current: RefCell<Option<Rc<Master>>>,
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
        if PROVEN.contains(&method) && replicated.quorum.ensure_current().await.is_err() {
            return Err(replicated.unproven());
        }
        Ok(master)
    }

    /// Answers a Raft message from another master.
    pub(super) async fn raft(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Serving::One(_) => Err(
                "this master is the only one (its cluster file lists no [[masters]]): it takes \
                 no Raft messages"
                    .into(),
            ),
            Serving::Replicated(replicated) => Ok(replicated.quorum.answer(message).await),
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
    /// The `notLeader` failure of a leader that could not prove it still
    /// leads: another leads now, or no majority of masters answered it
    /// (those it cannot reach named).
    fn unproven(&self) -> Failure {
        if self
            .quorum
            .leader()
            .is_some_and(|(name, _)| name != self.name)
        {
            return self.not_leader();
        }
        let down: Vec<String> = self
            .quorum
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
        let who = match self.quorum.leader() {
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

/// Runs master `options.replication`'s name, one of several: its Raft
/// node, and a master serving while it leads.
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
    let quorum = Arc::new(Quorum::open(quorum, Arc::new(links)).map_err(crate::Error::Config)?);
    let served = net::block_on_local(async {
        let replicated = Rc::new(Replicated {
            name: replication.name.clone(),
            shared: Shared {
                metrics: Rc::new(MasterMetrics::new()),
                sent: net::Sent::default(),
                quorum: Some(quorum.clone()),
            },
            quorum: quorum.clone(),
            current: RefCell::new(None),
        });
        tokio::task::spawn_local(lead(replicated.clone(), options.clone()));
        listen(&options, Serving::Replicated(replicated), on_ready, stop).await
    });
    // The runtime and every task holding the node are gone: Raft stops here.
    drop(quorum);
    served?
}

/// Serves as the master while this one leads, again each time it leads.
async fn lead(replicated: Rc<Replicated>, options: MasterOptions) {
    let name = &replicated.name;
    loop {
        replicated.quorum.leading().await;
        tracing::info!("master {name} leads: starting from the replicated records");
        let started = async {
            let catalog = Catalog::with_directory(replicated.quorum.records())
                .map_err(crate::Error::Catalog)?;
            let on_disk = start::read(&catalog, &options.cluster).map_err(crate::Error::Config)?;
            Master::start(options.clone(), catalog, on_disk, replicated.shared.clone()).await
        };
        match started.await {
            Ok((master, tasks)) => {
                *replicated.current.borrow_mut() = Some(master);
                tracing::info!("master {name} serves as the leader");
                replicated.quorum.deposed().await;
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
