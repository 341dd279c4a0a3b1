//! The checker: per vector, the states the writes before and during each
//! read allow, and whether every read saw one of them.
//!
//! The writes come from one writer, one after another; the master applies
//! writes in the order it accepts them (docs/protocol.md §8), so a vector's
//! writes take effect in that order. A write answered `ok` takes effect at
//! an instant inside its interval; one refused took none; one recorded
//! takes effect after its start (perhaps after it answered), before any
//! later write does; one of unknown outcome does the same or never. A
//! configuration is a state of the vector (bits, or absent), how many of its
//! writes are decided (applied or skipped), and which of the reads open at
//! the time have seen a state they answered. The configurations are swept
//! through the events in time order: a read that ends with no configuration
//! having shown its answer is wrong. Range reads are checked against the
//! states each of their vectors could have had during the read.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::history::{Action, Op, Outcome, Seen};

/// A state: the bits of the vector, or `None` when it does not exist.
pub type State = Option<u64>;

/// More configurations than this for one vector and the checker gives up on
/// it (counted) until a delete answered `ok` makes its state certain again.
const MOST_CONFIGURATIONS: usize = 4096;

/// More combinations than this of a range's vectors' states and it is
/// checked by bounds (bits it must hold, bits it may hold) instead.
const MOST_COMBINATIONS: usize = 4096;

/// How a write changes a vector.
#[derive(Debug, Clone, Copy)]
enum Effect {
    Or(u64),
    Clear(u64),
    Delete,
}

impl Effect {
    fn apply(self, state: State) -> State {
        match self {
            Effect::Or(m) => Some(state.unwrap_or(0) | m),
            Effect::Clear(m) => state.map(|s| s & !m),
            Effect::Delete => None,
        }
    }
}

/// How certain a write is to take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Certainty {
    /// Answered `ok`: applied by its end.
    Done,
    /// Applied some time after its start, never skipped.
    Recorded,
    /// Applied some time after its start, or never.
    Maybe,
}

#[derive(Debug, Clone)]
struct Write {
    effect: Effect,
    certainty: Certainty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Config {
    state: State,
    /// Writes `0..next` are decided.
    next: usize,
    /// Bit k: the read in slot k has seen one of these states.
    seen: u64,
}

/// A read that matched no allowed state, or a vector that lost track.
#[derive(Debug, Clone)]
pub struct Wrong {
    /// The read.
    pub op: usize,
    /// The vids it concerns.
    pub vids: Vec<u64>,
    /// What it should have seen.
    pub allowed: String,
    /// How the answer differs from the nearest allowed state.
    pub kind: &'static str,
}

/// How `seen` differs from the nearest of `allowed`: `extra bits` (a
/// superset: bits cleared, deleted or never written came back), `missing
/// bits` (a subset: a write lost or not copied), `absent` (a vector that
/// must exist not found), `present` (a vector that must not exist found),
/// or `other bits`.
pub fn kind_of(seen: &Seen, allowed: &BTreeSet<State>) -> &'static str {
    let Seen::Bits(got) = *seen else {
        return if *seen == Seen::Missing {
            "absent"
        } else {
            "other bits"
        };
    };
    let nearest = allowed
        .iter()
        .flatten()
        .min_by_key(|&&m| (m ^ got).count_ones());
    match nearest {
        None => "present",
        Some(&m) if got & m == m => "extra bits",
        Some(&m) if got & m == got => "missing bits",
        Some(_) => "other bits",
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Reads that saw what no order of the writes allows.
    pub wrong: Vec<Wrong>,
    /// Per vid, the states it may end in (None: the checker lost track).
    pub last: BTreeMap<u64, Option<BTreeSet<State>>>,
    /// How many times a vector had too many possible states to follow.
    pub lost_track: usize,
    /// Reads checked.
    pub checked: usize,
}

enum Event {
    WriteStart(usize),
    WriteEnd(usize),
    ReadStart(usize),
    ReadEnd(usize),
    WindowStart(usize),
    WindowEnd(usize),
}

/// Checks `ops` (by start, numbered) for the vids `vids`.
pub fn check(ops: &[Op], vids: &[u64]) -> Verdict {
    let mut verdict = Verdict::default();
    // Per range read and vid: the states it could have seen (None: any).
    let mut windows: BTreeMap<(usize, u64), Option<BTreeSet<State>>> = BTreeMap::new();
    for &vid in vids {
        sweep(ops, vid, &mut verdict, &mut windows);
    }
    for op in ops {
        if let (Action::Range(terms), Outcome::Read(seen)) = (&op.action, &op.outcome) {
            verdict.checked += 1;
            if let Some(allowed) = check_range(terms, seen, vids, |v| windows[&(op.id, v)].clone())
            {
                let vids = vids.iter().copied().filter(|&v| op.action.touches(v));
                verdict.wrong.push(Wrong {
                    op: op.id,
                    vids: vids.collect(),
                    allowed,
                    kind: "range",
                });
            }
        }
    }
    verdict
}

/// The writes of `vid`, and the events of the reads and writes of it.
fn events(ops: &[Op], vid: u64) -> (Vec<Write>, Vec<(u64, u8, Event)>) {
    let mut writes = Vec::new();
    let mut events = Vec::new();
    for op in ops {
        let certainty = match &op.outcome {
            Outcome::Done => Certainty::Done,
            Outcome::Recorded(_) => Certainty::Recorded,
            Outcome::Unknown(_) => Certainty::Maybe,
            _ => {
                if let Outcome::Read(_) = op.outcome {
                    match &op.action {
                        Action::Point(v) if *v == vid => {
                            events.push((op.start, 0, Event::ReadStart(op.id)));
                            events.push((op.end, 1, Event::ReadEnd(op.id)));
                        }
                        Action::Range(_) if op.action.touches(vid) => {
                            events.push((op.start, 0, Event::WindowStart(op.id)));
                            events.push((op.end, 1, Event::WindowEnd(op.id)));
                        }
                        _ => {}
                    }
                }
                continue;
            }
        };
        let effect = match &op.action {
            Action::Import(v) => v
                .iter()
                .find(|&&(x, _)| x == vid)
                .map(|&(_, m)| Effect::Or(m)),
            Action::Clear(v) => v
                .iter()
                .find(|&&(x, _)| x == vid)
                .map(|&(_, m)| Effect::Clear(m)),
            Action::Delete(_) if op.action.touches(vid) => Some(Effect::Delete),
            _ => None,
        };
        if let Some(effect) = effect {
            let i = writes.len();
            writes.push(Write { effect, certainty });
            events.push((op.start, 0, Event::WriteStart(i)));
            if certainty == Certainty::Done {
                events.push((op.end, 1, Event::WriteEnd(i)));
            }
        }
    }
    // At one instant, starts before ends: the more permissive order.
    events.sort_by_key(|&(t, order, _)| (t, order));
    (writes, events)
}

fn matches(seen: &Seen, state: State) -> bool {
    match seen {
        Seen::Missing => state.is_none(),
        Seen::Bits(m) => state == Some(*m),
        Seen::Beyond(_) => false,
    }
}

fn seen_of(ops: &[Op], id: usize) -> &Seen {
    match &ops[id].outcome {
        Outcome::Read(seen) => seen,
        _ => unreachable!("only answered reads have events"),
    }
}

fn sweep(
    ops: &[Op],
    vid: u64,
    verdict: &mut Verdict,
    windows: &mut BTreeMap<(usize, u64), Option<BTreeSet<State>>>,
) {
    let (writes, events) = events(ops, vid);
    let mut configs: HashSet<Config> = HashSet::from([Config {
        state: None,
        next: 0,
        seen: 0,
    }]);
    let mut lost = false;
    // Writes `0..started` have started.
    let mut started = 0;
    // Open reads: slot -> (op, states seen during it, checked).
    let mut slots: Vec<Option<(usize, BTreeSet<State>, bool)>> = Vec::new();
    let mut open_windows: BTreeMap<usize, BTreeSet<State>> = BTreeMap::new();
    for (_, _, event) in events {
        match event {
            Event::WriteStart(i) => {
                started = i + 1;
                if !lost {
                    close(&mut configs, &writes, started, ops, &mut slots);
                }
            }
            Event::WriteEnd(i) => {
                if lost {
                    if let Effect::Delete = writes[i].effect {
                        lost = false;
                        configs = HashSet::from([Config {
                            state: None,
                            next: i + 1,
                            seen: 0,
                        }]);
                    }
                } else {
                    configs.retain(|c| c.next > i);
                }
            }
            Event::ReadStart(id) => {
                let slot = match slots.iter().position(Option::is_none) {
                    Some(k) => k,
                    None => {
                        slots.push(None);
                        slots.len() - 1
                    }
                };
                assert!(slot < 64, "at most 64 reads of one vector at once");
                let seen = seen_of(ops, id);
                let states: BTreeSet<State> = configs.iter().map(|c| c.state).collect();
                configs = configs
                    .into_iter()
                    .map(|mut c| {
                        c.seen &= !(1 << slot);
                        if matches(seen, c.state) {
                            c.seen |= 1 << slot;
                        }
                        c
                    })
                    .collect();
                slots[slot] = Some((id, states, !lost));
                // The writes still to come may give the state it saw.
                if !lost {
                    close(&mut configs, &writes, started, ops, &mut slots);
                }
            }
            Event::ReadEnd(id) => {
                let slot = slots
                    .iter()
                    .position(|s| s.as_ref().is_some_and(|s| s.0 == id))
                    .expect("a read ends after it starts");
                let (_, states, checked) = slots[slot].take().expect("open");
                if !checked || lost {
                    continue;
                }
                verdict.checked += 1;
                let kept: HashSet<Config> = configs
                    .iter()
                    .filter(|c| c.seen >> slot & 1 == 1)
                    .map(|&c| Config {
                        seen: c.seen & !(1 << slot),
                        ..c
                    })
                    .collect();
                if kept.is_empty() {
                    let allowed: Vec<String> =
                        states.iter().map(|&s| super::history::state(s)).collect();
                    verdict.wrong.push(Wrong {
                        op: id,
                        vids: vec![vid],
                        kind: kind_of(seen_of(ops, id), &states),
                        allowed: format!(
                            "one of the states vector {vid} could have had during the read \
                             (given the reads before it): {}",
                            allowed.join(" | ")
                        ),
                    });
                    // Go on as if the read had not happened.
                    configs = configs
                        .into_iter()
                        .map(|c| Config {
                            seen: c.seen & !(1 << slot),
                            ..c
                        })
                        .collect();
                } else {
                    configs = kept;
                }
            }
            Event::WindowStart(id) => {
                let states = configs.iter().map(|c| c.state).collect();
                if lost {
                    windows.insert((id, vid), None);
                } else {
                    open_windows.insert(id, states);
                }
            }
            Event::WindowEnd(id) => {
                if let Some(states) = open_windows.remove(&id) {
                    let whole = !lost;
                    windows.insert((id, vid), whole.then_some(states));
                }
            }
        }
        if !lost && configs.len() > MOST_CONFIGURATIONS {
            lost = true;
            verdict.lost_track += 1;
            configs.clear();
            for slot in slots.iter_mut().flatten() {
                slot.2 = false;
            }
            for (id, _) in std::mem::take(&mut open_windows) {
                windows.insert((id, vid), None);
            }
        }
        // Every state a configuration reached is one an open read could see.
        let now: Vec<State> = configs.iter().map(|c| c.state).collect();
        for states in open_windows.values_mut() {
            states.extend(now.iter().copied());
        }
        for (_, states, _) in slots.iter_mut().flatten() {
            states.extend(now.iter().copied());
        }
    }
    for (id, _) in open_windows {
        windows.insert((id, vid), None);
    }
    if !lost {
        close(&mut configs, &writes, writes.len(), ops, &mut slots);
    }
    let last = (!lost && configs.len() <= MOST_CONFIGURATIONS).then(|| {
        configs
            .iter()
            .filter(|c| {
                writes[c.next..]
                    .iter()
                    .all(|w| w.certainty == Certainty::Maybe)
            })
            .map(|c| c.state)
            .collect()
    });
    verdict.last.insert(vid, last);
}

/// Adds every configuration reachable by applying writes that have started
/// (the first `started`), in order, skipping only those that may never
/// take effect; each new state is marked seen by the open reads it answers.
fn close(
    configs: &mut HashSet<Config>,
    writes: &[Write],
    started: usize,
    ops: &[Op],
    slots: &mut [Option<(usize, BTreeSet<State>, bool)>],
) {
    let mut work: Vec<Config> = configs.iter().copied().collect();
    while let Some(c) = work.pop() {
        for i in c.next..started {
            if i > c.next && writes[i - 1].certainty != Certainty::Maybe {
                break;
            }
            let state = writes[i].effect.apply(c.state);
            let mut seen = c.seen;
            for (k, slot) in slots.iter().enumerate() {
                if let Some((id, _, _)) = slot
                    && matches(seen_of(ops, *id), state)
                {
                    seen |= 1 << k;
                }
            }
            let next = Config {
                state,
                next: i + 1,
                seen,
            };
            if configs.insert(next) {
                work.push(next);
            }
            if configs.len() > MOST_CONFIGURATIONS {
                return;
            }
        }
    }
}

/// Checks a range read's answer against every combination of its vectors'
/// possible states; `None` if some combination gives it, else what was allowed.
fn check_range(
    terms: &[Vec<(u64, u64)>],
    seen: &Seen,
    vids: &[u64],
    states: impl Fn(u64) -> Option<BTreeSet<State>>,
) -> Option<String> {
    let Seen::Bits(answer) = *seen else {
        return Some(format!("bits below 64 (it answered {seen:?})"));
    };
    let within = |spans: &[(u64, u64)], v: u64| spans.iter().any(|&(a, b)| a <= v && v <= b);
    let involved: Vec<u64> = vids
        .iter()
        .copied()
        .filter(|&v| terms.iter().any(|t| within(t, v)))
        .collect();
    let options: Vec<Option<Vec<u64>>> = involved
        .iter()
        .map(|&v| states(v).map(|s| s.iter().map(|s| s.unwrap_or(0)).collect()))
        .collect();
    let fold = |masks: &[u64]| -> u64 {
        terms.iter().fold(u64::MAX, |and, term| {
            let or = involved
                .iter()
                .zip(masks)
                .filter(|&(&v, _)| within(term, v))
                .fold(0, |or, (_, &m)| or | m);
            and & or
        })
    };
    let combinations = options.iter().try_fold(1usize, |n, o| {
        o.as_ref()
            .and_then(|o| n.checked_mul(o.len().max(1)))
            .filter(|&n| n <= MOST_COMBINATIONS)
    });
    if let Some(_n) = combinations {
        let options: Vec<Vec<u64>> = options.into_iter().map(|o| o.unwrap()).collect();
        if options.iter().any(Vec::is_empty) {
            return None;
        }
        let mut index = vec![0usize; options.len()];
        let mut answers = BTreeSet::new();
        loop {
            let masks: Vec<u64> = index.iter().zip(&options).map(|(&i, o)| o[i]).collect();
            let got = fold(&masks);
            if got == answer {
                return None;
            }
            answers.insert(got);
            let mut k = 0;
            loop {
                if k == index.len() {
                    let shown: Vec<String> = answers
                        .iter()
                        .take(8)
                        .map(|&m| super::history::bits(m))
                        .collect();
                    return Some(format!(
                        "one of {} answers the vectors' states during the read give: {}{}",
                        answers.len(),
                        shown.join(" | "),
                        if answers.len() > 8 { " | ..." } else { "" }
                    ));
                }
                index[k] += 1;
                if index[k] < options[k].len() {
                    break;
                }
                index[k] = 0;
                k += 1;
            }
        }
    }
    // Bounds: each term's OR holds at least the bits every state of some
    // vid holds, at most the bits any state of its vids holds.
    let (mut must, mut may) = (u64::MAX, u64::MAX);
    for term in terms {
        let (mut term_must, mut term_may) = (0, 0);
        for (v, o) in involved.iter().zip(&options) {
            if within(term, *v) {
                match o {
                    Some(o) => {
                        term_must |= o.iter().fold(u64::MAX, |a, &m| a & m) & mask_if(o);
                        term_may |= o.iter().fold(0, |a, &m| a | m);
                    }
                    None => term_may = u64::MAX,
                }
            }
        }
        must &= term_must;
        may &= term_may;
    }
    let fine = answer & !may == 0 && must & !answer == 0;
    (!fine).then(|| {
        format!(
            "at least {} and at most {} (bounds over the vectors' states during the read)",
            super::history::bits(must),
            super::history::bits(may)
        )
    })
}

/// All ones unless `o` is empty (no state: no bit is certain).
fn mask_if(o: &[u64]) -> u64 {
    if o.is_empty() { 0 } else { u64::MAX }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: usize, action: Action, start: u64, end: u64, outcome: Outcome) -> Op {
        Op {
            id,
            who: "t",
            action,
            start,
            end,
            outcome,
        }
    }

    #[test]
    fn the_checker_allows_what_the_writes_allow_and_nothing_else() {
        let unknown = || Outcome::Unknown("lost".into());
        let ops = vec![
            op(0, Action::Import(vec![(1, 0b11)]), 0, 10, Outcome::Done),
            op(1, Action::Point(1), 5, 6, Outcome::Read(Seen::Missing)),
            op(2, Action::Import(vec![(1, 0b100)]), 20, 30, unknown()),
            op(
                3,
                Action::Point(1),
                40,
                41,
                Outcome::Read(Seen::Bits(0b111)),
            ),
            // Once seen, an unknown write stays applied.
            op(4, Action::Point(1), 50, 51, Outcome::Read(Seen::Bits(0b11))),
            op(5, Action::Delete(vec![(0, 5)]), 60, 70, Outcome::Done),
            op(6, Action::Point(1), 80, 81, Outcome::Read(Seen::Missing)),
            op(7, Action::Import(vec![(1, 0b1000)]), 90, 95, Outcome::Done),
            op(
                8,
                Action::Range(vec![vec![(0, 3)]]),
                96,
                97,
                Outcome::Read(Seen::Bits(0b1000)),
            ),
            op(
                9,
                Action::Range(vec![vec![(0, 3)]]),
                96,
                97,
                Outcome::Read(Seen::Bits(0b1001)),
            ),
        ];
        let verdict = check(&ops, &[1, 2]);
        let wrong: Vec<usize> = verdict.wrong.iter().map(|w| w.op).collect();
        assert_eq!(wrong, vec![4, 9]);
        assert_eq!(verdict.last[&1], Some(BTreeSet::from([Some(0b1000)])));
        assert_eq!(verdict.last[&2], Some(BTreeSet::from([None])));
    }

    #[test]
    fn an_unknown_write_may_not_take_effect_after_a_later_delete() {
        let ops = vec![
            op(
                0,
                Action::Import(vec![(1, 0b1)]),
                0,
                10,
                Outcome::Unknown("x".into()),
            ),
            op(1, Action::Point(1), 11, 12, Outcome::Read(Seen::Missing)),
            op(2, Action::Delete(vec![(1, 1)]), 20, 30, Outcome::Done),
            op(3, Action::Import(vec![(1, 0b10)]), 40, 50, Outcome::Done),
            op(4, Action::Point(1), 60, 61, Outcome::Read(Seen::Bits(0b11))),
        ];
        let verdict = check(&ops, &[1]);
        assert_eq!(
            verdict.wrong.iter().map(|w| w.op).collect::<Vec<_>>(),
            vec![4]
        );
    }

    #[test]
    fn a_recorded_update_takes_effect_once_and_for_good() {
        let recorded = || Outcome::Recorded("recorded".into());
        let ops = vec![
            op(0, Action::Import(vec![(1, 0b11)]), 0, 10, Outcome::Done),
            op(1, Action::Clear(vec![(1, 0b1)]), 20, 30, recorded()),
            op(2, Action::Point(1), 40, 41, Outcome::Read(Seen::Bits(0b11))),
            op(3, Action::Point(1), 50, 51, Outcome::Read(Seen::Bits(0b10))),
            op(4, Action::Point(1), 60, 61, Outcome::Read(Seen::Bits(0b11))),
            op(
                5,
                Action::Range(vec![vec![(0, 1)], vec![(1, 1)]]),
                70,
                71,
                Outcome::Read(Seen::Bits(0b10)),
            ),
        ];
        let verdict = check(&ops, &[0, 1]);
        assert_eq!(
            verdict.wrong.iter().map(|w| w.op).collect::<Vec<_>>(),
            vec![4]
        );
        assert_eq!(verdict.wrong[0].kind, "extra bits");
        assert_eq!(verdict.last[&1], Some(BTreeSet::from([Some(0b10)])));
    }
}
