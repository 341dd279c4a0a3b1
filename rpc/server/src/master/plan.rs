//! Query planning: terms to chains.
//!
//! For each term the master lists the existing vids in it (from the
//! catalog, as runs of consecutive vids: a term costs its runs, never its
//! width), picks one live owner per vid (per run of vids sharing their
//! owners, unless an owner lacks some of them: by replica class where the
//! term covers an aggregate block spanning groups, else so that the query
//! asks the fewest machines) and sorts the nodes, each a run of vids on one
//! machine, by machine: one chain per term. A term with no existing vid
//! makes the whole answer empty.

use std::fmt;
use std::str::FromStr;

use bitfold_proto::names::{self, Named};

use crate::bitfold_capnp::PlanKind;
use crate::catalog::Catalog;
use crate::chain::{self, Node, VidRun};
use crate::placement::{Placement, READ_BLOCK};
use crate::query::Term;
use bitfold_engine::store::AGGREGATE_LEVELS;

/// How the master picks a query's coordinator among the live slaves
/// (`--policy`; [`CoordinatorPolicy::NAMES`] says what each does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CoordinatorPolicy {
    /// `round-robin`, the default.
    #[default]
    RoundRobin,
    /// `random`.
    Random,
    /// `bandwidth`.
    Bandwidth,
}

impl CoordinatorPolicy {
    /// Every policy, with its name (what [`FromStr`] reads and
    /// [`fmt::Display`] writes) and what it does.
    pub const NAMES: [Named<Self>; 3] = [
        (
            CoordinatorPolicy::RoundRobin,
            "round-robin",
            "In turn, each live slave holding vectors of the most terms of the query, so that \
             the fewest partial results travel to it (the default); every live slave in turn \
             when none holds any",
        ),
        (
            CoordinatorPolicy::Random,
            "random",
            "A live slave at random",
        ),
        (
            CoordinatorPolicy::Bandwidth,
            "bandwidth",
            "The live slave that holds the most of the query's vectors, so the fewest vectors \
             cross the network to it",
        ),
    ];
}

impl FromStr for CoordinatorPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        names::parse(&Self::NAMES, s, "coordinator policy")
    }
}

impl fmt::Display for CoordinatorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(names::name_of(&Self::NAMES, *self))
    }
}

/// How the master has a query's term vectors gathered (`--plan`;
/// [`PlanChoice::NAMES`] says what each does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlanChoice {
    /// `auto`, the default.
    #[default]
    Auto,
    /// `chain`.
    Chain,
    /// `fan-out`.
    FanOut,
}

impl PlanChoice {
    /// Every plan, with its name (what [`FromStr`] reads and
    /// [`fmt::Display`] writes) and what it does.
    pub const NAMES: [Named<Self>; 3] = [
        (
            PlanChoice::Auto,
            "auto",
            "Fan-out unless the coordinator would receive too many partial results at once \
             (the default)",
        ),
        (
            PlanChoice::Chain,
            "chain",
            "One handler chain per term, machine to machine",
        ),
        (
            PlanChoice::FanOut,
            "fan-out",
            "Every machine ORs its vids of every term and answers the coordinator",
        ),
    ];
}

impl FromStr for PlanChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        names::parse(&Self::NAMES, s, "plan")
    }
}

impl fmt::Display for PlanChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(names::name_of(&Self::NAMES, *self))
    }
}

/// The most partial results a fan-out may send its coordinator. Each is up
/// to a whole vector, all held by the coordinator at once; a chain holds
/// about two per hop, so past this many it is the cheaper plan in memory.
pub(crate) const FAN_OUT_MAX_REPLIES: usize = 64;

/// The partial results a term's chain moves and a fan-out moves, given the
/// coordinator: the chain forwards its result `m - 1` times and returns it
/// as many (one more when the coordinator holds none of the term), a
/// fan-out sends one per machine other than the coordinator.
fn transfers(chain: &Chain, coordinator: u32) -> (usize, usize) {
    let mut machines: Vec<u32> = chain.iter().map(|node| node.machine).collect();
    machines.dedup();
    let m = machines.len();
    let here = usize::from(machines.contains(&coordinator));
    let chain_moves = (m.saturating_sub(1)) + (m - here);
    (chain_moves, m - here)
}

/// The plan for `chains` coordinated by `coordinator` under `choice`.
///
/// The cost model counts partial results moved between machines: a
/// fan-out never moves more than a chain and answers in one round trip, so
/// `auto` picks it unless the coordinator would receive more than
/// [`FAN_OUT_MAX_REPLIES`] of them.
pub(crate) fn gathering(choice: PlanChoice, chains: &[Chain], coordinator: u32) -> PlanKind {
    match choice {
        PlanChoice::Chain => PlanKind::Chain,
        PlanChoice::FanOut => PlanKind::FanOut,
        PlanChoice::Auto => {
            let (chain, fan_out) = chains
                .iter()
                .map(|c| transfers(c, coordinator))
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
            if fan_out <= chain && fan_out <= FAN_OUT_MAX_REPLIES {
                PlanKind::FanOut
            } else {
                PlanKind::Chain
            }
        }
    }
}

/// One chain: nodes, each a run of vids on one machine, sorted by machine
/// (then vid).
pub(crate) type Chain = Vec<Node>;

/// What a range query needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Some term holds no existing vector: the answer is the empty vector.
    Empty,
    /// One chain per term.
    Chains(Vec<Chain>),
    /// Some vectors have no live owner: how many, and their down owners.
    NoOwner { vectors: usize, down: Vec<usize> },
    /// The terms hold more than the most vectors a query may name.
    TooMany { most: usize },
}

/// What a plan depends on besides the terms, the catalog and who is up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanShape {
    /// How vids are placed.
    pub(crate) placement: Placement,
    /// The query's turn, which turns the replica a piece is read from
    /// with `group = "all"` ([`Placement::reader_among`]).
    pub(crate) turn: u64,
    /// The most existing vectors a query's terms may hold in all (the
    /// chains must fit one message).
    pub(crate) most: usize,
}

/// A stretch of a term: vids sharing their owners and read block (or one
/// vid), with where it may be read.
enum Stretch {
    /// Read from this machine.
    On(u32, VidRun),
    /// Read from whichever of these owners the query asks anyway, each
    /// able to serve it whole, the one its replica class prefers first.
    Free(VidRun, Vec<usize>),
}

/// The width of the blocks a term read by replica class covers whole: the
/// smallest aggregate blocks that span more than one group, at most a
/// [`READ_BLOCK`]. A slave answers a block spanning groups with its
/// aggregate only when asked for every vid it holds in it, which the
/// replica classes of [`Placement::reader`] arrange; and a term of whole
/// read blocks is a wide one, whose reads the classes spread over every
/// replica. A narrower block within one group is held whole by each owner,
/// so any owner answers it as cheaply.
fn class_block(group: u64) -> u64 {
    AGGREGATE_LEVELS
        .into_iter()
        .find(|&width| width > group)
        .map_or(READ_BLOCK, |width| width.min(READ_BLOCK))
}

/// Plans `terms` over `catalog`; `usable(i, run)` says whether slave `i`
/// may serve every vector of `run` (it is live and holds them all).
///
/// A stretch of a term that covers its whole [`class_block`] is read from
/// its replica class's owner. Any other stretch (a narrow term, or the ends
/// of a wide one) may be read from any owner: those are chosen so that the
/// query asks the fewest machines ([`settle`]), since each machine more is
/// a request and a partial result more.
pub(crate) fn plan(
    terms: &[Term],
    catalog: &Catalog,
    shape: PlanShape,
    usable: impl Fn(usize, VidRun) -> bool,
) -> Plan {
    let merged: Vec<_> = terms.iter().map(Term::merged).collect();
    let empty = |spans: &Vec<crate::query::Span>| {
        spans
            .iter()
            .all(|span| catalog.runs(span.first, span.last).next().is_none())
    };
    if merged.iter().any(empty) {
        return Plan::Empty;
    }
    let placement = shape.placement;
    let block = class_block(placement.group);
    let mut named = 0u64;
    let mut stretches: Vec<Vec<Stretch>> = Vec::with_capacity(terms.len());
    let mut orphans = 0;
    let mut down = Vec::new();
    for spans in &merged {
        let mut term = Vec::new();
        for span in spans {
            for run in catalog.runs(span.first, span.last) {
                // A run is cut where the owners or the preferred reader
                // change (a group or a read block ends).
                let mut first = run.first;
                loop {
                    let last = (*placement.read_run(first).end()).min(run.last);
                    let stretch = VidRun { first, last };
                    named += stretch.count();
                    if named > shape.most as u64 {
                        return Plan::TooMany { most: shape.most };
                    }
                    let owners = placement.owners(first);
                    let preferred = placement.preferred(&owners, first, shape.turn);
                    let start = first - first % block;
                    let covered = span.first <= start && span.last >= start + (block - 1);
                    let read = if covered {
                        let reader = preferred.filter(|&r| usable(r, stretch));
                        reader.map(|r| Stretch::On(r as u32, stretch))
                    } else {
                        let others = owners.iter().copied().filter(|&o| Some(o) != preferred);
                        let able: Vec<usize> = preferred
                            .into_iter()
                            .chain(others)
                            .filter(|&o| usable(o, stretch))
                            .collect();
                        match able.as_slice() {
                            [] => None,
                            [only] => Some(Stretch::On(*only as u32, stretch)),
                            _ => Some(Stretch::Free(stretch, able)),
                        }
                    };
                    if let Some(read) = read {
                        term.push(read);
                    } else {
                        // No one owner may serve it all: vid by vid.
                        for vid in stretch.vids() {
                            let one = VidRun::one(vid);
                            match placement
                                .reader_among(&owners, vid, shape.turn, |i| usable(i, one))
                            {
                                Some(owner) => term.push(Stretch::On(owner as u32, one)),
                                None => {
                                    orphans += 1;
                                    down.extend_from_slice(&owners);
                                }
                            }
                        }
                    }
                    if last == run.last {
                        break;
                    }
                    first = last + 1;
                }
            }
        }
        stretches.push(term);
    }
    if orphans > 0 {
        down.sort_unstable();
        down.dedup();
        return Plan::NoOwner {
            vectors: orphans,
            down,
        };
    }
    let asked = settle(&stretches, placement.slaves);
    let chains = stretches
        .iter()
        .map(|term| {
            let mut chain = Chain::new();
            for stretch in term {
                let (machine, run) = match stretch {
                    Stretch::On(machine, run) => (*machine, *run),
                    Stretch::Free(run, able) => {
                        let reader = able.iter().find(|&&o| asked[o]);
                        (
                            *reader.expect("settle asks a reader of every stretch") as u32,
                            *run,
                        )
                    }
                };
                chain::push(&mut chain, machine, run);
            }
            by_machine(chain)
        })
        .collect();
    Plan::Chains(chains)
}

/// The machines a query asks: every one a stretch must be read from, and
/// for the free stretches none of those can read, greedily the machine able
/// to read the most of them (the most as its class's first choice on a
/// tie, then the next in a turn that moves from query to query), until
/// each has one. A greedy set cover: within a logarithmic factor of the
/// fewest in general, and the fewest when every stretch has two owners of
/// four slaves in pairs, as a property test checks.
fn settle(stretches: &[Vec<Stretch>], slaves: usize) -> Vec<bool> {
    let mut asked = vec![false; slaves];
    for stretch in stretches.iter().flatten() {
        if let Stretch::On(machine, _) = stretch {
            asked[*machine as usize] = true;
        }
    }
    let mut open: Vec<(VidRun, &[usize])> = stretches
        .iter()
        .flatten()
        .filter_map(|stretch| match stretch {
            Stretch::Free(run, able) if !able.iter().any(|&o| asked[o]) => {
                Some((*run, able.as_slice()))
            }
            _ => None,
        })
        .collect();
    let Some(&(first, _)) = open.first() else {
        return asked;
    };
    // Ties go round the slaves, starting at a place the query's first
    // open stretch sets, so that no slave is everyone's first pick.
    let turn = (first.first % slaves as u64) as usize;
    let mut readable = vec![(0usize, 0usize); slaves];
    while !open.is_empty() {
        readable.fill((0, 0));
        for (_, able) in &open {
            for (i, &owner) in able.iter().enumerate() {
                readable[owner].0 += 1;
                readable[owner].1 += usize::from(i == 0);
            }
        }
        let best = (0..slaves)
            .max_by_key(|&s| (readable[s], std::cmp::Reverse((s + slaves - turn) % slaves)))
            .expect("a free stretch has owners");
        asked[best] = true;
        open.retain(|(_, able)| !able.contains(&best));
    }
    asked
}

/// `chain`, whose vids ascend, sorted by machine (then vid): a stable sort
/// of its nodes, each already a run of one machine's vids.
fn by_machine(mut chain: Chain) -> Chain {
    debug_assert!(chain.windows(2).all(|w| w[0].run.last < w[1].run.first));
    chain.sort_by_key(|node| node.machine);
    chain
}

/// Rotates `chain` (sorted by machine) to start at the first machine from
/// `coordinator` on, in machine order, wrapping around. Each machine is
/// still visited once, but a coordinator that holds vectors of the term
/// folds them first, locally, instead of calling the chain's head and
/// receiving the term's vector back through one more hop.
pub(crate) fn start_at(chain: &mut Chain, coordinator: u32) {
    let before = chain.partition_point(|node| node.machine < coordinator);
    chain.rotate_left(before);
}

/// The coordinator for `chains` (each sorted by machine) among the live
/// slaves, or `None` if no slave is live. `turn` counts round-robin turns.
pub(crate) fn coordinator(
    policy: CoordinatorPolicy,
    chains: &[Chain],
    live: &[usize],
    turn: usize,
) -> Option<usize> {
    if live.is_empty() {
        return None;
    }
    Some(match policy {
        CoordinatorPolicy::RoundRobin => {
            // Every term the coordinator holds none of is one more partial
            // result sent to it: take turns among the live slaves holding
            // vectors of the most terms. (One holding none of the query's
            // vectors would only add a hop to every chain.)
            // Each chain is sorted by machine: one entry per machine and term.
            let mut held: Vec<u32> = chains
                .iter()
                .flat_map(|chain| {
                    let machines = chain.chunk_by(|a, b| a.machine == b.machine);
                    machines.map(|nodes| nodes[0].machine)
                })
                .collect();
            held.sort_unstable();
            let terms_held: Vec<usize> = live
                .iter()
                .map(|&slave| {
                    u32::try_from(slave).map_or(0, |s| {
                        held.partition_point(|&m| m <= s) - held.partition_point(|&m| m < s)
                    })
                })
                .collect();
            let most = terms_held.iter().copied().max().unwrap_or(0);
            let holders: Vec<usize> = live
                .iter()
                .zip(&terms_held)
                .filter(|&(_, &terms)| most > 0 && terms == most)
                .map(|(&slave, _)| slave)
                .collect();
            let turns = if holders.is_empty() { live } else { &holders };
            turns[turn % turns.len()]
        }
        CoordinatorPolicy::Random => live[rand::random_range(0..live.len())],
        CoordinatorPolicy::Bandwidth => {
            let mut held = std::collections::HashMap::new();
            for node in chains.iter().flatten() {
                *held.entry(node.machine as usize).or_insert(0u64) += node.run.count();
            }
            // Most vectors held; the lower index on a tie.
            *live
                .iter()
                .max_by_key(|&&slave| {
                    (
                        held.get(&slave).copied().unwrap_or(0),
                        std::cmp::Reverse(slave),
                    )
                })
                .expect("live is not empty")
        }
    })
}

/// Counts range queries, for round-robin coordinators.
#[derive(Default)]
pub(super) struct Turn(std::cell::Cell<usize>);

impl Turn {
    /// This query's turn; the next one's is one more.
    pub(super) fn take(&self) -> usize {
        let turn = self.0.get();
        self.0.set(turn.wrapping_add(1));
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Span;

    /// The existing vids of `term` as runs, ascending, each vid once.
    fn runs_of<'c>(catalog: &'c Catalog, term: &Term) -> impl Iterator<Item = VidRun> + 'c {
        term.merged()
            .into_iter()
            .flat_map(move |span| catalog.runs(span.first, span.last))
    }

    fn catalog(vids: &[u64]) -> Catalog {
        Catalog::in_memory(vids.iter().copied())
    }

    fn term(first: u64, last: u64) -> Term {
        Term {
            spans: vec![Span { first, last }],
        }
    }

    /// A chain's `(machine, vid)` pairs, in chain order.
    fn pairs(chain: &Chain) -> Vec<(u32, u64)> {
        chain
            .iter()
            .flat_map(|node| node.run.vids().map(move |vid| (node.machine, vid)))
            .collect()
    }

    /// A chain of one-vid nodes.
    fn nodes(pairs: &[(u32, u64)]) -> Chain {
        pairs
            .iter()
            .map(|&(machine, vid)| Node {
                machine,
                run: VidRun::one(vid),
            })
            .collect()
    }

    fn shape(slaves: usize, replicas: usize) -> PlanShape {
        PlanShape {
            most: 1000,
            ..grouped(slaves, replicas, 1)
        }
    }

    /// `slaves` slaves, `replicas` copies, groups of `group` vids, and room
    /// for any term of these tests.
    fn grouped(slaves: usize, replicas: usize, group: u64) -> PlanShape {
        PlanShape {
            turn: 0,
            placement: Placement {
                slaves,
                replicas,
                group,
                pieces: crate::pieces::Pieces::whole(),
            },
            most: 1 << 20,
        }
    }

    #[test]
    fn chains_list_existing_vids_sorted_by_machine() {
        let vids: Vec<u64> = (0..40).chain([u64::MAX]).collect();
        let catalog = catalog(&vids);
        let Plan::Chains(chains) = plan(
            &[term(0, u64::MAX), term(5, 9)],
            &catalog,
            shape(4, 1),
            |_, _| true,
        ) else {
            panic!("a plan with chains")
        };
        let chains: Vec<Vec<(u32, u64)>> = chains.iter().map(pairs).collect();
        assert_eq!(chains[0].len(), 41);
        assert_eq!(chains[1].len(), 5);
        for chain in &chains {
            assert!(chain.windows(2).all(|w| w[0] <= w[1]));
            for &(machine, vid) in chain {
                assert_eq!(machine as usize, crate::placement::primary(vid, 4));
            }
        }
    }

    #[test]
    fn with_group_all_a_query_reads_on_one_machine_and_turns_between_replicas() {
        let catalog = catalog(&(0..3000).collect::<Vec<u64>>());
        let terms = [term(0, 2999), term(100, 163), term(1000, 1700)];
        let mut by_turn = Vec::new();
        for turn in 0..2 {
            let shape = PlanShape {
                turn,
                ..grouped(4, 2, crate::placement::GROUP_ALL)
            };
            let Plan::Chains(chains) = plan(&terms, &catalog, shape, |_, _| true) else {
                panic!("a plan with chains")
            };
            let (machines, read) = asked(&chains);
            assert_eq!(machines.len(), 1, "turn {turn}: one machine ANDs it all");
            assert_eq!(read.len(), 3000 + 64 + 701);
            by_turn.push(machines[0]);
        }
        assert_ne!(
            by_turn[0], by_turn[1],
            "the next query reads the other replica"
        );
    }

    #[test]
    fn an_empty_term_empties_the_answer() {
        let catalog = catalog(&[1, 2, 3]);
        assert_eq!(
            plan(
                &[term(1, 3), term(4, 100)],
                &catalog,
                shape(2, 1),
                |_, _| { false }
            ),
            Plan::Empty
        );
    }

    #[test]
    fn down_owners_are_replaced_by_replicas_or_reported() {
        let vids: Vec<u64> = (0..30).collect();
        let catalog = catalog(&vids);
        let Plan::Chains(chains) = plan(&[term(0, 29)], &catalog, shape(3, 2), |s, _| s != 1)
        else {
            panic!("replicas cover one down slave")
        };
        let chain = pairs(&chains[0]);
        assert!(chain.iter().all(|&(m, _)| m != 1));
        assert_eq!(chain.len(), 30);
        match plan(&[term(0, 29)], &catalog, shape(3, 1), |s, _| s != 1) {
            Plan::NoOwner { vectors, down } => {
                let on_1 = vids
                    .iter()
                    .filter(|&&v| crate::placement::primary(v, 3) == 1)
                    .count();
                assert_eq!((vectors, down), (on_1, vec![1]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_owner_lacking_a_vector_is_not_asked_for_it() {
        let vids: Vec<u64> = (0..30).collect();
        let catalog = catalog(&vids);
        let lacking = |s: usize, run: VidRun| !(s == 0 && run.vids().any(|v| v.is_multiple_of(2)));
        let Plan::Chains(chains) = plan(&[term(0, 29)], &catalog, shape(3, 2), lacking) else {
            panic!("the other owner serves what slave 0 lacks")
        };
        let chain = pairs(&chains[0]);
        assert!(chain.iter().all(|&(m, v)| m != 0 || !v.is_multiple_of(2)));
        assert!(
            chain.iter().any(|&(m, _)| m == 0),
            "slave 0 serves the rest"
        );
        assert_eq!(chain.len(), 30);
    }

    #[test]
    fn each_vid_is_read_from_its_groups_reader() {
        let vids: Vec<u64> = (0..300u64).filter(|v| v % 7 != 3).collect();
        let catalog = catalog(&vids);
        let shape = grouped(5, 2, 4);
        let placement = shape.placement;
        let up = |s: usize, v: u64| s != 2 && !(s == 4 && v.is_multiple_of(5));
        let usable = |s: usize, run: VidRun| run.vids().all(|v| up(s, v));
        let terms = [term(0, 120), term(100, 299)];
        let Plan::Chains(chains) = plan(&terms, &catalog, shape, usable) else {
            panic!("replicas cover one down slave")
        };
        for (chain, t) in chains.iter().zip(&terms) {
            let mut expected: Vec<(u32, u64)> = runs_of(&catalog, t)
                .flat_map(|run| run.vids())
                .map(|v| (placement.reader(v, |s| up(s, v)).unwrap() as u32, v))
                .collect();
            expected.sort_unstable();
            assert_eq!(pairs(chain), expected);
            let merged = chain
                .windows(2)
                .all(|w| w[0].machine != w[1].machine || w[0].run.last + 1 < w[1].run.first);
            assert!(
                merged,
                "a machine's consecutive vids share one node: {chain:?}"
            );
        }
    }

    /// The bench's cluster: 4 slaves, 2 copies, groups of 64 vids, 8,192 vectors.
    fn four_in_pairs() -> (Catalog, PlanShape) {
        (catalog(&(0..8192).collect::<Vec<u64>>()), grouped(4, 2, 64))
    }

    /// The machines `chains` ask, and each vid once with its machine.
    fn asked(chains: &[Chain]) -> (Vec<u32>, Vec<(u32, u64)>) {
        let mut machines: Vec<u32> = chains.iter().flatten().map(|n| n.machine).collect();
        machines.sort_unstable();
        machines.dedup();
        (machines, chains.iter().flat_map(pairs).collect())
    }

    proptest::proptest! {
        #[test]
        fn narrow_terms_are_read_from_the_fewest_machines(
            starts in proptest::collection::vec(0u64..8000, 1..5),
            width in 1u64..192,
        ) {
            let (catalog, shape) = four_in_pairs();
            let terms: Vec<Term> = starts.iter().map(|&s| term(s, s + width - 1)).collect();
            let Plan::Chains(chains) = plan(&terms, &catalog, shape, |_, _| true) else {
                panic!("a plan with chains")
            };
            let (machines, read) = asked(&chains);
            // Every vid of every term, once per term, from one of its owners.
            let expected: usize = starts.len() * width as usize;
            proptest::prop_assert_eq!(read.len(), expected);
            for &(machine, vid) in &read {
                proptest::prop_assert!(shape.placement.owners(vid).contains(&(machine as usize)));
            }
            // The fewest machines holding a copy of every group read.
            let groups: Vec<Vec<usize>> =
                read.iter().map(|&(_, v)| shape.placement.owners(v)).collect();
            let fewest = (1..16u32)
                .filter(|set| groups.iter().all(|g| g.iter().any(|&o| set & (1 << o) != 0)))
                .map(u32::count_ones)
                .min()
                .unwrap();
            proptest::prop_assert_eq!(machines.len() as u32, fewest);
        }
    }

    #[test]
    fn narrow_queries_spread_their_reads_as_replica_classes_do() {
        let (catalog, shape) = four_in_pairs();
        let mut vids_read = [0usize; 4];
        let mut by_class = [0usize; 4];
        for i in 0..2000u64 {
            let terms: Vec<Term> = (0..3)
                .map(|t| {
                    let start = bitfold_engine::mix::fmix64(i * 3 + t) % 8176;
                    term(start, start + 15)
                })
                .collect();
            let Plan::Chains(chains) = plan(&terms, &catalog, shape, |_, _| true) else {
                panic!("a plan with chains")
            };
            for (machine, v) in asked(&chains).1 {
                vids_read[machine as usize] += 1;
                by_class[shape.placement.reader(v, |_| true).unwrap()] += 1;
            }
        }
        // Each slave reads within a fifth of what it reads when every vid
        // is read by its replica class (the groups' owners are not quite
        // balanced over 8,192 vids, so neither share is a quarter).
        for (read, class) in vids_read.iter().zip(by_class) {
            assert!(
                read * 5 > class * 4 && read * 5 < class * 6,
                "{vids_read:?} read, {by_class:?} by replica class"
            );
        }
    }

    #[test]
    fn a_term_covering_a_read_block_keeps_its_replica_class() {
        let (catalog, shape) = four_in_pairs();
        // 256-511 is a whole read block: its 256-vid aggregate serves it only
        // if each slave is asked for every vid of it that it holds.
        let terms = [term(250, 520), term(7000, 7010)];
        let Plan::Chains(chains) = plan(&terms, &catalog, shape, |_, _| true) else {
            panic!("a plan with chains")
        };
        let read = pairs(&chains[0]);
        assert_eq!(read.len(), 271);
        for (machine, vid) in read {
            if (256..512).contains(&vid) {
                assert_eq!(
                    Some(machine as usize),
                    shape.placement.reader(vid, |_| true)
                );
            }
        }
    }

    #[test]
    fn a_wide_term_in_one_group_is_still_read_from_every_replica() {
        let catalog = catalog(&(0..8192).collect::<Vec<u64>>());
        let shape = grouped(4, 2, 4096);
        let Plan::Chains(chains) = plan(&[term(0, 4095)], &catalog, shape, |_, _| true) else {
            panic!("a plan with chains")
        };
        // Both owners of the one group read, one 256-vid read block each in turn.
        let (machines, read) = asked(&chains);
        assert_eq!(machines.len(), 2, "{machines:?}");
        for (machine, vid) in read {
            assert_eq!(
                Some(machine as usize),
                shape.placement.reader(vid, |_| true)
            );
        }
    }

    #[test]
    fn a_dense_wide_term_costs_its_groups_not_its_vids() {
        let catalog = catalog(&(0..10_000).collect::<Vec<u64>>());
        let shape = grouped(4, 1, 64);
        let placement = shape.placement;
        let Plan::Chains(chains) = plan(&[term(3, 4098)], &catalog, shape, |_, _| true) else {
            panic!("a plan with chains")
        };
        // 4,096 vids over 65 groups: at most one node per group.
        assert!(chains[0].len() <= 65, "{} nodes", chains[0].len());
        let chain = pairs(&chains[0]);
        assert_eq!(chain.len(), 4096);
        assert!(
            chain
                .iter()
                .all(|&(m, v)| m as usize == placement.owners(v)[0])
        );
    }

    #[test]
    fn a_query_names_a_bounded_number_of_vectors() {
        let vids: Vec<u64> = (0..600).collect();
        let catalog = catalog(&vids);
        let terms = [term(0, 599), term(100, 599)];
        assert_eq!(
            plan(&terms, &catalog, shape(2, 1), |_, _| true),
            Plan::TooMany { most: 1000 }
        );
        assert_eq!(
            plan(&terms, &catalog, shape(2, 1), |_, _| false),
            Plan::TooMany { most: 1000 },
            "vectors without a live owner count too"
        );
        assert!(matches!(
            plan(&terms[1..], &catalog, shape(2, 1), |_, _| true),
            Plan::Chains(_)
        ));
    }

    #[test]
    fn chains_start_at_the_coordinator_and_wrap_around() {
        let sorted = [(0, 4), (0, 9), (1, 2), (3, 1), (3, 7)];
        let rotated = |coordinator| {
            let mut chain = nodes(&sorted);
            start_at(&mut chain, coordinator);
            pairs(&chain)
        };
        assert_eq!(rotated(0), sorted);
        assert_eq!(rotated(1), [(1, 2), (3, 1), (3, 7), (0, 4), (0, 9)]);
        // A coordinator without vectors of the term: the next machine holding some.
        assert_eq!(rotated(2), [(3, 1), (3, 7), (0, 4), (0, 9), (1, 2)]);
        assert_eq!(rotated(4), sorted);
    }

    #[test]
    fn auto_fans_out_unless_the_coordinator_would_get_too_much() {
        let chains = vec![nodes(&[(0, 1), (1, 2), (2, 3)]), nodes(&[(1, 4), (3, 5)])];
        assert_eq!(transfers(&chains[0], 0), (4, 2));
        assert_eq!(transfers(&chains[1], 0), (3, 2));
        assert_eq!(gathering(PlanChoice::Auto, &chains, 0), PlanKind::FanOut);
        assert_eq!(gathering(PlanChoice::Chain, &chains, 0), PlanKind::Chain);
        let wide: Vec<Chain> = vec![nodes(
            &(0..100).map(|m| (m, u64::from(m))).collect::<Vec<_>>(),
        )];
        assert_eq!(gathering(PlanChoice::Auto, &wide, 0), PlanKind::Chain);
        assert_eq!(gathering(PlanChoice::FanOut, &wide, 0), PlanKind::FanOut);
        assert_eq!("fan-out".parse(), Ok(PlanChoice::FanOut));
        assert!("star".parse::<PlanChoice>().is_err());
        assert_eq!(PlanChoice::Auto.to_string(), "auto");
    }

    #[test]
    fn coordinator_policies() {
        let chains = vec![nodes(&[(2, 1), (2, 2), (3, 3)]), nodes(&[(0, 4), (2, 5)])];
        let live = [0, 2, 3];
        assert_eq!(
            coordinator(CoordinatorPolicy::Bandwidth, &chains, &live, 0),
            Some(2)
        );
        assert_eq!(
            coordinator(CoordinatorPolicy::Bandwidth, &chains, &[0, 3], 0),
            Some(0)
        );
        let round_robin = |chains: &[Chain], live: &[usize]| -> Vec<Option<usize>> {
            (0..4)
                .map(|t| coordinator(CoordinatorPolicy::RoundRobin, chains, live, t))
                .collect()
        };
        // Slave 2 holds vectors of both terms, 0 and 3 of one each: only 2
        // coordinates, receiving no partial result.
        assert_eq!(round_robin(&chains, &live), [Some(2); 4]);
        // Slaves 0 and 1 hold vectors of two terms each, 2 of one, 3 of
        // none: 0 and 1 take turns.
        let spread = vec![
            nodes(&[(0, 1), (1, 2)]),
            nodes(&[(0, 4), (1, 5)]),
            nodes(&[(2, 6)]),
        ];
        let turns = round_robin(&spread, &[0, 1, 2, 3]);
        assert_eq!(turns, [Some(0), Some(1), Some(0), Some(1)]);
        // Slave 1 down: 0 alone holds two terms' vectors among the live.
        assert_eq!(round_robin(&spread, &[0, 2, 3]), [Some(0); 4]);
        // A slave holding all of a term's vectors counts it once.
        let one_term = vec![nodes(&[(3, 1), (3, 2), (3, 3)]), nodes(&[(0, 4)])];
        let turns = round_robin(&one_term, &[0, 3]);
        assert_eq!(turns, [Some(0), Some(3), Some(0), Some(3)]);
        let elsewhere = vec![nodes(&[(1, 7)])];
        assert_eq!(
            coordinator(CoordinatorPolicy::RoundRobin, &elsewhere, &[0, 2], 5),
            Some(2),
            "no live holder: every live slave takes turns"
        );
        let random = coordinator(CoordinatorPolicy::Random, &chains, &live, 0).unwrap();
        assert!(live.contains(&random));
        assert_eq!(
            coordinator(CoordinatorPolicy::Random, &chains, &[], 0),
            None
        );
        assert_eq!("bandwidth".parse(), Ok(CoordinatorPolicy::Bandwidth));
        assert!("fastest".parse::<CoordinatorPolicy>().is_err());
        assert_eq!(CoordinatorPolicy::RoundRobin.to_string(), "round-robin");
    }
}
