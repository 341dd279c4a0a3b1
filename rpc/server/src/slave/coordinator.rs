//! The coordinator: runs one handler chain per term, concurrently, and
//! ANDs the term vectors.
//!
//! A chain that starts on the coordinator itself runs its handler locally,
//! without an RPC to itself. Every failed machine any chain reports is
//! collected and returned, and then nothing else: never a partial answer.
//! The term vectors are read in place from the replies (those that end
//! here are kept in memory, `term_union.rs`); the intersection is filled
//! straight into this reply, or only counted when the master wants a count.

use std::time::Instant;

use bitfold_engine::VectorPart;
use bitfold_engine::fold::{IntersectionPlan, intersection_count};
use capnp::capability::Response;

use crate::bitfold_capnp::{HopKind, PlanKind, Want, query_return_value, slave};
use crate::budget::Budget;
use crate::chain::{FailedMachine, Machines, Node};
use crate::hop::{self, Hop};
use crate::wire::{self, HoleBudget, WirePart};

use super::handler::{self, Nodes, Step};
use super::term_union::{TermEnd, TermUnion};
use super::{Slave, fan_out};

/// How one term's chain ended.
enum TermVector {
    /// The chain held no vid: the empty vector.
    Empty,
    /// The chain ended on this machine, or the fan-out's term: the vector
    /// kept in memory here.
    Union(TermUnion),
    /// Another machine answered (a vector or a failed machine).
    Remote(Response<slave::handle_results::Owned>),
    /// A machine failed.
    Failed(FailedMachine),
}

/// A term vector's parts as the AND reads them.
enum TermParts<'t> {
    /// Read in place from a message.
    Wire(Vec<WirePart<'t>>),
    /// Kept in memory.
    Union(&'t TermUnion),
}

impl TermParts<'_> {
    /// The validated views of the parts.
    fn views(&self) -> capnp::Result<Vec<VectorPart<'_>>> {
        match self {
            TermParts::Wire(parts) => wire::views(parts),
            TermParts::Union(union) => Ok(union.views()),
        }
    }
}

/// Why a term has no parts to AND.
enum NoParts {
    /// A machine of its chain failed: the answer names it.
    Failed(FailedMachine),
    /// A reply did not read: the call fails with it.
    Unreadable(capnp::Error),
}

impl From<capnp::Error> for NoParts {
    fn from(err: capnp::Error) -> Self {
        NoParts::Unreadable(err)
    }
}

impl TermVector {
    /// The term's parts, read in place.
    fn parts(&self) -> Result<TermParts<'_>, NoParts> {
        match self {
            TermVector::Empty => Ok(TermParts::Wire(Vec::new())),
            TermVector::Union(union) => Ok(TermParts::Union(union)),
            TermVector::Remote(response) => {
                let which = response.get()?.get_result()?.which();
                match which.map_err(capnp::Error::from)? {
                    query_return_value::Vector(list) => Ok(TermParts::Wire(wire::read_partial(
                        list?,
                        &mut HoleBudget::per_message(),
                    )?)),
                    query_return_value::FailedMachine(failed) => {
                        Err(NoParts::Failed(FailedMachine::read(failed?)?))
                    }
                }
            }
            TermVector::Failed(failed) => Err(NoParts::Failed(failed.clone())),
        }
    }
}

/// Whether the master asked for hop reports, and the chain being run.
#[derive(Clone, Copy)]
struct Reporting {
    /// The master asked for them.
    on: bool,
    /// The index of the chain (its term) in the coordinate call.
    term: u32,
}

/// Starts a non-empty chain: runs it from here when it starts here (a
/// chain that ends here writes its vector into `end`), else calls its
/// first machine. With reports on, also returns the chain's hops.
async fn start_chain(
    slave: &Slave,
    machines: Machines<'_>,
    you: u32,
    nodes: Nodes<'_>,
    budget: Budget,
    end: &mut impl TermEnd,
    reporting: Reporting,
) -> capnp::Result<(Step, Vec<Hop>)> {
    let (step, own) = if nodes.get(0).get_machine() == you {
        let began = reporting.on.then(Instant::now);
        handler::handle_hop(slave, machines, nodes, &[], budget, end, began).await?
    } else {
        let forwarded = handler::forward(slave, machines, nodes, 0, budget, reporting.on, |_| {});
        (forwarded.await?, None)
    };
    let mut hops: Vec<Hop> = own.into_iter().collect();
    if let (true, Step::Forwarded(response)) = (reporting.on, &step) {
        hops.extend(hop::read_all(response.get()?.get_hops()?)?);
    }
    for hop in &mut hops {
        hop.term = reporting.term;
    }
    Ok((step, hops))
}

/// The vector of one term, and its chain's hops when reported: its chain
/// run locally when it starts here, else by RPC.
async fn term_vector(
    slave: &Slave,
    machines: Machines<'_>,
    you: u32,
    nodes: Nodes<'_>,
    budget: Budget,
    reporting: Reporting,
) -> capnp::Result<(TermVector, Vec<Hop>)> {
    if nodes.is_empty() {
        return Ok((TermVector::Empty, Vec::new()));
    }
    let mut local = TermUnion::new();
    let (step, hops) =
        start_chain(slave, machines, you, nodes, budget, &mut local, reporting).await?;
    let vector = match step {
        Step::Ended => TermVector::Union(local),
        Step::Forwarded(response) => TermVector::Remote(response),
        Step::Failed(failed) => TermVector::Failed(failed),
    };
    Ok((vector, hops))
}

/// Answers a query of one term: its vector is the answer. A chain that starts
/// here ends in this reply directly, and a vector another machine returns
/// is copied into it once, instead of going through an intersection of one.
async fn answer_one_term(
    slave: &Slave,
    machines: Machines<'_>,
    you: u32,
    nodes: Nodes<'_>,
    budget: Budget,
    report: bool,
    mut results: slave::CoordinateResults,
) -> capnp::Result<()> {
    if nodes.is_empty() {
        results.get().init_result().init_vector(0);
        return Ok(());
    }
    let reporting = Reporting {
        on: report,
        term: 0,
    };
    let (step, hops) =
        start_chain(slave, machines, you, nodes, budget, &mut results, reporting).await?;
    if report {
        hop::write_all(results.get().init_hops(hops.len() as u32), &hops);
    }
    let failed = match step {
        Step::Ended => return Ok(()),
        Step::Failed(failed) => failed,
        Step::Forwarded(response) => match response.get()?.get_result()?.which()? {
            query_return_value::Vector(list) => {
                let list = list?;
                // The reply is the term's vector as the chain's end wrote it:
                // check it as the intersection path would, then copy it.
                let wire_parts = wire::read_partial(list, &mut HoleBudget::per_message())?;
                wire::terms(&[wire::views(&wire_parts)?])?;
                results.get().init_result().set_vector(list)?;
                return Ok(());
            }
            query_return_value::FailedMachine(failed) => FailedMachine::read(failed?)?,
        },
    };
    let mut list = results.get().init_result().init_failed_machines(1);
    failed.write(list.reborrow().get(0));
    Ok(())
}

/// `Slave.coordinate`.
pub(crate) async fn coordinate(
    slave: std::rc::Rc<Slave>,
    params: slave::CoordinateParams,
    results: slave::CoordinateResults,
) -> capnp::Result<()> {
    let arrived = Instant::now();
    let params = params.get()?;
    let budget = slave.budget(arrived, params.get_budget_micros());
    let machines = params.get_machines()?;
    let you = params.get_you();
    let want = params.get_want()?;
    let report = params.get_report();
    let chains = params.get_chains()?;
    wire::at_most(chains.len(), wire::MAX_CHAINS, "chains")?;
    for nodes in chains.iter() {
        wire::check_sized(nodes?, "chain nodes")?;
    }
    if let Some(reason) = slave.machine_differs(machines, you)? {
        return Err(wire::failed(reason));
    }
    if params.get_plan()? == PlanKind::FanOut {
        let chains = chains
            .iter()
            .map(|nodes| nodes?.iter().map(Node::read).collect())
            .collect::<capnp::Result<Vec<Vec<Node>>>>()?;
        let gathering = Gathering {
            you,
            want,
            budget,
            report,
        };
        return fan_out(&slave, machines, &chains, gathering, results).await;
    }
    if want == Want::Vector && chains.len() == 1 {
        let nodes = chains.get(0)?;
        return answer_one_term(&slave, machines, you, nodes, budget, report, results).await;
    }
    let mut pending = Vec::with_capacity(chains.len() as usize);
    for (term, nodes) in chains.iter().enumerate() {
        let reporting = Reporting {
            on: report,
            term: term as u32,
        };
        pending.push(term_vector(
            &slave, machines, you, nodes?, budget, reporting,
        ));
    }
    let mut outcomes = Vec::with_capacity(pending.len());
    let mut hops = Vec::new();
    for answer in futures::future::join_all(pending).await {
        let (outcome, chain_hops) = answer?;
        outcomes.push(outcome);
        hops.extend(chain_hops);
    }
    let and = report.then_some(And { you, hops });
    and_terms(&outcomes, want, and, results)
}

/// How the coordinator gathers in the fan-out plan.
#[derive(Clone, Copy)]
struct Gathering {
    /// The coordinator's index in the machine table.
    you: u32,
    want: Want,
    budget: Budget,
    /// The master asked for hop reports.
    report: bool,
}

/// The reports of an AND that the master asked for: the hops so far, to
/// which the AND adds its own.
struct And {
    /// The coordinator's index in the machine table.
    you: u32,
    hops: Vec<Hop>,
}

/// The coordinator's fan-out plan (see `fan_out.rs`): the term vectors
/// gathered from every machine at once, then ANDed as the chains' would be.
async fn fan_out(
    slave: &Slave,
    machines: Machines<'_>,
    chains: &[Vec<Node>],
    how: Gathering,
    mut results: slave::CoordinateResults,
) -> capnp::Result<()> {
    let Gathering {
        you,
        want,
        budget,
        report,
    } = how;
    let mut hops = report.then(Vec::new);
    let failures = if want == Want::Vector && chains.len() == 1 {
        // One term: its vector is the answer, written straight into the reply.
        let ends: &mut [&mut dyn TermEnd] = &mut [&mut results];
        fan_out::term_vectors(slave, machines, you, chains, budget, ends, hops.as_mut()).await?
    } else {
        let mut unions: Vec<TermUnion> = chains.iter().map(|_| TermUnion::new()).collect();
        let mut ends: Vec<&mut dyn TermEnd> =
            unions.iter_mut().map(|u| u as &mut dyn TermEnd).collect();
        let gathered = fan_out::term_vectors(
            slave,
            machines,
            you,
            chains,
            budget,
            &mut ends,
            hops.as_mut(),
        );
        let failures = gathered.await?;
        if failures.is_empty() {
            let outcomes: Vec<TermVector> = unions.into_iter().map(TermVector::Union).collect();
            let and = hops.map(|hops| And { you, hops });
            return and_terms(&outcomes, want, and, results);
        }
        failures
    };
    if let Some(hops) = &hops {
        hop::write_all(results.get().init_hops(hops.len() as u32), hops);
    }
    if !failures.is_empty() {
        write_failures(&failures, results);
    }
    Ok(())
}

/// Writes every failed machine as the coordinator's answer.
fn write_failures(failures: &[FailedMachine], mut results: slave::CoordinateResults) {
    let mut list = results
        .get()
        .init_result()
        .init_failed_machines(failures.len() as u32);
    for (i, failed) in failures.iter().enumerate() {
        failed.write(list.reborrow().get(i as u32));
    }
}

/// ANDs the term vectors of `outcomes` (or counts the AND) into `results`;
/// or answers every failed machine. With `and`, the master asked for hop
/// reports: they go into the reply with the AND's own last.
fn and_terms(
    outcomes: &[TermVector],
    want: Want,
    and: Option<And>,
    mut results: slave::CoordinateResults,
) -> capnp::Result<()> {
    let began = and.is_some().then(Instant::now);
    let mut term_parts = Vec::with_capacity(outcomes.len());
    let mut failures: Vec<FailedMachine> = Vec::new();
    for outcome in outcomes {
        match outcome.parts() {
            Ok(parts) => term_parts.push(parts),
            Err(NoParts::Failed(failed)) => {
                if !failures.iter().any(|f| f.name == failed.name) {
                    failures.push(failed);
                }
            }
            Err(NoParts::Unreadable(err)) => return Err(err),
        }
    }
    if !failures.is_empty() {
        if let Some(and) = &and {
            hop::write_all(results.get().init_hops(and.hops.len() as u32), &and.hops);
        }
        write_failures(&failures, results);
        return Ok(());
    }
    let views: Vec<Vec<VectorPart<'_>>> = term_parts
        .iter()
        .map(TermParts::views)
        .collect::<capnp::Result<_>>()?;
    let terms = wire::terms(&views)?;
    let sent = if want == Want::Count {
        results
            .get()
            .init_result()
            .set_count(intersection_count(&terms));
        size_of::<u64>() as u64
    } else {
        let plan = IntersectionPlan::new(&terms);
        let list = results
            .get()
            .init_result()
            .init_vector(plan.parts().len() as u32);
        wire::write_intersection(list, &plan, &terms);
        crate::wire::planned_bytes(plan.parts())
    };
    if let (Some(And { you, mut hops }), Some(began)) = (and, began) {
        let read = views.iter().flatten().map(VectorPart::byte_len).sum();
        hops.push(Hop::ending_now(you, HopKind::And, began, 0, read, sent));
        hop::write_all(results.get().init_hops(hops.len() as u32), &hops);
    }
    Ok(())
}
