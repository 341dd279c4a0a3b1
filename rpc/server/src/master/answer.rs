//! Answering a query: plan it, call a coordinator (range) or an owner
//! (point), and try again on other machines when one fails.
//!
//! Every call has a deadline from the query's budget. A machine that fails
//! (refused, reset, timed out, or reported as `failedMachine`) is marked down
//! and the query is planned again on the other owners, at most
//! [`super::MasterOptions::attempts`] times, all within
//! [`super::MasterOptions::query_timeout`]. When some needed vector has no
//! live owner the answer is `unavailable`, naming the machines: never a
//! partial answer.

use std::future::Future;

use capnp::capability::Response;

use super::Master;
use super::plan::{self, Chain, Plan, PlanShape};
use super::probe::Writes;
use super::reply::{Failure, Found};
use super::trace::{Trace, describe_chain};
use crate::bitfold_capnp::{Format as WireFormat, PlanKind, Want, fetch_result, slave};
use crate::budget::{Budget, hops, micros};
use crate::chain::{FailedMachine, coordinator_failures};
use crate::hop;
use crate::metrics::{QueryKind, plan_label};
use crate::net;
use crate::query::{self, Query};
use bitfold_proto::ErrorKind;

/// What one attempt at a query came to.
enum Attempt {
    /// The answer.
    Found(Found),
    /// These machines failed (already marked down); try again.
    Failed(Vec<FailedMachine>),
    /// Too little time is left to make the call.
    OutOfTime,
}

impl Master {
    /// Answers `message` in `format`, or says why not; records what it
    /// did in `trace`.
    pub(super) async fn answer(
        &self,
        message: &[u8],
        format: WireFormat,
        trace: &Trace,
    ) -> Result<Vec<Found>, Failure> {
        let query = query::parse(message, &self.options.limits)
            .map_err(|e| Failure::new(ErrorKind::BadQuery, e.to_string()))?;
        trace.kind(match query {
            Query::Point(_) => QueryKind::Point,
            Query::Range(_) => QueryKind::Range,
        });
        let budget = Budget::new(self.options.query_timeout);
        let count = format == WireFormat::Count;
        let work = async {
            self.wait_for_writes_to(&query).await;
            // Entered with no await since the check: a write pinned after
            // it waits for this query before any owner applies it.
            let _in_flight = self.in_flight.enter();
            match &query {
                Query::Point(vid) => self.point(*vid, count, budget, trace).await,
                Query::Range(terms) => {
                    // AND is idempotent and commutative: each distinct term
                    // once, its spans merged (OR is too).
                    let mut terms: Vec<query::Term> = terms
                        .iter()
                        .map(|t| query::Term { spans: t.merged() })
                        .collect();
                    terms.sort_unstable_by(|a, b| a.spans.cmp(&b.spans));
                    terms.dedup();
                    self.range(&terms, count, budget, trace).await
                }
            }
        };
        match tokio::time::timeout(self.options.query_timeout, work).await {
            Ok(found) => found,
            Err(_) => Err(self.no_answer_in_time()),
        }
    }

    /// Waits while a write is being applied to a vector `query` reads more
    /// than one piece of. Its pieces' owners apply it one after another,
    /// so a query reading them meanwhile could see it half applied; a query
    /// of one piece reads each vector from its primary owner (`serving`)
    /// and needs no wait.
    async fn wait_for_writes_to(&self, query: &Query) {
        loop {
            let applied = self.records.applied();
            if !self.reads_pieces_being_written(query) {
                return;
            }
            applied.await;
        }
    }

    /// Whether `query` reads more than one piece and some of the vectors
    /// of the write being applied.
    fn reads_pieces_being_written(&self, query: &Query) -> bool {
        let writing = self.records.writing();
        if writing.is_empty() {
            return false;
        }
        let pieces = self.layout().current.pieces();
        let present = self.records.catalog().pieces(pieces);
        if present.len() < 2 {
            return false;
        }
        let spans: Vec<query::Span> = match query {
            Query::Point(vid) => vec![query::Span {
                first: *vid,
                last: *vid,
            }],
            Query::Range(terms) => terms.iter().flat_map(|t| t.spans.clone()).collect(),
        };
        present.iter().any(|&piece| {
            spans.iter().any(|span| {
                pieces
                    .keys(piece, span.first, span.last)
                    .is_some_and(|keys| writing.range(keys).next().is_some())
            })
        })
    }

    /// `failure`, naming the flag to raise where a slave was given up on
    /// for answering too slowly: a slave that is up but needs seconds (a
    /// query over vectors of billions of bits) is reported like a hung one.
    fn with_timeout_hint(&self, mut failure: Failure) -> Failure {
        if failure.message.contains(net::NO_ANSWER) {
            failure.message.push_str(&format!(
                " (if a slave named here is up but slow, as over vectors of billions of bits, \
                 raise the master's --rpc-timeout, now {})",
                net::seconds(self.options.rpc_timeout)
            ));
        }
        failure
    }

    /// Makes up to `attempts` attempts within `budget`, each given at most
    /// `rpc_timeout` of it, until one finds the answer or fails for good;
    /// records how each attempt that called a slave ended in `trace`.
    async fn with_retries<F, A>(
        &self,
        budget: Budget,
        trace: &Trace,
        mut attempt: F,
    ) -> Result<Found, Failure>
    where
        F: FnMut(Budget) -> A,
        A: Future<Output = Result<Attempt, Failure>>,
    {
        let mut failed = Vec::new();
        let mut tried = 0;
        while tried < self.options.attempts {
            tried += 1;
            if tried > 1 {
                self.metrics.retry();
            }
            let time = Budget::new(budget.remaining().min(self.options.rpc_timeout));
            let attempted = attempt(time).await;
            trace.end(|| match &attempted {
                Ok(Attempt::Found(_)) => "answered".to_owned(),
                Ok(Attempt::Failed(machines)) => failed_names(machines),
                Ok(Attempt::OutOfTime) | Err(_) => "no answer".to_owned(),
            });
            match attempted? {
                Attempt::Found(found) => return Ok(found),
                Attempt::Failed(machines) => {
                    self.metrics.failed_machines(machines.len());
                    self.check_restarted(&machines).await;
                    failed.extend(machines);
                }
                Attempt::OutOfTime => break,
            }
        }
        Err(self.out_of_attempts(tried, &failed))
    }

    /// Answers `terms` piece by piece, all pieces at once: each piece's
    /// terms are the keys of that piece of their vids, planned and
    /// answered (and retried) on their own.
    async fn range(
        &self,
        terms: &[query::Term],
        count: bool,
        budget: Budget,
        trace: &Trace,
    ) -> Result<Vec<Found>, Failure> {
        let pieces = self.layout().current.pieces();
        let present = self.records.catalog().pieces(pieces);
        let answers = present.iter().map(|&piece| {
            let terms: Vec<query::Term> = terms
                .iter()
                .map(|term| query::Term {
                    spans: term
                        .spans
                        .iter()
                        .filter_map(|span| pieces.keys(piece, span.first, span.last))
                        .map(|keys| query::Span {
                            first: *keys.start(),
                            last: *keys.end(),
                        })
                        .collect(),
                })
                .collect();
            let piece_trace = trace.piece();
            async move {
                let found = self
                    .with_retries(budget, &piece_trace, |time| {
                        self.range_attempt(&terms, count, time, &piece_trace)
                    })
                    .await;
                trace.absorb(pieces.cuts().then_some(piece), piece_trace);
                found
            }
        });
        futures::future::try_join_all(answers).await
    }

    /// Fetches every piece of vector `vid`, all at once, each from a live owner.
    async fn point(
        &self,
        vid: u64,
        count: bool,
        budget: Budget,
        trace: &Trace,
    ) -> Result<Vec<Found>, Failure> {
        let pieces = self.layout().current.pieces();
        let keys: Vec<u64> = if vid > pieces.max_vid() {
            Vec::new()
        } else {
            let catalog = self.records.catalog();
            catalog
                .pieces(pieces)
                .into_iter()
                .map(|piece| pieces.key(vid, piece))
                .filter(|&key| catalog.contains(key))
                .collect()
        };
        if keys.is_empty() {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("vector {vid} not found"),
            ));
        }
        let layout = self.layout();
        let answers = keys.into_iter().map(|key| {
            let owners = layout.read_owners(key);
            let piece_trace = trace.piece();
            async move {
                let found = self
                    .with_retries(budget, &piece_trace, |time| {
                        self.point_attempt(key, &owners, count, time, &piece_trace)
                    })
                    .await;
                trace.absorb(pieces.cuts().then_some(pieces.split(key).1), piece_trace);
                found
            }
        });
        futures::future::try_join_all(answers).await
    }

    /// Plans the terms over the live slaves and asks a coordinator for the answer.
    async fn range_attempt(
        &self,
        terms: &[query::Term],
        count: bool,
        budget: Budget,
        trace: &Trace,
    ) -> Result<Attempt, Failure> {
        let layout = self.layout();
        let slaves = layout.slaves().len();
        let turn = self.turn.take();
        let plan = {
            let shape = PlanShape {
                placement: layout.current.placement(),
                turn: turn as u64,
                most: self.options.max_query_vectors,
            };
            plan::plan(terms, &self.records.catalog(), shape, self.serving())
        };
        let mut chains = match plan {
            Plan::Empty => return Ok(Attempt::Found(Found::Empty)),
            Plan::NoOwner { vectors, down } => {
                let restarted = self.restarted(&down);
                if !restarted.is_empty() {
                    return Ok(Attempt::Failed(restarted));
                }
                let failure =
                    self.unavailable(format!("no live owner for {vectors} vectors"), &down);
                return Err(self.with_timeout_hint(failure));
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
        let live = self.slaves.live();
        let Some(coordinator) = plan::coordinator(self.options.policy, &chains, &live, turn) else {
            return Err(self.unavailable("no slave is up".into(), &(0..slaves).collect::<Vec<_>>()));
        };
        for chain in &mut chains {
            plan::start_at(chain, coordinator as u32);
        }
        let kind = plan::gathering(self.options.plan, &chains, coordinator as u32);
        let levels = match kind {
            PlanKind::FanOut => 1,
            PlanKind::Chain => chains
                .iter()
                .map(|c| hops(c.iter().map(|node| node.machine)))
                .max()
                .unwrap_or(0),
        };
        let machines = |c: &Chain| hops(c.iter().map(|node| node.machine));
        self.metrics.planned(kind, chains.iter().map(machines));
        let Some(time) = budget.call(levels) else {
            return Ok(Attempt::OutOfTime);
        };
        trace.begin(|| self.describe_plan(coordinator, kind, &chains));
        // Hop reports cost the slaves a little: asked for only when logged.
        let report = self.options.slow.is_some();
        let addr = &layout.slaves()[coordinator].addr;
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
                params.set_report(report);
                write_chains(params.init_chains(chains.len() as u32), &chains);
                request.send().promise
            })
            .await;
        if let (true, Ok(response)) = (report, &answer) {
            let reported = response
                .get()
                .and_then(|r| r.get_hops())
                .and_then(hop::read_all);
            trace.hops(reported, layout.clone());
        }
        let reason = match answer {
            Ok(response) => match response
                .get()
                .and_then(|r| coordinator_failures(r.get_result()?, slaves as u32))
            {
                Ok(failures) if failures.is_empty() => {
                    return Ok(Attempt::Found(Found::Range(response)));
                }
                Ok(failures) => {
                    for f in &failures {
                        self.mark_failed(f);
                    }
                    return Ok(Attempt::Failed(failures));
                }
                Err(err) => format!("it answered a malformed message: {err}"),
            },
            Err(reason) => {
                tracing::warn!(
                    "coordinator {} failed ({reason}); the query is tried again elsewhere",
                    self.slave_name(coordinator)
                );
                reason
            }
        };
        Ok(Attempt::Failed(vec![
            self.machine_failed(coordinator, reason),
        ]))
    }

    /// Fetches the vector or piece stored under `key` from its first live owner.
    async fn point_attempt(
        &self,
        key: u64,
        owners: &[usize],
        count: bool,
        budget: Budget,
        trace: &Trace,
    ) -> Result<Attempt, Failure> {
        let owner = owners.iter().copied().find(|&o| self.serves(o, key));
        let Some(owner) = owner else {
            let restarted = self.restarted(owners);
            if !restarted.is_empty() {
                return Ok(Attempt::Failed(restarted));
            }
            let what = self.named(key);
            let failure = self.unavailable(format!("no live owner holds {what}"), owners);
            return Err(self.with_timeout_hint(failure));
        };
        let Some(time) = budget.call(0) else {
            return Ok(Attempt::OutOfTime);
        };
        trace.begin(|| format!("fetch from {}", self.slave_name(owner)));
        let layout = self.layout();
        let addr = &layout.slaves()[owner].addr;
        let answer = self
            .pool
            .call(addr, time.wait, |client| {
                let mut request = client.fetch_request();
                request.get().set_vid(key);
                request.get().set_session(self.slaves.session(owner));
                request
                    .get()
                    .set_want(if count { Want::Count } else { Want::Vector });
                request.send().promise
            })
            .await;
        let reason = match answer {
            Ok(response) => match fetch_found(&response) {
                Ok(true) => return Ok(Attempt::Found(Found::Point(response))),
                Ok(false) => format!(
                    "it does not hold {}, which the catalog lists",
                    self.named(key)
                ),
                Err(err) => format!("it answered a malformed message: {err}"),
            },
            Err(reason) => reason,
        };
        Ok(Attempt::Failed(vec![self.machine_failed(owner, reason)]))
    }

    /// An attempt's plan for the slow-query log: the coordinator, how it
    /// gathers, and each term's chain of machines.
    fn describe_plan(&self, coordinator: usize, kind: PlanKind, chains: &[Chain]) -> String {
        let layout = self.layout();
        let name = |i: usize| layout.slaves()[i].name.clone();
        let terms: Vec<String> = chains
            .iter()
            .enumerate()
            .map(|(i, chain)| format!("term {}: {}", i + 1, describe_chain(chain, name)))
            .collect();
        format!(
            "coordinator {}, plan {}, {}",
            self.slave_name(coordinator),
            plan_label(kind),
            terms.join(", ")
        )
    }

    /// When a slave among `failed` refused a call because it restarted,
    /// asks every slave at once: those that restarted too (a whole cluster
    /// started again) are checked now, and once their stores are checked
    /// (and they have caught up) the next attempt may use them. A slave
    /// that must catch up while a write is being applied waits for a later
    /// probe: a write waits for the queries in flight, this one included.
    async fn check_restarted(&self, failed: &[FailedMachine]) {
        if failed
            .iter()
            .any(|m| m.reason.contains(crate::slave::NEW_PROCESS))
        {
            let all = 0..self.layout().slaves().len();
            futures::future::join_all(all.map(|i| self.probe(i, Writes::Try))).await;
        }
    }

    /// The slaves of `down` that are down only because another call found
    /// them restarted, not yet checked: an attempt needing them fails
    /// naming them, and the next one runs once [`Master::check_restarted`]
    /// has checked them, rather than the query failing on a slave about to
    /// serve again. (The pieces of a query, and concurrent queries, each
    /// meet such a slave on their own.)
    fn restarted(&self, down: &[usize]) -> Vec<FailedMachine> {
        let states = self.slaves.states();
        let layout = self.layout();
        down.iter()
            .filter_map(|&i| {
                let reason = states.get(i)?.reason.as_deref()?;
                let entry = layout.slaves().get(i)?;
                reason
                    .contains(crate::slave::NEW_PROCESS)
                    .then(|| FailedMachine {
                        name: entry.name.clone(),
                        addr: entry.addr.clone(),
                        reason: reason.to_owned(),
                    })
            })
            .collect()
    }

    /// Marks slave `index` down for `reason` and names it as failed.
    fn machine_failed(&self, index: usize, reason: String) -> FailedMachine {
        self.mark_down(index, &reason);
        let layout = self.layout();
        let entry = &layout.slaves()[index];
        FailedMachine {
            name: entry.name.clone(),
            addr: entry.addr.clone(),
            reason,
        }
    }

    /// The machine table every chain refers to: all slaves in cluster order.
    fn write_machines(
        &self,
        mut list: capnp::struct_list::Builder<'_, crate::bitfold_capnp::machine::Owned>,
    ) {
        for (i, entry) in self.layout().slaves().iter().enumerate() {
            let mut machine = list.reborrow().get(i as u32);
            machine.set_name(entry.name.as_str());
            machine.set_addr(entry.addr.as_str());
            machine.set_session(self.slaves.session(i));
        }
    }

    fn no_answer_in_time(&self) -> Failure {
        Failure::new(
            ErrorKind::Unavailable,
            format!(
                "unavailable: {} {} (the master's --query-timeout)",
                net::NO_ANSWER,
                net::seconds(self.options.query_timeout)
            ),
        )
    }

    /// The error when every attempt failed: the machines that failed, and why.
    fn out_of_attempts(&self, tried: u32, failed: &[FailedMachine]) -> Failure {
        if failed.is_empty() {
            return self.no_answer_in_time();
        }
        let mut names: Vec<String> = failed.iter().map(|f| f.name.clone()).collect();
        names.sort_unstable();
        names.dedup();
        let reasons: Vec<String> = failed
            .iter()
            .map(|f| format!("{} ({}): {}", f.name, f.addr, f.reason))
            .collect();
        self.with_timeout_hint(Failure {
            kind: ErrorKind::Unavailable,
            message: format!(
                "unavailable: no answer after {tried} attempt{}; failed: {}",
                if tried == 1 { "" } else { "s" },
                reasons.join("; ")
            ),
            failed_machines: names,
        })
    }
}

/// Writes the chains of a coordinate call.
fn write_chains(
    mut lists: capnp::list_list::Builder<
        '_,
        capnp::struct_list::Owned<crate::bitfold_capnp::machine_vec_node::Owned>,
    >,
    chains: &[Chain],
) {
    for (i, chain) in chains.iter().enumerate() {
        let mut nodes = lists.reborrow().init(i as u32, chain.len() as u32);
        for (j, node) in chain.iter().enumerate() {
            node.write(nodes.reborrow().get(j as u32));
        }
    }
}

/// How an attempt whose `machines` failed ended, for the slow-query log.
fn failed_names(machines: &[FailedMachine]) -> String {
    let names: Vec<String> = machines
        .iter()
        .map(|f| format!("{} ({})", f.name, f.reason))
        .collect();
    format!("failed: {}", names.join("; "))
}

fn fetch_found(response: &Response<slave::fetch_results::Owned>) -> capnp::Result<bool> {
    Ok(!matches!(
        response.get()?.get_result()?.which()?,
        fetch_result::NotFound(())
    ))
}
