//! The slave: serves its store's vectors to handler chains, coordinates
//! queries, answers point fetches, imports, health and catalog calls.
//!
//! - the handler (`handler.rs`): ORs its run of a chain into the partial result, straight
//!   into the request to the next machine (or into its reply at the end).
//! - the coordinator (`coordinator.rs`): runs one chain per term concurrently and ANDs (or
//!   counts) the term vectors into its reply.
//! - the fan-out plan (`fan_out.rs`): the coordinator gathers each machine's OR of its vids
//!   of every term in one round trip, instead of a chain per term.
//! - the coordinator's term vectors in memory (`term_union.rs`): what the fan-out ANDs on
//!   the coordinator itself, filled into buffers it keeps between queries.
//! - the batch fetch (`fetch_many.rs`): many vectors per reply, for a move's or a refill's
//!   copies.

mod admit;
pub(crate) mod coordinator;
pub(crate) mod fan_out;
pub(crate) mod fetch_many;
mod guard;
pub(crate) mod handler;
mod pull;
pub(crate) mod term_union;
mod writes;

pub use admit::{Admit, RELOAD_INTERVAL};

use writes::{
    WriteError, fenced, import_batch, log_applied_already, stage_batch, update_batch, write_changed,
};

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bitfold_engine::VectorPart;
use bitfold_engine::fold::UnionPlan;
use bitfold_engine::store::{Fenced, ImportStats, Snapshot, Staged, Stamp, Store, StoreError};

use crate::access::Caller;
use crate::bitfold_capnp::{Want, slave, stamp, store_state};
use crate::budget::{self, Budget};
use crate::chain::{Machines, VidRun};
use crate::metrics::{self, SlaveMetrics};
use crate::net::{self, Pool};
use crate::tls::Tls;
use crate::wire;
use admit::Admitted;
use guard::Guarded;

/// How a slave serves.
#[derive(Debug, Clone)]
pub struct SlaveOptions {
    /// Where to listen, `HOST:PORT` (port 0 picks a free one).
    pub listen: String,
    /// The store's directory (created if missing).
    pub data_dir: PathBuf,
    /// The longest budget a call may ask for; longer ones are cut to it, so
    /// a bogus budget cannot make a handler wait forever (default 60 s).
    pub max_budget: Duration,
    /// Where to serve Prometheus metrics at `/metrics`, `HOST:PORT` (none by default).
    pub metrics: Option<String>,
    /// Mutual TLS on every link, accepted and made (none by default: plain TCP).
    pub tls: Option<Tls>,
    /// Without TLS, whose connections it accepts (by default everyone's,
    /// warned about at start); with TLS it is not used: the certificates'
    /// roles decide who may call.
    pub admit: Admit,
}

impl SlaveOptions {
    /// Options with the defaults for everything but the address and directory.
    pub fn new(listen: impl Into<String>, data_dir: impl Into<PathBuf>) -> SlaveOptions {
        SlaveOptions {
            listen: listen.into(),
            data_dir: data_dir.into(),
            max_budget: Duration::from_secs(60),
            metrics: None,
            tls: None,
            admit: Admit::Everyone,
        }
    }
}

/// Serves until the process is killed; calls `on_ready` with the bound
/// address once it accepts connections (`listen` may say port 0).
pub fn run(options: SlaveOptions, on_ready: impl FnOnce(SocketAddr)) -> Result<(), crate::Error> {
    run_until(options, on_ready, std::future::pending())
}

/// Like [`run`], but stops serving (closing every connection) when `stop` completes.
pub fn run_until(
    options: SlaveOptions,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), crate::Error> {
    let store = Store::open(&options.data_dir)?;
    serve_store(Arc::new(store), &options, on_ready, stop)
}

/// Serves `store` (for instance [`Store::in_memory`]) at `options.listen`
/// until `stop` completes; `options.data_dir` is not used.
pub fn serve_store(
    store: Arc<Store>,
    options: &SlaveOptions,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), crate::Error> {
    crate::access::require(options.tls.as_ref(), crate::tls::Role::Slave)?;
    net::block_on_local(async move {
        let listener = crate::bind(&options.listen).await?;
        let addr = crate::local_addr(&listener)?;
        let sent = net::Sent::default();
        let slave = Rc::new(Slave {
            store,
            session: new_session(),
            staged: RefCell::default(),
            pool: Pool::new(sent.clone(), options.tls.clone()),
            tls: options.tls.clone(),
            max_budget: options.max_budget,
            read: Cell::new(0),
            sent: sent.clone(),
            metrics: SlaveMetrics::new(),
        });
        if let Some(listen) = &options.metrics {
            let slave = slave.clone();
            metrics::serve(listen, options.tls.clone(), move || slave.render_metrics()).await?;
        }
        let tls = options.tls.clone();
        let admitted = match &tls {
            Some(tls) => {
                tokio::task::spawn_local(tls.clone().watch());
                None
            }
            None => Admitted::start(&options.admit).await?,
        };
        let serve = {
            let tls = tls.clone();
            move |peer: &net::Peer| {
                if let Some(admitted) = &admitted {
                    admitted.check(peer.addr)?;
                }
                let guarded = Guarded {
                    slave: slave.clone(),
                    caller: Caller::new(peer, tls.as_ref()),
                };
                let client: slave::Client = capnp_rpc::new_client(guarded);
                Ok(client.client)
            }
        };
        on_ready(addr);
        tokio::select! {
            () = net::accept_loop(listener, serve, sent, tls) => {}
            () = stop => {}
        }
        Ok(())
    })?
}

/// A slave's state, shared by every connection.
pub(crate) struct Slave {
    pub(crate) store: Arc<Store>,
    /// Made at random when the process started: the master names it in
    /// every call, so that it checks a restarted slave's store before it
    /// reads or writes there again.
    session: u64,
    /// Imports written but not yet applied, by stamp, until their `commit`.
    staged: RefCell<BTreeMap<Stamp, Staged>>,
    pub(crate) pool: Pool,
    /// Its TLS configuration, for its certificate's expiry in `health`.
    tls: Option<Tls>,
    pub(crate) max_budget: Duration,
    /// Bytes of stored vectors its folds have read.
    read: Cell<u64>,
    /// Bytes it has sent to other processes.
    sent: net::Sent,
    /// What it counts for `/metrics`.
    metrics: SlaveMetrics,
}

impl slave::Server for Slave {
    fn handle(
        self: capnp::capability::Rc<Self>,
        params: slave::HandleParams,
        results: slave::HandleResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("handle");
        handler::handle(self, params, results)
    }

    fn coordinate(
        self: capnp::capability::Rc<Self>,
        params: slave::CoordinateParams,
        results: slave::CoordinateResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("coordinate");
        coordinator::coordinate(self, params, results)
    }

    fn gather(
        self: capnp::capability::Rc<Self>,
        params: slave::GatherParams,
        results: slave::GatherResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("gather");
        std::future::ready(fan_out::gather(&self, params, results))
    }

    fn fetch(
        self: capnp::capability::Rc<Self>,
        params: slave::FetchParams,
        mut results: slave::FetchResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("fetch");
        let answer = (|| -> capnp::Result<()> {
            let params = params.get()?;
            self.check_session(params.get_session())?;
            let snapshot = self.store.snapshot();
            let mut parts = Vec::new();
            let one = [VidRun::one(params.get_vid())];
            let found = self.stored_parts(&snapshot, &one, &mut parts);
            let result = results.get().init_result();
            let Ok(read) = found else {
                let mut result = result;
                result.set_not_found(());
                return Ok(());
            };
            let plan = UnionPlan::new(&parts);
            if params.get_want()? == Want::Count {
                let mut result = result;
                let (count, unread) = count_union(&plan, &parts);
                self.unread(read, unread);
                result.set_count(count);
                return Ok(());
            }
            let list = result.init_vector(plan.parts().len() as u32);
            let unread = wire::write_union(list, &plan, &parts);
            self.unread(read, unread.total());
            Ok(())
        })();
        std::future::ready(answer)
    }

    async fn import(
        self: capnp::capability::Rc<Self>,
        params: slave::ImportParams,
        mut results: slave::ImportResults,
    ) -> Result<(), capnp::Error> {
        self.metrics.request("import");
        // The store fsyncs: do it on a blocking thread, so that this slave
        // keeps serving handler chains meanwhile. The vectors are copied
        // out of the request for that (a copy is cheap next to an fsync).
        wire::check_import(params.get()?.get_vectors()?)?;
        let (epoch, stamp) = self.check_stamp(params.get()?.get_stamp()?)?;
        let stage = params.get()?.get_stage();
        let mut batch = capnp::message::Builder::new_default();
        batch.set_root(params.get()?.get_vectors()?)?;
        drop(params);
        let store = self.store.clone();
        if stage {
            let staged = tokio::task::spawn_blocking(move || stage_batch(&store, &batch))
                .await
                .map_err(wire::failed)?;
            match staged {
                Ok(staged) => {
                    self.keep_staged(stamp, staged);
                    results.get().init_outcome().set_ok(());
                }
                Err(WriteError::Store(err)) => {
                    self.write_imported(&mut results.get().init_outcome(), stamp, Err(err));
                }
                Err(WriteError::Malformed(err)) => return Err(err),
            }
            self.write_state(results.get().init_state());
            return Ok(());
        }
        let stored =
            tokio::task::spawn_blocking(move || import_batch(&store, epoch, stamp, &batch))
                .await
                .map_err(wire::failed)?;
        let stored = match stored {
            Err(WriteError::Malformed(err)) => return Err(err),
            Err(WriteError::Store(err)) => Err(err),
            Ok(stored) => Ok(stored),
        };
        self.write_imported(&mut results.get().init_outcome(), stamp, stored);
        self.write_state(results.get().init_state());
        Ok(())
    }

    async fn commit(
        self: capnp::capability::Rc<Self>,
        params: slave::CommitParams,
        mut results: slave::CommitResults,
    ) -> Result<(), capnp::Error> {
        self.metrics.request("commit");
        let (epoch, stamp) = self.check_stamp(params.get()?.get_stamp()?)?;
        let pieces = u64::from(params.get()?.get_pieces());
        let staged = {
            let mut kept = self.staged.borrow_mut();
            let piece = |piece| Stamp {
                write: stamp.write,
                piece,
            };
            if let Some(missing) = (0..pieces).find(|&p| !kept.contains_key(&piece(p))) {
                return Err(wire::failed(format!(
                    "no import is staged with write {} piece {missing}",
                    stamp.write
                )));
            }
            (0..pieces).filter_map(|p| kept.remove(&piece(p))).collect()
        };
        let stamp = Stamp {
            write: stamp.write,
            piece: 0,
        };
        let store = self.store.clone();
        let stored = tokio::task::spawn_blocking(move || store.commit_at(epoch, stamp, staged))
            .await
            .map_err(wire::failed)?;
        self.write_imported(&mut results.get().init_outcome(), stamp, stored);
        self.write_state(results.get().init_state());
        Ok(())
    }

    async fn update(
        self: capnp::capability::Rc<Self>,
        params: slave::UpdateParams,
        mut results: slave::UpdateResults,
    ) -> Result<(), capnp::Error> {
        self.metrics.request("update");
        // As for an import: the store fsyncs, on a blocking thread.
        let changes = params.get()?.get_changes()?;
        wire::check_changes(changes)?;
        let (epoch, stamp) = self.check_stamp(params.get()?.get_stamp()?)?;
        let mut batch = capnp::message::Builder::new_default();
        batch.set_root(changes)?;
        drop(params);
        let store = self.store.clone();
        let applied =
            tokio::task::spawn_blocking(move || update_batch(&store, epoch, stamp, &batch))
                .await
                .map_err(wire::failed)?;
        let applied = match applied {
            Err(WriteError::Malformed(err)) => return Err(err),
            Err(WriteError::Store(err)) => Err(err),
            Ok(applied) => Ok(applied),
        };
        write_changed(
            results.get().init_result(),
            stamp,
            applied,
            "apply the update",
        );
        self.write_state(results.get().init_state());
        Ok(())
    }

    fn fetch_many(
        self: capnp::capability::Rc<Self>,
        params: slave::FetchManyParams,
        results: slave::FetchManyResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("fetchMany");
        std::future::ready(fetch_many::fetch_many(&self, params, results))
    }

    async fn pull(
        self: capnp::capability::Rc<Self>,
        params: slave::PullParams,
        results: slave::PullResults,
    ) -> Result<(), capnp::Error> {
        self.metrics.request("pull");
        pull::pull(self, params, results).await
    }

    fn health(
        self: capnp::capability::Rc<Self>,
        _: slave::HealthParams,
        mut results: slave::HealthResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("health");
        let snapshot = self.store.snapshot();
        let mut answer = results.get();
        answer.set_vectors(snapshot.vector_count());
        answer.set_bytes(snapshot.byte_size());
        answer.set_read_bytes(self.read.get());
        answer.set_sent_bytes(self.sent.bytes());
        answer.set_certificate_not_after(Tls::not_after_seconds(self.tls.as_ref()));
        self.write_state(answer.init_state());
        std::future::ready(Ok(()))
    }

    fn catalog(
        self: capnp::capability::Rc<Self>,
        _: slave::CatalogParams,
        mut results: slave::CatalogResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        self.metrics.request("catalog");
        let snapshot = self.store.snapshot();
        let vids: Vec<u64> = snapshot.vids().collect();
        let answer = u32::try_from(vids.len() * 8)
            .map_err(|_| wire::failed("too many vids for one catalog message"))
            .map(|len| {
                let out = results.get().init_vids(len);
                out.copy_from_slice(bytemuck::cast_slice(&vids));
            });
        std::future::ready(answer)
    }
}

impl Slave {
    /// Refuses a call meant for another process than this one (`session`):
    /// the master has not checked this one's store yet.
    pub(crate) fn check_session(&self, session: u64) -> capnp::Result<()> {
        match self.session_differs(session) {
            None => Ok(()),
            Some(reason) => Err(wire::failed(reason)),
        }
    }

    /// Why a call for `session` is not for this process, if it is not.
    fn session_differs(&self, session: u64) -> Option<String> {
        (session != self.session).then(|| {
            format!(
                "{NEW_PROCESS} (session {:016x}; the call was for {session:016x}): the master \
                 checks its store before it is used again",
                self.session
            )
        })
    }

    /// Why entry `index` of a chain's machine table is not this process,
    /// if it names another session; an error if the table has no such entry.
    pub(crate) fn machine_differs(
        &self,
        machines: Machines<'_>,
        index: u32,
    ) -> capnp::Result<Option<String>> {
        if index >= machines.len() {
            return Err(wire::failed(format!(
                "a call names machine {index} of a table of {}",
                machines.len()
            )));
        }
        Ok(self.session_differs(machines.get(index).get_session()))
    }

    /// The epoch and place of a write's `stamp`, if it is for this process.
    pub(crate) fn check_stamp(&self, stamp: stamp::Reader<'_>) -> capnp::Result<(u64, Stamp)> {
        self.check_session(stamp.get_session())?;
        Ok((
            stamp.get_epoch(),
            Stamp {
                write: stamp.get_write(),
                piece: stamp.get_piece(),
            },
        ))
    }

    /// Keeps a staged piece of an import until its commit. The master
    /// commits writes in order, so one staged for an earlier write than
    /// `stamp`'s is never committed: it is removed.
    fn keep_staged(&self, stamp: Stamp, staged: Staged) {
        let mut kept = self.staged.borrow_mut();
        let stale: Vec<Stamp> = kept
            .keys()
            .filter(|s| s.write < stamp.write || **s == stamp)
            .copied()
            .collect();
        for old in stale {
            if let Some(old) = kept.remove(&old) {
                self.store.discard(old);
            }
        }
        kept.insert(stamp, staged);
    }

    /// The outcome of an import of write `stamp` (applied now or before,
    /// or why not) into `out`.
    fn write_imported(
        &self,
        out: &mut crate::bitfold_capnp::outcome::Builder<'_>,
        stamp: Stamp,
        stored: Result<Fenced<ImportStats>, StoreError>,
    ) {
        let message = match stored {
            Ok(Fenced::Applied(stats)) => {
                tracing::debug!(
                    "write {} piece {}: stored {} vectors",
                    stamp.write,
                    stamp.piece,
                    stats.vectors
                );
                self.metrics.imported(&stats);
                return out.set_ok(());
            }
            Ok(Fenced::AlreadyApplied(at)) => {
                log_applied_already(stamp, at);
                return out.set_ok(());
            }
            Ok(Fenced::OlderEpoch(newer)) => fenced(newer),
            Err(err) => format!("the slave could not store the vectors: {err}"),
        };
        let mut error = out.reborrow().init_error();
        error.set_kind(crate::bitfold_capnp::ErrorKind::Internal);
        error.set_message(message);
    }

    /// Who this slave is and the last write its store applied.
    pub(crate) fn write_state(&self, mut out: store_state::Builder<'_>) {
        let identity = self.store.identity();
        out.set_store(identity.store);
        out.set_session(self.session);
        out.set_epoch(identity.epoch);
        out.set_write(identity.applied.write);
        out.set_piece(identity.applied.piece);
    }

    /// Appends to `out` parts whose union is the union of the vectors of
    /// `runs` (in any order, overlaps allowed) as `snapshot` holds them:
    /// range aggregates where they cover a block, single vectors elsewhere.
    /// Counts the bytes read and returns them; fails with the first vid it
    /// holds no part of. It costs the runs and the stretches of vids the
    /// store holds in them, not the vids they name.
    pub(crate) fn stored_parts<'s>(
        &self,
        snapshot: &'s Snapshot,
        runs: &[VidRun],
        out: &mut Vec<VectorPart<'s>>,
    ) -> Result<u64, u64> {
        let runs = VidRun::merged(runs.to_vec());
        if let Some(missing) = snapshot.first_missing_in(&runs) {
            return Err(missing);
        }
        let cover = snapshot.cover_runs(&runs);
        self.read.set(self.read.get() + cover.stats.bytes);
        out.extend(cover.parts);
        Ok(cover.stats.bytes)
    }

    /// Takes back from the bytes read `bytes` that [`Slave::stored_parts`]
    /// counted but a union then did not read (its output was already all
    /// ones there); returns `read` less them, for a hop's report.
    pub(crate) fn unread(&self, read: u64, bytes: u64) -> u64 {
        self.read.set(self.read.get() - bytes);
        read - bytes
    }

    /// The `/metrics` page: what it counted, and its store as it is now.
    fn render_metrics(&self) -> String {
        self.metrics
            .render(self.read.get(), self.sent.bytes(), &self.store.snapshot())
    }

    /// The budget of a call that arrived at `arrived` asking for `micros`,
    /// cut to [`SlaveOptions::max_budget`].
    pub(crate) fn budget(&self, arrived: std::time::Instant, micros: u64) -> Budget {
        Budget::from_micros(arrived, micros.min(budget::micros(self.max_budget)))
    }
}

/// How a slave's refusal of a call meant for the process before it starts:
/// the master, reading it, checks the new process at once.
pub(crate) const NEW_PROCESS: &str = "it is a new slave process";

/// A new process's session: random (`RandomState` is seeded from the
/// operating system), never 0, which names no session.
fn new_session() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}

/// The number of bits in the union `plan` was made from, without keeping
/// it, and the bytes of `inputs` the fill left unread.
fn count_union(plan: &UnionPlan, inputs: &[VectorPart<'_>]) -> (u64, u64) {
    let mut words = Vec::new();
    let (mut count, mut unread) = (0, 0);
    for (i, planned) in plan.parts().iter().enumerate() {
        words.clear();
        words.resize(planned.dense_word_count(), 0);
        unread += plan.fill(i, inputs, &mut words).total();
        count += planned.with_words(&words).cardinality();
    }
    (count, unread)
}
