//! The master: serves the DBMS interface (`Master` in `schema/bitfold.capnp`).
//!
//! A query is parsed ([`crate::query`]), planned over the durable catalog
//! ([`crate::catalog`]) with placement ([`crate::placement`]): one chain per
//! term, one live owner per vid (`plan`). A coordinator is picked by
//! [`CoordinatorPolicy`] and runs the chains. A point query is one `fetch`
//! from a live owner. Failed machines are marked down and the query is tried
//! again elsewhere (`answer`). The answer is converted into the asked form
//! straight into the reply (`reply`). A down slave is probed in the
//! background and used again once it answers and its catalog is merged
//! (`probe`), after the store it holds has been checked against the
//! master's `ledger`: a wiped, replaced or older store serves nothing it
//! owns until it has been refilled. Every write (an import, a clear or a
//! delete) is recorded in the `journal` first, then applied on every owner
//! (`import`, `update`), each call stamped so that a slave's fence orders
//! them (`fence`); a delete waits for the queries planned before it
//! (`in_flight`).
//!
//! The state is owned in parts: where vectors are placed
//! (`layout::Placement`), what it knows of each slave (`slaves::Slaves`),
//! the catalog and journal (`records::Records`) and the ledger
//! (`fence::Fence`), each keeping its invariants.

mod answer;
mod copy;
mod fence;
mod guard;
mod import;
mod in_flight;
mod journal;
mod layout;
mod ledger;
mod links;
mod missed;
mod options;
mod plan;
mod probe;
mod rebalance;
mod recorded;
mod records;
mod refill;
mod reply;
mod serving;
mod slaves;
pub(crate) mod start;
mod trace;
mod update;

pub use options::{MasterOptions, Replication};
pub use plan::{CoordinatorPolicy, PlanChoice};
pub use reply::MAX_DATA_BYTES;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bitfold_quorum::Quorum;

use crate::bitfold_capnp::{master, update_outcome};
use crate::catalog::Catalog;
use crate::chain::{FailedMachine, VidRun};
use crate::metrics::MasterMetrics;
use crate::net::{self, Pool};
use bitfold_proto::ErrorKind;
use fence::Fence;
use in_flight::InFlight;
use layout::{Layout, Placement};
use plan::Turn;
use records::Records;
use reply::{Failure, write_found};
use serving::Serving;
use slaves::Slaves;
use trace::Trace;

/// Serves until the process is killed; calls `on_ready` with the bound
/// address once it accepts connections (`listen` may say port 0).
pub fn run(options: MasterOptions, on_ready: impl FnOnce(SocketAddr)) -> Result<(), crate::Error> {
    run_until(options, on_ready, std::future::pending())
}

/// Like [`run`], but stops serving (closing every connection) when `stop` completes.
pub fn run_until(
    options: MasterOptions,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), crate::Error> {
    options.cluster.validate().map_err(crate::Error::Config)?;
    if options.attempts == 0 {
        return Err(crate::Error::Config("attempts must be at least 1".into()));
    }
    crate::access::require(options.tls.as_ref(), crate::tls::Role::Master)?;
    if options.replication.is_some() {
        return serving::run_replicated(options, on_ready, stop);
    }
    let catalog = Catalog::open(&options.data_dir).map_err(crate::Error::Catalog)?;
    let on_disk = start::read(&catalog, &options.cluster).map_err(crate::Error::Config)?;
    net::block_on_local(async move {
        let shared = Shared {
            metrics: Rc::new(MasterMetrics::new()),
            sent: net::Sent::default(),
            quorum: None,
        };
        let (master, _tasks) = Master::start(options.clone(), catalog, on_disk, shared).await?;
        serving::listen(&options, Serving::One(master), on_ready, stop).await
    })?
}

impl Master {
    /// Serves from `catalog` and the records read with it: rolls forward
    /// the writes a stop interrupted, probes every slave, and starts the
    /// background probe and refill loops, which stop when the [`Tasks`]
    /// returned are dropped.
    async fn start(
        options: MasterOptions,
        catalog: Catalog,
        on_disk: start::OnDisk,
        shared: Shared,
    ) -> Result<(Rc<Master>, Tasks), crate::Error> {
        let start::OnDisk {
            layout,
            move_next,
            journal,
            missed,
            ledger,
        } = on_disk;
        let tls = options.tls.clone();
        let state = Rc::new(Master {
            options,
            pool: Pool::new(net::Sent::default(), tls),
            slaves: Slaves::new(layout.slaves().len(), missed),
            placement: Placement::new(layout, move_next),
            records: Records::new(catalog, journal),
            fence: Fence::new(ledger),
            in_flight: Rc::new(InFlight::default()),
            turn: Turn::default(),
            metrics: shared.metrics,
            sent: shared.sent,
            quorum: shared.quorum,
        });
        state
            .records
            .recover()
            .await
            .map_err(crate::Error::Config)?;
        state.probe_round(probe::Writes::Take).await;
        let tasks = Tasks(vec![
            tokio::task::spawn_local(probe::probe_loop(state.clone())),
            tokio::task::spawn_local(refill::refill_loop(state.clone())),
        ]);
        Ok((state, tasks))
    }
}

/// A master's background loops: aborted when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The master's state, shared by every connection: each part owned by a
/// type that keeps its invariants.
struct Master {
    options: MasterOptions,
    pool: Pool,
    /// Where vectors are placed, and how far a move has got.
    placement: Placement,
    /// What it knows of each slave: up or down, and what it lacks.
    slaves: Slaves,
    /// The catalog, the journal of pending writes and the write lock.
    records: Records,
    /// The epoch and write numbers its writes carry, and the stores checked.
    fence: Fence,
    /// The queries in flight.
    in_flight: Rc<InFlight>,
    /// Whose turn it is to coordinate, under round robin.
    turn: Turn,
    /// What it counts for `/metrics` (the process's: a master that leads
    /// again counts on).
    metrics: Rc<MasterMetrics>,
    /// Bytes its DBMS connections have sent.
    sent: net::Sent,
    /// This master's Raft node, when it is one of several.
    quorum: Option<Arc<Quorum>>,
}

/// What a master process keeps while masters come and go in it (one
/// master leading, deposed, leading again).
#[derive(Clone)]
struct Shared {
    metrics: Rc<MasterMetrics>,
    sent: net::Sent,
    quorum: Option<Arc<Quorum>>,
}

impl Master {
    /// The layout in force now.
    fn layout(&self) -> Rc<Layout> {
        self.placement.now()
    }

    fn slave_name(&self, index: usize) -> String {
        let layout = self.layout();
        let entry = &layout.slaves()[index];
        format!("{} ({})", entry.name, entry.addr)
    }

    /// The vector, or piece of one, stored under `key`, for messages.
    fn named(&self, key: u64) -> String {
        match self.layout().current.pieces().split(key) {
            (vid, 0) => format!("vector {vid}"),
            (vid, piece) => format!("piece {piece} of vector {vid}"),
        }
    }

    fn mark_down(&self, index: usize, reason: &str) {
        if self.slaves.down(index, reason) {
            tracing::warn!("slave {} is down: {reason}", self.slave_name(index));
            self.metrics
                .transition(&self.layout().slaves()[index].name, false);
        }
    }

    fn mark_failed(&self, failed: &FailedMachine) {
        let index = self
            .layout()
            .slaves()
            .iter()
            .position(|s| s.name == failed.name);
        if let Some(index) = index {
            self.mark_down(index, &failed.reason);
        }
    }

    /// The `/metrics` page: what it counted, and each slave up or down now.
    fn render_metrics(&self) -> String {
        let slaves = self.slaves.states();
        let layout = self.layout();
        let names = layout.slaves().iter().map(|s| s.name.as_str());
        let up = slaves.iter().map(|s| s.up);
        self.metrics.render(names.zip(up), self.sent.bytes())
    }

    /// An `unavailable` error naming the down `machines` and why they are down.
    fn unavailable(&self, message: String, machines: &[usize]) -> Failure {
        let names = machines
            .iter()
            .map(|&i| self.layout().slaves()[i].name.clone())
            .collect();
        let states = self.slaves.states();
        let down: Vec<String> = machines
            .iter()
            .map(|&i| match &states[i].reason {
                Some(reason) => format!("{} is down: {reason}", self.slave_name(i)),
                None if !self.slaves.lacking(i).is_empty() => format!(
                    "{} is up but lacks {} of its vectors (its store is not the one that \
                     held them: wiped, new or restored from a backup; each is copied back \
                     from another owner that holds it, and one no owner holds is lost: \
                     delete it and import it again)",
                    self.slave_name(i),
                    self.slaves.lacking(i).len()
                ),
                None => format!("{} is up", self.slave_name(i)),
            })
            .collect();
        Failure {
            kind: ErrorKind::Unavailable,
            message: format!("unavailable: {message}; {}", down.join("; ")),
            failed_machines: names,
        }
    }
}

impl master::Server for Master {
    async fn query(
        self: capnp::capability::Rc<Self>,
        params: master::QueryParams,
        mut results: master::QueryResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let message = params.get_message()?.as_bytes();
        let trace = Trace::new(self.options.slow.is_some());
        let outcome = match params.get_format() {
            Ok(format) => match self.answer(message, format, &trace).await {
                Ok(found) => {
                    let out = results.get().init_result();
                    write_found(&found, format, out)
                }
                Err(failure) => Err(failure),
            },
            Err(_) => Err(Failure::new(
                ErrorKind::BadQuery,
                "unknown result format: use words, roaring or count",
            )),
        };
        if let Err(failure) = &outcome {
            failure.write(results.get().init_result().init_error());
        }
        let answer_bytes = || results.get().total_size().map_or(0, |s| s.word_count * 8);
        let outcome = outcome.map(|_| ()).map_err(|failure| failure.kind);
        let slow = self.options.slow;
        trace.finish(&self.metrics, slow, message, outcome, answer_bytes);
        Ok(())
    }

    async fn import(
        self: capnp::capability::Rc<Self>,
        params: master::ImportParams,
        mut results: master::ImportResults,
    ) -> Result<(), capnp::Error> {
        let vectors = params.get()?.get_vectors()?;
        let count = vectors.len();
        let outcome = self.import_vectors(vectors).await;
        let mut out = results.get().init_outcome();
        match outcome {
            Ok(bytes) => {
                self.metrics.imported(u64::from(count), bytes);
                out.set_ok(());
            }
            Err(failure) => failure.write(out.init_error()),
        }
        Ok(())
    }

    async fn status(
        self: capnp::capability::Rc<Self>,
        _: master::StatusParams,
        mut results: master::StatusResults,
    ) -> Result<(), capnp::Error> {
        Master::status(&self, &mut results).await;
        Ok(())
    }

    async fn clear(
        self: capnp::capability::Rc<Self>,
        params: master::ClearParams,
        mut results: master::ClearResults,
    ) -> Result<(), capnp::Error> {
        let outcome = self.clear_vectors(params.get()?.get_vectors()?).await;
        self.metrics
            .updated("clear", outcome.as_ref().map(|&n| n).map_err(|f| f.kind));
        write_update_outcome(results.get().init_outcome(), outcome);
        Ok(())
    }

    async fn rebalance(
        self: capnp::capability::Rc<Self>,
        params: master::RebalanceParams,
        mut results: master::RebalanceResults,
    ) -> Result<(), capnp::Error> {
        let most = params.get()?.get_most().max(1) as usize;
        let outcome = self.rebalance_step(most).await;
        let out = results.get().init_outcome();
        match outcome {
            Ok(progress) => {
                let mut out = out.init_progress();
                out.set_done(progress.done);
                out.set_total(progress.total);
                out.set_copied(progress.copied);
                out.set_copied_bytes(progress.copied_bytes);
                out.set_removed(progress.removed);
                out.set_finished(progress.finished);
            }
            Err(failure) => failure.write(out.init_error()),
        }
        Ok(())
    }

    async fn placement(
        self: capnp::capability::Rc<Self>,
        _: master::PlacementParams,
        mut results: master::PlacementResults,
    ) -> Result<(), capnp::Error> {
        // Only the slaves that need it: `status` has just probed them all.
        self.probe_round(probe::Writes::Take).await;
        self.placement_report(results.get().init_report());
        Ok(())
    }

    async fn delete(
        self: capnp::capability::Rc<Self>,
        params: master::DeleteParams,
        mut results: master::DeleteResults,
    ) -> Result<(), capnp::Error> {
        let outcome = self.delete_spans(params.get()?.get_spans()?).await;
        self.metrics
            .updated("delete", outcome.as_ref().map(|&n| n).map_err(|f| f.kind));
        write_update_outcome(results.get().init_outcome(), outcome);
        Ok(())
    }
}

impl Master {
    /// How the catalog's vectors stand: one pass over it.
    fn standing(&self) -> Standing {
        let layout = self.layout();
        let catalog = self.records.catalog();
        let mut standing = Standing::default();
        let holding = self.slaves.holding();
        for vid in catalog.range(0, u64::MAX) {
            let owners = layout.read_owners(vid);
            let mut idle = 0;
            for &owner in &owners {
                if !holding(owner, VidRun::one(vid)) {
                    idle += 1;
                    standing.idle.insert(owner);
                }
            }
            standing.under += u64::from(idle > 0);
            standing.lost += u64::from(idle == owners.len());
            if let Some(target) = &layout.target {
                standing.misplaced += u64::from(
                    vid >= self.placement.move_next() && target.placement().owners(vid) != owners,
                );
            }
        }
        standing
    }

    /// Counts what is placed well and what is not.
    fn placement_report(&self, mut out: crate::bitfold_capnp::placement_report::Builder<'_>) {
        let standing = self.standing();
        let layout = self.layout();
        let catalog = self.records.catalog();
        out.set_vectors(catalog.len() as u64);
        out.set_under_replicated(standing.under);
        out.set_lost(standing.lost);
        out.set_misplaced(standing.misplaced);
        out.set_moving(layout.target.is_some());
        out.set_move_done(
            catalog
                .range(0, self.placement.move_next().saturating_sub(1))
                .count() as u64,
        );
    }
}

/// How the catalog's vectors stand ([`Master::standing`]).
#[derive(Default)]
struct Standing {
    /// Vectors with an owner that may not serve them (fewer than `replicas`
    /// copies that may serve, or than every slave when there are fewer).
    under: u64,
    /// Vectors no owner may serve.
    lost: u64,
    /// Vectors not yet on their owners under a move in progress.
    misplaced: u64,
    /// The owners that may not serve some vector they own.
    idle: BTreeSet<usize>,
}

/// The reason a slave gave in a text field, or, if the field does not
/// read, that its message was malformed.
pub(super) fn slave_said(text: capnp::Result<capnp::text::Reader<'_>>) -> String {
    text.and_then(|t| Ok(t.to_string()?))
        .unwrap_or_else(|e| format!("it answered a malformed message: {e}"))
}

fn write_update_outcome(mut out: update_outcome::Builder<'_>, outcome: Result<u64, Failure>) {
    match outcome {
        Ok(changed) => out.set_changed(changed),
        Err(failure) => failure.write(out.init_error()),
    }
}
