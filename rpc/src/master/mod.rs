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
//! (`probe`). An import goes to every owner of each vector before its vid is
//! recorded (`import`).

mod answer;
mod import;
mod options;
mod plan;
mod probe;
mod recorded;
mod reply;
mod slaves;
mod trace;

pub use options::MasterOptions;
pub use plan::{CoordinatorPolicy, PlanChoice};
pub use reply::MAX_DATA_BYTES;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;

use crate::bitfold_capnp::master;
use crate::catalog::Catalog;
use crate::client::ErrorKind;
use crate::metrics::{self, MasterMetrics};
use crate::net::{self, Pool};
use crate::slave::handler::FailedMachine;
use reply::{Failure, write_found};
use slaves::SlaveState;
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
    let catalog = Catalog::open(&options.data_dir).map_err(crate::Error::Catalog)?;
    recorded::check_group(
        catalog.directory(),
        options.cluster.group,
        !catalog.is_empty(),
    )
    .map_err(crate::Error::Config)?;
    net::block_on_local(async move {
        let listener = net::bind(&options.listen).await?;
        let addr = net::local_addr(&listener)?;
        let slaves = vec![SlaveState::unknown(); options.cluster.slaves.len()];
        let tls = options.tls.clone();
        let state = Rc::new(Master {
            options,
            catalog: RefCell::new(catalog),
            slaves: RefCell::new(slaves),
            pool: Pool::new(net::Sent::default(), tls.clone()),
            turn: Cell::new(0),
            metrics: MasterMetrics::new(),
            sent: net::Sent::default(),
        });
        if let Some(listen) = &state.options.metrics {
            let master = state.clone();
            metrics::serve(listen, move || master.render_metrics()).await?;
        }
        let sent = state.sent.clone();
        state.probe_round().await;
        tokio::task::spawn_local(probe::probe_loop(state.clone()));
        let client: master::Client = capnp_rpc::new_client_from_rc(state);
        on_ready(addr);
        tokio::select! {
            () = net::accept_loop(listener, client.client, sent, tls) => {}
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
    /// Counts range queries, for round-robin coordinators.
    turn: Cell<usize>,
    /// What it counts for `/metrics`.
    metrics: MasterMetrics,
    /// Bytes its DBMS connections have sent.
    sent: net::Sent,
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
            self.metrics
                .transition(&self.options.cluster.slaves[index].name, false);
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

    /// The `/metrics` page: what it counted, and each slave up or down now.
    fn render_metrics(&self) -> String {
        let slaves = self.slaves.borrow();
        let names = self.options.cluster.slaves.iter().map(|s| s.name.as_str());
        let up = slaves.iter().map(|s| s.up);
        self.metrics.render(names.zip(up), self.sent.bytes())
    }

    fn live(&self) -> Vec<usize> {
        let slaves = self.slaves.borrow();
        (0..slaves.len()).filter(|&i| slaves[i].up).collect()
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
}

impl master::Server for Master {
    async fn query(
        self: capnp::capability::Rc<Self>,
        params: master::QueryParams,
        mut results: master::QueryResults,
    ) -> Result<(), capnp::Error> {
        let params = params.get()?;
        let message = params.get_message()?.as_bytes();
        let trace = Trace::new();
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
        let params = params.get()?;
        let bytes = params.total_size()?.word_count * 8;
        let vectors = params.get_vectors()?;
        let count = vectors.len();
        let outcome = self.import_vectors(vectors).await;
        let mut out = results.get().init_outcome();
        match outcome {
            Ok(()) => {
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
}
