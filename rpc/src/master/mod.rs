//! The master: serves the DBMS interface (`Master` in `schema/bitfold.capnp`).
//!
//! A query is parsed ([`crate::query`]), planned over the durable catalog
//! ([`crate::catalog`]) with placement ([`crate::placement`]): one chain per
//! term, one live owner per vid. A coordinator is picked by
//! [`CoordinatorPolicy`] and runs the chains. A point query is one `fetch`
//! from a live owner. The answer is converted into the asked form straight
//! into the reply.
//!
//! Failures: every call has a deadline from the query's budget. A machine
//! that fails (refused, reset, timed out, or reported as `failedMachine`)
//! is marked down and the query is planned again on the other owners, at
//! most [`MasterOptions::attempts`] times, all within
//! [`MasterOptions::query_timeout`]. A down slave is probed in the
//! background every [`MasterOptions::probe_interval`] and used again once
//! it answers and its catalog is merged. When some needed vector has no
//! live owner the answer is `unavailable`, naming the machines: never a
//! partial answer.

mod plan;
mod slaves;

pub use plan::{CoordinatorPolicy, PlanChoice};

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use bitfold_engine::fold::Term;
use bitfold_engine::{VectorPart, portable, words};
use capnp::capability::{Promise, Response};

use crate::bitfold_capnp::{
    Format as WireFormat, PlanKind, Want, coordinate_result, fetch_result, master, result, slave,
};
use crate::budget::{Budget, micros};
use crate::catalog::Catalog;
use crate::client::ErrorKind;
use crate::cluster::ClusterConfig;
use crate::net::{self, Pool};
use crate::placement;
use crate::query::{self, Limits, Query};
use crate::slave::handler::FailedMachine;
use crate::wire::{self, PartList};
use plan::Plan;
use slaves::SlaveState;

/// The most bytes one Cap'n Proto `Data` holds: the limit of a `words` or
/// `roaring` answer.
pub const MAX_DATA_BYTES: usize = (1 << 29) - 1;

/// How a master serves.
#[derive(Debug, Clone)]
pub struct MasterOptions {
    /// Where to listen, `HOST:PORT` (port 0 picks a free one).
    pub listen: String,
    /// The slaves and the number of replicas.
    pub cluster: ClusterConfig,
    /// Where the catalog lives (created if missing).
    pub data_dir: PathBuf,
    /// How the coordinator of a query is picked.
    pub policy: CoordinatorPolicy,
    /// How the coordinator gathers the term vectors: chains, fan-out, or
    /// the cheaper by the cost model (default).
    pub plan: PlanChoice,
    /// The longest one attempt (a coordinate or fetch call with everything
    /// under it) may take (default 5 s).
    pub rpc_timeout: Duration,
    /// How many times a query is planned and tried (default 3).
    pub attempts: u32,
    /// Every query is answered or failed within this (default 30 s).
    pub query_timeout: Duration,
    /// How often a down slave is probed (default 1 s).
    pub probe_interval: Duration,
    /// The longest an import may wait for an owner that is up (default 30 s;
    /// an owner already marked down gets `rpc_timeout`).
    pub import_timeout: Duration,
    /// Size limits on query messages.
    pub limits: Limits,
    /// The most existing vectors the terms of one query may hold in all
    /// (default 2^24: the chains of a query travel in one message).
    pub max_query_vectors: usize,
}

impl MasterOptions {
    /// Options with the defaults for everything but the address, cluster and directory.
    pub fn new(
        listen: impl Into<String>,
        cluster: ClusterConfig,
        data_dir: impl Into<PathBuf>,
    ) -> MasterOptions {
        MasterOptions {
            listen: listen.into(),
            cluster,
            data_dir: data_dir.into(),
            policy: CoordinatorPolicy::default(),
            plan: PlanChoice::default(),
            rpc_timeout: Duration::from_secs(5),
            attempts: 3,
            query_timeout: Duration::from_secs(30),
            probe_interval: Duration::from_secs(1),
            import_timeout: Duration::from_secs(30),
            limits: Limits::default(),
            max_query_vectors: 1 << 24,
        }
    }

    /// How long a health call may take: short, so status stays quick.
    fn health_timeout(&self) -> Duration {
        self.rpc_timeout.min(Duration::from_secs(2))
    }
}

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
    let catalog = Catalog::open(&options.data_dir)?;
    net::block_on_local(async move {
        let listener = net::bind(&options.listen).await?;
        let addr = net::local_addr(&listener)?;
        let slaves = vec![SlaveState::unknown(); options.cluster.slaves.len()];
        let state = Rc::new(Master {
            options,
            catalog: RefCell::new(catalog),
            slaves: RefCell::new(slaves),
            pool: Pool::default(),
            turn: Cell::new(0),
        });
        state.probe_round().await;
        tokio::task::spawn_local(probe_loop(state.clone()));
        let client: master::Client = capnp_rpc::new_client_from_rc(state);
        on_ready(addr);
        tokio::select! {
            () = net::accept_loop(listener, client.client, net::Sent::default()) => {}
            () = stop => {}
        }
        Ok(())
    })?
}

/// The master's state, shared by every connection.
struct Master {
    options: MasterOptions,
    catalog: RefCell<Catalog>,
    slaves: RefCell<Vec<SlaveState>>,
    pool: Pool,
    turn: Cell<usize>,
}

/// An error answer for the DBMS.
#[derive(Debug)]
struct Failure {
    kind: ErrorKind,
    message: String,
    failed_machines: Vec<String>,
}

impl Failure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            failed_machines: Vec::new(),
        }
    }

    fn internal(err: impl std::fmt::Display) -> Failure {
        Failure::new(ErrorKind::Internal, err.to_string())
    }

    fn write(&self, mut error: crate::bitfold_capnp::error::Builder<'_>) {
        error.set_kind(self.kind.to_wire());
        error.set_message(self.message.as_str());
        let mut list = error.init_failed_machines(self.failed_machines.len() as u32);
        for (i, name) in self.failed_machines.iter().enumerate() {
            list.set(i as u32, name.as_str());
        }
    }
}

/// A found vector (or its count), still in the reply it came in.
enum Found {
    Empty,
    Range(Response<slave::coordinate_results::Owned>),
    Point(Response<slave::fetch_results::Owned>),
}

async fn probe_loop(master: Rc<Master>) {
    loop {
        tokio::time::sleep(master.options.probe_interval).await;
        master.probe_round().await;
    }
}

impl Master {
    fn slave_name(&self, index: usize) -> String {
        let entry = &self.options.cluster.slaves[index];
        format!("{} ({})", entry.name, entry.addr)
    }

    fn mark_down(&self, index: usize, reason: &str) {
        let was_up = self.slaves.borrow_mut()[index].down(reason.to_owned());
        if was_up {
            tracing::warn!("slave {} is down: {reason}", self.slave_name(index));
        }
    }

    fn mark_failed(&self, failed: &FailedMachine) {
        let index = self
            .options
            .cluster
            .slaves
            .iter()
            .position(|s| s.name == failed.name);
        if let Some(index) = index {
            self.mark_down(index, &failed.reason);
        }
    }

    fn live(&self) -> Vec<usize> {
        let slaves = self.slaves.borrow();
        (0..slaves.len()).filter(|&i| slaves[i].up).collect()
    }

    /// Probes every slave that is down or whose catalog is not merged yet.
    async fn probe_round(&self) {
        let pending: Vec<usize> = {
            let slaves = self.slaves.borrow();
            (0..slaves.len())
                .filter(|&i| !slaves[i].up || !slaves[i].synced)
                .collect()
        };
        futures::future::join_all(pending.into_iter().map(|i| self.probe(i))).await;
    }

    /// Asks slave `index` for its health (and its catalog, when it was not
    /// merged since the slave came up) and records what it says.
    async fn probe(&self, index: usize) {
        let addr = self.options.cluster.slaves[index].addr.clone();
        let timeout = self.options.health_timeout();
        let health = self
            .pool
            .call(&addr, timeout, |client| {
                client.health_request().send().promise
            })
            .await;
        let response = match health {
            Ok(response) => response,
            Err(reason) => return self.mark_down(index, &reason),
        };
        let counts = response.get().map(|h| (h.get_vectors(), h.get_bytes()));
        let Ok((vectors, bytes)) = counts else {
            return self.mark_down(index, "it answered health with a malformed message");
        };
        {
            let mut slaves = self.slaves.borrow_mut();
            slaves[index].vectors = vectors;
            slaves[index].bytes = bytes;
        }
        let synced = self.slaves.borrow()[index].synced;
        if !synced && let Err(reason) = self.sync_catalog(&addr).await {
            return self.mark_down(index, &reason);
        }
        if self.slaves.borrow_mut()[index].come_up() {
            tracing::info!("slave {} is up", self.slave_name(index));
        }
    }

    /// Merges the vids slave `addr` holds into the catalog (durably).
    async fn sync_catalog(&self, addr: &str) -> Result<(), String> {
        let response = self
            .pool
            .call(addr, self.options.rpc_timeout, |client| {
                client.catalog_request().send().promise
            })
            .await?;
        let vids = response
            .get()
            .and_then(|r| r.get_vids())
            .map_err(|e| format!("its catalog is malformed: {e}"))?;
        if !vids.len().is_multiple_of(8) {
            return Err("its catalog is malformed: not a whole number of vids".into());
        }
        let vids = vids
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        self.catalog
            .borrow_mut()
            .insert(vids)
            .map(|_| ())
            .map_err(|e| format!("the master could not record its catalog: {e}"))
    }

    /// The machine table every chain refers to: all slaves in cluster order.
    fn write_machines(
        &self,
        mut list: capnp::struct_list::Builder<'_, crate::bitfold_capnp::machine::Owned>,
    ) {
        for (i, entry) in self.options.cluster.slaves.iter().enumerate() {
            let mut machine = list.reborrow().get(i as u32);
            machine.set_name(entry.name.as_str());
            machine.set_addr(entry.addr.as_str());
        }
    }

    /// An `unavailable` error naming the down `machines` and why they are down.
    fn unavailable(&self, message: String, machines: &[usize]) -> Failure {
        let names = machines
            .iter()
            .map(|&i| self.options.cluster.slaves[i].name.clone())
            .collect();
        let states = self.slaves.borrow();
        let down: Vec<String> = machines
            .iter()
            .map(|&i| match &states[i].reason {
                Some(reason) => format!("{}: {reason}", self.slave_name(i)),
                None => self.slave_name(i),
            })
            .collect();
        Failure {
            kind: ErrorKind::Unavailable,
            message: format!("unavailable: {message}; down: {}", down.join("; ")),
            failed_machines: names,
        }
    }

    /// The error when every attempt failed: the machines that failed, and why.
    fn out_of_attempts(&self, tried: u32, failed: &[FailedMachine]) -> Failure {
        if failed.is_empty() {
            return Failure::new(
                ErrorKind::Unavailable,
                format!(
                    "unavailable: no answer within {}",
                    net::seconds(self.options.query_timeout)
                ),
            );
        }
        let mut names: Vec<String> = failed.iter().map(|f| f.name.clone()).collect();
        names.sort_unstable();
        names.dedup();
        let reasons: Vec<String> = failed
            .iter()
            .map(|f| format!("{} ({}): {}", f.name, f.addr, f.reason))
            .collect();
        Failure {
            kind: ErrorKind::Unavailable,
            message: format!(
                "unavailable: no answer after {tried} attempt{}; failed: {}",
                if tried == 1 { "" } else { "s" },
                reasons.join("; ")
            ),
            failed_machines: names,
        }
    }

    async fn range(
        &self,
        terms: &[query::Term],
        count: bool,
        budget: Budget,
    ) -> Result<Found, Failure> {
        let mut failed: Vec<FailedMachine> = Vec::new();
        let slaves = self.options.cluster.slaves.len();
        let mut tried = 0;
        while tried < self.options.attempts {
            tried += 1;
            let plan = {
                let states = self.slaves.borrow();
                let layout = plan::Layout {
                    slaves,
                    replicas: self.options.cluster.replicas,
                    most: self.options.max_query_vectors,
                };
                plan::plan(terms, &self.catalog.borrow(), layout, |i| states[i].up)
            };
            let chains = match plan {
                Plan::Empty => return Ok(Found::Empty),
                Plan::NoOwner { vectors, down } => {
                    return Err(
                        self.unavailable(format!("no live owner for {vectors} vectors"), &down)
                    );
                }
                Plan::TooMany { most } => {
                    return Err(Failure::new(
                        ErrorKind::TooLarge,
                        format!(
                            "too large: the terms of this query hold more than {most} existing \
                             vectors in all; narrow them or split the query"
                        ),
                    ));
                }
                Plan::Chains(chains) => chains,
            };
            let mut chains = chains;
            let turn = self.turn.get();
            self.turn.set(turn.wrapping_add(1));
            let live = self.live();
            let Some(coordinator) = plan::coordinator(self.options.policy, &chains, &live, turn)
            else {
                return Err(
                    self.unavailable("no slave is up".into(), &(0..slaves).collect::<Vec<_>>())
                );
            };
            for chain in &mut chains {
                plan::start_at(chain, coordinator as u32);
            }
            let kind = plan::gathering(self.options.plan, &chains, coordinator as u32);
            let levels = match kind {
                PlanKind::FanOut => 1,
                PlanKind::Chain => chains.iter().map(|c| hops(c)).max().unwrap_or(0),
            };
            let attempt = Budget::new(budget.remaining().min(self.options.rpc_timeout));
            let Some(time) = attempt.call(levels) else {
                break;
            };
            let addr = &self.options.cluster.slaves[coordinator].addr;
            let answer = self
                .pool
                .call(addr, time.wait, |client| {
                    let mut request = client.coordinate_request();
                    let mut params = request.get();
                    self.write_machines(params.reborrow().init_machines(slaves as u32));
                    params.set_you(coordinator as u32);
                    params.set_want(if count { Want::Count } else { Want::Vector });
                    params.set_budget_micros(micros(time.grant));
                    params.set_plan(kind);
                    let mut lists = params.init_chains(chains.len() as u32);
                    for (i, chain) in chains.iter().enumerate() {
                        let mut nodes = lists.reborrow().init(i as u32, chain.len() as u32);
                        for (j, &(machine, vid)) in chain.iter().enumerate() {
                            let mut node = nodes.reborrow().get(j as u32);
                            node.set_machine(machine);
                            node.set_vid(vid);
                        }
                    }
                    request.send().promise
                })
                .await;
            match answer {
                Ok(response) => match coordinator_failures(&response) {
                    Ok(failures) if failures.is_empty() => return Ok(Found::Range(response)),
                    Ok(failures) => {
                        for f in &failures {
                            self.mark_failed(f);
                        }
                        failed.extend(failures);
                    }
                    Err(err) => {
                        let reason = format!("it answered a malformed message: {err}");
                        self.mark_down(coordinator, &reason);
                        failed.push(self.failed(coordinator, reason));
                    }
                },
                Err(reason) => {
                    tracing::warn!(
                        "coordinator {} failed ({reason}); the query is tried again elsewhere",
                        self.slave_name(coordinator)
                    );
                    self.mark_down(coordinator, &reason);
                    failed.push(self.failed(coordinator, reason));
                }
            }
        }
        Err(self.out_of_attempts(tried, &failed))
    }

    fn failed(&self, index: usize, reason: String) -> FailedMachine {
        let entry = &self.options.cluster.slaves[index];
        FailedMachine {
            name: entry.name.clone(),
            addr: entry.addr.clone(),
            reason,
        }
    }

    async fn point(&self, vid: u64, count: bool, budget: Budget) -> Result<Found, Failure> {
        if !self.catalog.borrow().contains(vid) {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("vector {vid} not found"),
            ));
        }
        let owners = placement::owners(
            vid,
            self.options.cluster.slaves.len(),
            self.options.cluster.replicas,
        );
        let mut failed: Vec<FailedMachine> = Vec::new();
        let mut tried = 0;
        while tried < self.options.attempts {
            tried += 1;
            let owner = owners.iter().copied().find(|&o| self.slaves.borrow()[o].up);
            let Some(owner) = owner else {
                return Err(self.unavailable(format!("no live owner for vector {vid}"), &owners));
            };
            let attempt = Budget::new(budget.remaining().min(self.options.rpc_timeout));
            let Some(time) = attempt.call(0) else {
                break;
            };
            let addr = &self.options.cluster.slaves[owner].addr;
            let answer = self
                .pool
                .call(addr, time.wait, |client| {
                    let mut request = client.fetch_request();
                    request.get().set_vid(vid);
                    request
                        .get()
                        .set_want(if count { Want::Count } else { Want::Vector });
                    request.send().promise
                })
                .await;
            let reason = match answer {
                Ok(response) => match fetch_found(&response) {
                    Ok(true) => return Ok(Found::Point(response)),
                    Ok(false) => format!("it does not hold vector {vid}, which the catalog lists"),
                    Err(err) => format!("it answered a malformed message: {err}"),
                },
                Err(reason) => reason,
            };
            self.mark_down(owner, &reason);
            failed.push(self.failed(owner, reason));
        }
        Err(self.out_of_attempts(tried, &failed))
    }

    async fn answer(&self, message: &[u8], format: WireFormat) -> Result<Found, Failure> {
        let query = query::parse(message, &self.options.limits)
            .map_err(|e| Failure::new(ErrorKind::BadQuery, e.to_string()))?;
        let budget = Budget::new(self.options.query_timeout);
        let count = format == WireFormat::Count;
        let work = async {
            match &query {
                Query::Point(vid) => self.point(*vid, count, budget).await,
                Query::Range(terms) => {
                    // AND is idempotent and commutative: each distinct term once.
                    let mut terms = terms.clone();
                    terms.sort_unstable_by_key(|t| (t.first, t.last));
                    terms.dedup();
                    self.range(&terms, count, budget).await
                }
            }
        };
        match tokio::time::timeout(self.options.query_timeout, work).await {
            Ok(found) => found,
            Err(_) => Err(Failure::new(
                ErrorKind::Unavailable,
                format!(
                    "unavailable: no answer within {}",
                    net::seconds(self.options.query_timeout)
                ),
            )),
        }
    }
}

/// Levels of calls below a coordinator running `chain`.
fn hops(chain: &[(u32, u64)]) -> usize {
    chain.chunk_by(|a, b| a.0 == b.0).count()
}

fn coordinator_failures(
    response: &Response<slave::coordinate_results::Owned>,
) -> capnp::Result<Vec<FailedMachine>> {
    match response.get()?.get_result()?.which()? {
        coordinate_result::FailedMachines(list) => list?.iter().map(FailedMachine::read).collect(),
        coordinate_result::Vector(_) | coordinate_result::Count(_) => Ok(Vec::new()),
    }
}

fn fetch_found(response: &Response<slave::fetch_results::Owned>) -> capnp::Result<bool> {
    Ok(!matches!(
        response.get()?.get_result()?.which()?,
        fetch_result::NotFound(())
    ))
}

/// Writes what was found into the reply, in `format`.
fn write_found(found: &Found, format: WireFormat, out: result::Builder<'_>) -> Result<(), Failure> {
    let list: Option<PartList<'_>> = match found {
        Found::Empty => None,
        Found::Range(response) => {
            match response
                .get()
                .and_then(|r| r.get_result())
                .and_then(|r| Ok(r.which()?))
            {
                Ok(coordinate_result::Vector(list)) => Some(list.map_err(Failure::internal)?),
                Ok(coordinate_result::Count(count)) => return write_count(count, format, out),
                Ok(coordinate_result::FailedMachines(_)) => {
                    return Err(Failure::internal("a failed answer was taken for a vector"));
                }
                Err(err) => return Err(Failure::internal(err)),
            }
        }
        Found::Point(response) => {
            match response
                .get()
                .and_then(|r| r.get_result())
                .and_then(|r| Ok(r.which()?))
            {
                Ok(fetch_result::Vector(list)) => Some(list.map_err(Failure::internal)?),
                Ok(fetch_result::Count(count)) => return write_count(count, format, out),
                Ok(fetch_result::NotFound(())) => {
                    return Err(Failure::internal("a missing vector was taken for one"));
                }
                Err(err) => return Err(Failure::internal(err)),
            }
        }
    };
    let wire_parts = match list {
        Some(list) => wire::read_parts(list).map_err(Failure::internal)?,
        None => Vec::new(),
    };
    let parts = wire::views(&wire_parts).map_err(Failure::internal)?;
    // The forms below need key-disjoint ascending parts: check, never panic.
    Term::new(&parts).map_err(Failure::internal)?;
    write_vector(&parts, format, out)
}

fn write_count(
    count: u64,
    format: WireFormat,
    mut out: result::Builder<'_>,
) -> Result<(), Failure> {
    if format != WireFormat::Count {
        return Err(Failure::internal(
            "a count was answered where a vector was asked",
        ));
    }
    out.set_count(count);
    Ok(())
}

/// Converts `parts` (key-disjoint, ascending) into `format`, straight into the reply.
fn write_vector(
    parts: &[VectorPart<'_>],
    format: WireFormat,
    mut out: result::Builder<'_>,
) -> Result<(), Failure> {
    match format {
        WireFormat::Count => {
            out.set_count(parts.iter().map(|p| p.cardinality()).sum());
        }
        WireFormat::Words => {
            let len = words::word_len(parts);
            let bytes = len * 8;
            if bytes > MAX_DATA_BYTES {
                return Err(Failure::new(
                    ErrorKind::TooLarge,
                    format!(
                        "too large: the words form of this answer is {bytes} bytes (it holds a bit at \
                         or above {}), more than one message carries ({MAX_DATA_BYTES} bytes); \
                         ask for roaring or count instead",
                        (1u64 << 32) - 64
                    ),
                ));
            }
            let data = out.init_words(bytes as u32);
            match bytemuck::try_cast_slice_mut::<u8, u64>(&mut *data) {
                Ok(target) => words::write_words(parts, target),
                Err(_) => {
                    let mut scratch = vec![0u64; len];
                    words::write_words(parts, &mut scratch);
                    data.copy_from_slice(bytemuck::cast_slice(&scratch));
                }
            }
        }
        WireFormat::Roaring => {
            let size = portable::serialized_size(parts);
            if size > MAX_DATA_BYTES {
                return Err(Failure::new(
                    ErrorKind::TooLarge,
                    format!(
                        "too large: the roaring form of this answer is {size} bytes, more than one \
                         message carries ({MAX_DATA_BYTES} bytes); ask for count instead"
                    ),
                ));
            }
            portable::write(parts, out.init_roaring(size as u32));
        }
    }
    Ok(())
}

impl master::Server for Master {
    async fn query(
        self: capnp::capability::Rc<Self>,
        params: master::QueryParams,
        mut results: master::QueryResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let message = params.get_message()?.as_bytes();
        let outcome = match params.get_format() {
            Ok(format) => match self.answer(message, format).await {
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
        if let Err(failure) = outcome {
            failure.write(results.get().init_result().init_error());
        }
        Ok(())
    }

    async fn import(
        self: capnp::capability::Rc<Self>,
        params: master::ImportParams,
        mut results: master::ImportResults,
    ) -> Result<(), capnp::Error> {
        let vectors = params.get()?.get_vectors()?;
        let outcome = self.import_vectors(vectors).await;
        let mut out = results.get().init_outcome();
        match outcome {
            Ok(()) => out.set_ok(()),
            Err(failure) => failure.write(out.init_error()),
        }
        Ok(())
    }

    async fn status(
        self: capnp::capability::Rc<Self>,
        _: master::StatusParams,
        mut results: master::StatusResults,
    ) -> Result<(), capnp::Error> {
        let all = 0..self.options.cluster.slaves.len();
        futures::future::join_all(all.map(|i| self.probe(i))).await;
        let slaves = self.slaves.borrow();
        let mut list = results.get().init_slaves(slaves.len() as u32);
        for (i, (state, entry)) in slaves.iter().zip(&self.options.cluster.slaves).enumerate() {
            let mut out = list.reborrow().get(i as u32);
            out.set_name(entry.name.as_str());
            out.set_addr(entry.addr.as_str());
            out.set_up(state.up);
            let since = state
                .since
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            out.set_since_unix_millis(since);
            out.set_vectors(state.vectors);
            out.set_bytes(state.bytes);
            out.set_reason(state.reason.as_deref().unwrap_or(""));
        }
        Ok(())
    }
}

impl Master {
    /// Sends every non-empty vector to all its owners, then records the vids.
    async fn import_vectors(
        &self,
        vectors: capnp::struct_list::Reader<'_, crate::bitfold_capnp::vid_vector::Owned>,
    ) -> Result<(), Failure> {
        let slaves = self.options.cluster.slaves.len();
        let mut by_owner: Vec<Vec<u32>> = vec![Vec::new(); slaves];
        let mut vids = Vec::new();
        for (i, vector) in vectors.iter().enumerate() {
            let vid = vector.get_vid();
            let bad = |e: capnp::Error| {
                Failure::new(
                    ErrorKind::Internal,
                    format!("vector {vid} is malformed: {e}"),
                )
            };
            let wire_parts = wire::read_parts(vector.get_parts().map_err(bad)?).map_err(bad)?;
            let parts = wire::views(&wire_parts).map_err(bad)?;
            if parts.iter().all(|p| p.is_empty()) {
                continue;
            }
            vids.push(vid);
            for owner in placement::owners(vid, slaves, self.options.cluster.replicas) {
                by_owner[owner].push(i as u32);
            }
        }
        let sends = by_owner
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.is_empty())
            .map(|(owner, entries)| {
                let entry = &self.options.cluster.slaves[owner];
                let timeout = if self.slaves.borrow()[owner].up {
                    self.options.import_timeout
                } else {
                    self.options.rpc_timeout
                };
                async move {
                    let answer = self
                        .pool
                        .call(&entry.addr, timeout, |client| {
                            let mut request = client.import_request();
                            let mut list = request.get().init_vectors(entries.len() as u32);
                            for (j, &i) in entries.iter().enumerate() {
                                if let Err(err) = list.set_with_caveats(j as u32, vectors.get(i)) {
                                    return Promise::err(err);
                                }
                            }
                            Promise::from_future(request.send().promise)
                        })
                        .await;
                    (owner, answer)
                }
            });
        let answers = futures::future::join_all(sends).await;
        let mut down = Vec::new();
        let mut reasons = Vec::new();
        for (owner, answer) in answers {
            let refused = match answer {
                Ok(response) => match response
                    .get()
                    .and_then(|r| r.get_outcome())
                    .and_then(|o| Ok(o.which()?))
                {
                    Ok(crate::bitfold_capnp::outcome::Ok(())) => None,
                    Ok(crate::bitfold_capnp::outcome::Error(error)) => {
                        let message = error
                            .and_then(|e| Ok(e.get_message()?.to_string()?))
                            .unwrap_or_else(|e| e.to_string());
                        return Err(Failure::new(
                            ErrorKind::Internal,
                            format!("slave {}: {message}", self.slave_name(owner)),
                        ));
                    }
                    Err(err) => Some(format!("it answered a malformed message: {err}")),
                },
                Err(reason) => Some(reason),
            };
            if let Some(reason) = refused {
                self.mark_down(owner, &reason);
                reasons.push(format!("{}: {reason}", self.slave_name(owner)));
                down.push(owner);
            }
        }
        if !down.is_empty() {
            let failure = self.unavailable(
                format!(
                    "the import was not recorded: every owner must store it ({}); \
                     import again once they are up",
                    reasons.join("; ")
                ),
                &down,
            );
            return Err(failure);
        }
        self.catalog
            .borrow_mut()
            .insert(vids)
            .map(|_| ())
            .map_err(|e| {
                Failure::internal(format!(
                    "the vectors are stored but the master could not record them: {e}"
                ))
            })
    }
}
