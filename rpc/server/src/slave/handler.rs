//! The handler: one hop of a term's chain.
//!
//! The chain is a list of `MachineVecNode`s, each a run of vids, sorted by
//! machine; the receiver is the machine of the first node. It ORs the
//! vectors of its leading nodes (every part the snapshot holds for them,
//! read from the mmap) and the incoming partial result (read in place from
//! the request) with a planned union, filled straight into the `partial`
//! field of the request to the next machine, or into its own reply when the
//! chain ends here. The next machine's reply is returned up as it is: the
//! term's vector, or the machine that failed further down.

use std::cell::Cell;
use std::time::Instant;

use bitfold_engine::VectorPart;
use bitfold_engine::fold::{UnionPlan, Unread};
use capnp::capability::{Promise, Response};

use crate::bitfold_capnp::{HopKind, machine_vec_node, part, slave};
use crate::budget::{Budget, hops, micros};
use crate::chain::{self, FailedMachine, Machines, Node};
use crate::hop::{self, Hop};
use crate::wire::{self, HoleBudget};

use super::Slave;
use super::term_union::TermEnd;

/// A chain's nodes.
pub(crate) type Nodes<'a> = capnp::struct_list::Reader<'a, machine_vec_node::Owned>;

/// How a chain went from this machine on.
pub(crate) enum Step {
    /// The chain ended here; the term's vector is in the end list.
    Ended,
    /// The rest of the chain answered this (a vector or a failed machine).
    Forwarded(Response<slave::handle_results::Owned>),
    /// This machine or the next one failed.
    Failed(FailedMachine),
}

/// Where a chain that ends on this machine writes its vector.
pub(crate) trait EndTarget {
    /// A list of `parts` parts to write the vector into.
    fn init_vector(&mut self, parts: u32) -> capnp::struct_list::Builder<'_, part::Owned>;
}

impl EndTarget for slave::HandleResults {
    fn init_vector(&mut self, parts: u32) -> capnp::struct_list::Builder<'_, part::Owned> {
        self.get().init_result().init_vector(parts)
    }
}

impl EndTarget for slave::CoordinateResults {
    fn init_vector(&mut self, parts: u32) -> capnp::struct_list::Builder<'_, part::Owned> {
        self.get().init_result().init_vector(parts)
    }
}

/// Runs the chain `nodes` from this machine (the first node's) on, with the
/// incoming `partial` result. When the chain ends here, the vector goes to
/// `end`. With `report` (when the hop began), also returns
/// this hop's report, its time ending when it sent its vector on.
pub(crate) async fn handle_hop(
    slave: &Slave,
    machines: Machines<'_>,
    nodes: Nodes<'_>,
    partial: &[VectorPart<'_>],
    budget: Budget,
    end: &mut impl TermEnd,
    report: Option<Instant>,
) -> capnp::Result<(Step, Option<Hop>)> {
    if nodes.is_empty() {
        return Err(wire::failed("a handler was sent an empty chain"));
    }
    let here = nodes.get(0).get_machine();
    let mut runs = Vec::new();
    for node in nodes.iter().take_while(|n| n.get_machine() == here) {
        runs.push(Node::read(node)?.run);
    }
    if let Some(reason) = slave.machine_differs(machines, here)? {
        return Ok((
            Step::Failed(FailedMachine::at(machines, here, reason)?),
            None,
        ));
    }
    let leading = runs.len() as u32;
    let vids = chain::vid_count(&runs);
    let snapshot = slave.store.snapshot();
    let mut inputs: Vec<VectorPart<'_>> = partial.to_vec();
    let read = match slave.stored_parts(&snapshot, &runs, &mut inputs) {
        Ok(read) => read,
        Err(vid) => {
            let reason = format!("it does not hold vector {vid}, which the catalog lists");
            let failed = FailedMachine::at(machines, here, reason)?;
            return Ok((Step::Failed(failed), None));
        }
    };
    let plan = UnionPlan::new(&inputs);
    let sent = Cell::new(None);
    // Counts what the union left unread of the stored parts (after the
    // partial result's), and reports the hop.
    let report_sent = |(unread, bytes): (Unread, u64)| {
        let read = slave.unread(read, unread.bytes(partial.len()..inputs.len()));
        sent.set(
            report.map(|began| Hop::ending_now(here, HopKind::Handle, began, vids, read, bytes)),
        );
    };
    if leading == nodes.len() {
        report_sent(end.put(plan, &inputs));
        return Ok((Step::Ended, sent.get()));
    }
    let step = forward(
        slave,
        machines,
        nodes,
        leading,
        budget,
        report.is_some(),
        |params| {
            let written = wire::write_compact(|n| params.init_partial(n), &plan, &inputs);
            report_sent(written);
        },
    )
    .await?;
    Ok((step, sent.get()))
}

/// Calls `Slave.handle` on the machine of `nodes[from]` with the rest of the
/// chain from there and the partial result `write_partial` writes into the
/// request, asking for hop reports when `report`: its reply, or `Failed`
/// for a machine that cannot be reached or does not answer in time (never
/// `Ended`).
pub(crate) async fn forward(
    slave: &Slave,
    machines: Machines<'_>,
    nodes: Nodes<'_>,
    from: u32,
    budget: Budget,
    report: bool,
    write_partial: impl FnOnce(slave::handle_params::Builder<'_>),
) -> capnp::Result<Step> {
    let next = nodes.get(from).get_machine();
    let fail = |reason: String| Ok(Step::Failed(FailedMachine::at(machines, next, reason)?));
    let rest = nodes.len() - from;
    let levels_below = hops(nodes.iter().skip(from as usize).map(|n| n.get_machine())) - 1;
    let Some(time) = budget.call(levels_below) else {
        return fail("the query ran out of time before reaching it".into());
    };
    let addr = FailedMachine::at(machines, next, String::new())?.addr;
    let forwarded = slave
        .pool
        .call(&addr, time.wait, |client| {
            let mut request = client.handle_request();
            let built = (|| -> capnp::Result<()> {
                let mut params = request.get();
                params.set_machines(machines)?;
                let mut chain = params.reborrow().init_chain(rest);
                for (i, node) in nodes.iter().skip(from as usize).enumerate() {
                    let mut copy = chain.reborrow().get(i as u32);
                    copy.set_machine(node.get_machine());
                    copy.set_vid(node.get_vid());
                    copy.set_more(node.get_more());
                }
                params.set_budget_micros(micros(time.grant));
                params.set_report(report);
                write_partial(params);
                Ok(())
            })();
            match built {
                Ok(()) => Promise::from_future(request.send().promise),
                Err(err) => Promise::err(err),
            }
        })
        .await;
    match forwarded {
        Ok(response) => Ok(Step::Forwarded(response)),
        Err(reason) => fail(reason),
    }
}

/// `Slave.handle`.
pub(crate) async fn handle(
    slave: std::rc::Rc<Slave>,
    params: slave::HandleParams,
    mut results: slave::HandleResults,
) -> capnp::Result<()> {
    let arrived = Instant::now();
    let params = params.get()?;
    let budget = slave.budget(arrived, params.get_budget_micros());
    let wire_parts = wire::read_partial(params.get_partial()?, &mut HoleBudget::per_message())?;
    let partial = wire::views(&wire_parts)?;
    let report = params.get_report().then_some(arrived);
    let nodes = params.get_chain()?;
    wire::check_sized(nodes, "chain nodes")?;
    let (step, own) = handle_hop(
        &slave,
        params.get_machines()?,
        nodes,
        &partial,
        budget,
        &mut results,
        report,
    )
    .await?;
    let mut hops: Vec<Hop> = own.into_iter().collect();
    match step {
        Step::Ended => {}
        Step::Forwarded(response) => {
            // The one copy of the return path: the next machine's reply into ours.
            let reply = response.get()?;
            results.get().set_result(reply.get_result()?)?;
            if report.is_some() {
                hops.extend(hop::read_all(reply.get_hops()?)?);
            }
        }
        Step::Failed(failed) => failed.write(results.get().init_result().init_failed_machine()),
    }
    if report.is_some() {
        hop::write_all(results.get().init_hops(hops.len() as u32), &hops);
    }
    Ok(())
}
