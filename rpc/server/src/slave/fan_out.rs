//! The fan-out plan: instead of walking a chain machine by machine, the
//! coordinator asks every machine holding vids of the query, all at once,
//! for the OR of its vids of each term (`Slave.gather`), ORs the answers of
//! each term with its own vectors, and ANDs the terms.
//!
//! A term spread over `m` machines then moves `m - 1` partial results, each
//! once and straight to the coordinator, in one round trip; a chain moves
//! `m - 1` forward and as many back up, one hop after another.

use std::collections::BTreeMap;
use std::time::Instant;

use bitfold_engine::VectorPart;
use bitfold_engine::fold::UnionPlan;
use capnp::capability::{Promise, Response};

use crate::bitfold_capnp::{HopKind, gather_result, slave};
use crate::budget::Budget;
use crate::chain::{self, FailedMachine, Machines, Node, VidRun};
use crate::hop::Hop;
use crate::wire::{self, HoleBudget, WirePart};

use super::Slave;
use super::term_union::TermEnd;

/// The vids of each term on one machine: `runs[t]` for term `t`, ascending
/// and disjoint runs.
type TermRuns = Vec<Vec<VidRun>>;

/// Groups the chains' nodes by machine: for each machine, its runs of vids
/// of each term.
fn by_machine(chains: &[Vec<Node>]) -> BTreeMap<u32, TermRuns> {
    let mut machines: BTreeMap<u32, TermRuns> = BTreeMap::new();
    for (term, chain) in chains.iter().enumerate() {
        // A chain comes sorted by machine: one map lookup per machine's nodes.
        for nodes in chain.chunk_by(|a, b| a.machine == b.machine) {
            machines
                .entry(nodes[0].machine)
                .or_insert_with(|| vec![Vec::new(); chains.len()])[term]
                .extend(nodes.iter().map(|node| node.run));
        }
    }
    for terms in machines.values_mut() {
        for runs in terms {
            *runs = VidRun::merged(std::mem::take(runs));
        }
    }
    machines
}

/// `Slave.gather`: the OR of this slave's vectors of each term; with
/// `report`, and what it read and sent (its `machine` left 0: the
/// coordinator knows whom it asked).
pub(crate) fn gather(
    slave: &Slave,
    params: slave::GatherParams,
    mut results: slave::GatherResults,
) -> capnp::Result<()> {
    let params = params.get()?;
    let began = params.get_report().then(Instant::now);
    let terms = params.get_terms()?;
    wire::at_most(terms.len(), wire::MAX_CHAINS, "terms")?;
    slave.check_session(params.get_session())?;
    let snapshot = slave.store.snapshot();
    let mut inputs = Vec::with_capacity(terms.len() as usize);
    for term in terms.iter() {
        let runs = chain::read_runs(term?)?;
        let mut parts = Vec::new();
        match slave.stored_parts(&snapshot, &runs, &mut parts) {
            Ok(bytes) => inputs.push((chain::vid_count(&runs), bytes, parts)),
            Err(vid) => {
                results.get().init_result().set_missing(vid);
                return Ok(());
            }
        }
    }
    // Planned term by term: the terms left for the coordinator to ask
    // again are planned then, not here too.
    let planned = inputs.iter().map(|(_, _, parts)| {
        let plan = UnionPlan::new(parts);
        let bytes = crate::wire::planned_bytes(plan.parts());
        (plan, bytes)
    });
    let plans = wire::terms_within(planned, wire::MAX_GATHER_BYTES);
    let (mut vids_read, mut read, mut sent) = (0, 0, 0);
    let mut lists = results.get().init_result().init_terms(plans.len() as u32);
    for (i, ((vids, bytes, parts), plan)) in inputs.iter().zip(&plans).enumerate() {
        (vids_read, read) = (vids_read + vids, read + bytes);
        let (unread, bytes) =
            wire::write_compact(|n| lists.reborrow().init(i as u32, n), plan, parts);
        read = slave.unread(read, unread.total());
        sent += bytes;
    }
    if let Some(began) = began {
        let hop = Hop::ending_now(0, HopKind::Gather, began, vids_read, read, sent);
        hop.write(results.get().init_hop());
    }
    Ok(())
}

/// What one machine answered to a gather.
enum Gathered {
    /// The term vectors of the machine, in replies that hold them in
    /// order (one, unless they were too large for one).
    Terms(Vec<Response<slave::gather_results::Owned>>),
    /// It failed.
    Failed(FailedMachine),
}

/// Asks `machine` for the OR of its `vids` of each term, and for its hop
/// report when `report`; asks again for the terms a reply left out, which
/// did not fit in it ([`wire::MAX_GATHER_BYTES`]).
async fn ask(
    slave: &Slave,
    machines: Machines<'_>,
    machine: u32,
    runs: &TermRuns,
    budget: Budget,
    report: bool,
) -> capnp::Result<Gathered> {
    let fail = |reason: String| {
        Ok(Gathered::Failed(FailedMachine::at(
            machines, machine, reason,
        )?))
    };
    let addr = FailedMachine::at(machines, machine, String::new())?.addr;
    let session = machines.get(machine).get_session();
    let mut replies = Vec::new();
    let mut first = 0;
    while first < runs.len() {
        let Some(time) = budget.call(0) else {
            return fail("the query ran out of time before reaching it".into());
        };
        let asked = &runs[first..];
        let answer = slave
            .pool
            .call(&addr, time.wait, |client| {
                let mut request = client.gather_request();
                request.get().set_report(report);
                request.get().set_session(session);
                let mut terms = request.get().init_terms(asked.len() as u32);
                for (i, term) in asked.iter().enumerate() {
                    terms.set(i as u32, bytemuck::cast_slice(&chain::runs_bytes(term)));
                }
                Promise::from_future(request.send().promise)
            })
            .await;
        let response = match answer {
            Ok(response) => response,
            Err(reason) => return fail(reason),
        };
        let answered = match response.get()?.get_result()?.which()? {
            gather_result::Terms(terms) => terms?.len() as usize,
            gather_result::Missing(vid) => {
                return fail(format!(
                    "it does not hold vector {vid}, which the catalog lists"
                ));
            }
        };
        if answered == 0 || answered > asked.len() {
            return fail("it answered the wrong number of terms".to_string());
        }
        replies.push(response);
        first += answered;
    }
    Ok(Gathered::Terms(replies))
}

/// Gathers the term vectors of `chains` by fan-out and puts each into its
/// own `end`; returns every machine that failed, and then puts none (none
/// failed when they were put). With `hops`, every
/// machine's gather report is added to it, the coordinator's own (its
/// vids, and the unions it wrote) last.
pub(crate) async fn term_vectors(
    slave: &Slave,
    machines: Machines<'_>,
    you: u32,
    chains: &[Vec<Node>],
    budget: Budget,
    ends: &mut [&mut dyn TermEnd],
    mut hops: Option<&mut Vec<Hop>>,
) -> capnp::Result<Vec<FailedMachine>> {
    let by_machine = by_machine(chains);
    let report = hops.is_some();
    let asked: Vec<_> = by_machine
        .iter()
        .filter(|&(&machine, _)| machine != you)
        .map(|(&machine, runs)| async move {
            let answer = ask(slave, machines, machine, runs, budget, report).await;
            (machine, answer)
        })
        .collect();
    let answers = futures::future::join_all(asked).await;
    let began = report.then(Instant::now);
    let snapshot = slave.store.snapshot();
    let mut own: Vec<Vec<VectorPart<'_>>> = vec![Vec::new(); chains.len()];
    let mut failures = Vec::new();
    let (mut own_vids, mut own_read) = (0, 0);
    if let Some(runs) = by_machine.get(&you) {
        for (term, runs) in runs.iter().enumerate() {
            match slave.stored_parts(&snapshot, runs, &mut own[term]) {
                Ok(bytes) => own_read += bytes,
                Err(vid) => {
                    let reason = format!("it does not hold vector {vid}, which the catalog lists");
                    failures.push(FailedMachine::at(machines, you, reason)?);
                }
            }
            own_vids += chain::vid_count(runs);
        }
    }
    let mut responses = Vec::new();
    for (machine, answer) in answers {
        match answer? {
            Gathered::Terms(replies) => {
                for response in &replies {
                    if let Some(hops) = hops.as_deref_mut() {
                        let mut hop = Hop::read(response.get()?.get_hop()?)?;
                        hop.machine = machine;
                        hops.push(hop);
                    }
                }
                responses.push(replies);
            }
            Gathered::Failed(failed) => failures.push(failed),
        }
    }
    if !failures.is_empty() {
        failures.dedup_by(|a, b| a.name == b.name);
        return Ok(failures);
    }
    let mut remote: Vec<Vec<WirePart<'_>>> = chains.iter().map(|_| Vec::new()).collect();
    for replies in &responses {
        let mut term = 0;
        for response in replies {
            let gather_result::Terms(terms) = response.get()?.get_result()?.which()? else {
                unreachable!("ask keeps only answers with terms");
            };
            let mut budget = HoleBudget::per_message();
            for list in terms? {
                remote[term].extend(wire::read_partial(list?, &mut budget)?);
                term += 1;
            }
        }
    }
    let mut sent = 0;
    for (term, end) in ends.iter_mut().enumerate() {
        // The other machines' ORs first: they are the likeliest to be full.
        let mut inputs = wire::views(&remote[term])?;
        let received = inputs.len();
        inputs.append(&mut own[term]);
        let (unread, bytes) = end.put(UnionPlan::new(&inputs), &inputs);
        own_read = slave.unread(own_read, unread.bytes(received..inputs.len()));
        sent += bytes;
    }
    if let (Some(hops), Some(began)) = (hops, began) {
        let hop = Hop::ending_now(you, HopKind::Gather, began, own_vids, own_read, sent);
        hops.push(hop);
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_grouped_by_machine_and_term() {
        let node = |machine, first, last| Node {
            machine,
            run: VidRun { first, last },
        };
        let run = |first, last| VidRun { first, last };
        let chains = vec![
            vec![node(0, 4, 4), node(2, 9, 12), node(2, 1, 1), node(2, 2, 3)],
            vec![node(2, 5, 5), node(1, 3, 3)],
        ];
        let grouped = by_machine(&chains);
        assert_eq!(grouped[&0], vec![vec![run(4, 4)], vec![]]);
        assert_eq!(grouped[&1], vec![vec![], vec![run(3, 3)]]);
        assert_eq!(
            grouped[&2],
            vec![vec![run(1, 3), run(9, 12)], vec![run(5, 5)]]
        );
    }
}
