//! Chains as the master writes them and the slaves read them: each node
//! names a run of consecutive vids on one machine, so a wide term costs the
//! master, the coordinator, the wire and the slaves' covers its runs, not
//! its vids. A machine that fails in a chain is reported up it
//! ([`FailedMachine`]), and the coordinator reports the failures of its
//! chains to the master ([`coordinator_failures`]).

pub use bitfold_engine::VidRun;

use crate::bitfold_capnp::{coordinate_result, failed_machine, machine, machine_vec_node};

/// A node of a chain: the vids of `run`, read from machine `machine` (an
/// index into the chain's machine table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// The machine, as an index into the chain's machine table.
    pub machine: u32,
    /// The vids read from it.
    pub run: VidRun,
}

/// The most vids one node names: its `more` is a `UInt32`.
pub const NODE_MAX_VIDS: u64 = u32::MAX as u64 + 1;

impl Node {
    /// Reads a node, refusing a run that passes `u64::MAX`.
    pub fn read(node: machine_vec_node::Reader<'_>) -> capnp::Result<Node> {
        let first = node.get_vid();
        let Some(last) = first.checked_add(u64::from(node.get_more())) else {
            return Err(capnp::Error::failed(format!(
                "a chain node's run of {} vids from vid {first} passes the last vid",
                u64::from(node.get_more()) + 1
            )));
        };
        Ok(Node {
            machine: node.get_machine(),
            run: VidRun { first, last },
        })
    }

    /// Writes it.
    ///
    /// # Panics
    ///
    /// If its run holds more than [`NODE_MAX_VIDS`] vids ([`push`] never
    /// makes such a node).
    pub fn write(&self, mut node: machine_vec_node::Builder<'_>) {
        let more =
            u32::try_from(self.run.last - self.run.first).expect("a node names at most 2^32 vids");
        node.set_machine(self.machine);
        node.set_vid(self.run.first);
        node.set_more(more);
    }
}

/// Appends the vids `run` on `machine` to `chain`: into its last node when
/// that is on the same machine and ends just before `run` (and the node
/// stays within what one node may name), else as a new node.
pub fn push(chain: &mut Vec<Node>, machine: u32, run: VidRun) {
    if let Some(last) = chain.last_mut()
        && last.machine == machine
        && last.run.last.checked_add(1) == Some(run.first)
        && run.last - last.run.first < NODE_MAX_VIDS
    {
        last.run.last = run.last;
        return;
    }
    chain.push(Node { machine, run });
}

/// How many vids `runs` name in all (saturating: a peer may name them all
/// several times).
pub fn vid_count(runs: &[VidRun]) -> u64 {
    runs.iter()
        .fold(0, |sum, run| sum.saturating_add(run.count()))
}

/// Reads the runs of a `gather` term: pairs of u64 little-endian, `first`
/// and `last`, ascending and disjoint.
pub fn read_runs(bytes: &[u8]) -> capnp::Result<Vec<VidRun>> {
    let words = crate::wire::vids(bytes)?;
    if !words.len().is_multiple_of(2) {
        return Err(capnp::Error::failed(format!(
            "a gather term's runs hold {} vids, not pairs of first and last",
            words.len()
        )));
    }
    let runs: Vec<VidRun> = words
        .chunks_exact(2)
        .map(|pair| VidRun {
            first: pair[0],
            last: pair[1],
        })
        .collect();
    let bad = runs.iter().position(|r| r.first > r.last).or_else(|| {
        runs.windows(2)
            .position(|w| w[0].last >= w[1].first)
            .map(|i| i + 1)
    });
    if let Some(i) = bad {
        return Err(capnp::Error::failed(format!(
            "a gather term's run {i} ({}..={}) is empty or not after the one before",
            runs[i].first, runs[i].last
        )));
    }
    Ok(runs)
}

/// The `gather` form of `runs` (ascending, disjoint): see [`read_runs`].
pub fn runs_bytes(runs: &[VidRun]) -> Vec<u64> {
    runs.iter().flat_map(|r| [r.first, r.last]).collect()
}

/// A chain's machine table.
pub type Machines<'a> = capnp::struct_list::Reader<'a, machine::Owned>;

/// A machine that failed, and why (`FailedMachine`, docs/slave-protocol.md S5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMachine {
    /// Its name in the cluster file.
    pub name: String,
    /// Its address, `HOST:PORT`.
    pub addr: String,
    /// Why it failed.
    pub reason: String,
}

impl FailedMachine {
    /// Entry `index` of the machine table, failed for `reason`.
    pub fn at(machines: Machines<'_>, index: u32, reason: String) -> capnp::Result<Self> {
        if index >= machines.len() {
            return Err(capnp::Error::failed(format!(
                "a chain names machine {index} of a table of {}",
                machines.len()
            )));
        }
        let machine = machines.get(index);
        Ok(FailedMachine {
            name: machine.get_name()?.to_string()?,
            addr: machine.get_addr()?.to_string()?,
            reason,
        })
    }

    /// Reads one from the wire.
    pub fn read(reader: failed_machine::Reader<'_>) -> capnp::Result<Self> {
        Ok(FailedMachine {
            name: reader.get_name()?.to_string()?,
            addr: reader.get_addr()?.to_string()?,
            reason: reader.get_reason()?.to_string()?,
        })
    }

    /// Writes it to the wire.
    pub fn write(&self, mut builder: failed_machine::Builder<'_>) {
        builder.set_name(self.name.as_str());
        builder.set_addr(self.addr.as_str());
        builder.set_reason(self.reason.as_str());
    }
}

/// The machines a coordinator's result names failed, as the master reads
/// it: none for an answer, refused if more than the `slaves` of the query's
/// machine table.
pub fn coordinator_failures(
    result: coordinate_result::Reader<'_>,
    slaves: u32,
) -> capnp::Result<Vec<FailedMachine>> {
    match result.which()? {
        coordinate_result::FailedMachines(list) => {
            let list = list?;
            crate::wire::at_most(list.len(), slaves, "failed machines")?;
            list.iter().map(FailedMachine::read).collect()
        }
        coordinate_result::Vector(_) | coordinate_result::Count(_) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, last: u64) -> VidRun {
        VidRun { first, last }
    }

    #[test]
    fn push_extends_a_node_only_with_the_next_vids_on_its_machine() {
        let mut chain = Vec::new();
        push(&mut chain, 1, run(0, 9));
        push(&mut chain, 1, run(10, 12));
        push(&mut chain, 2, run(13, 13));
        push(&mut chain, 2, run(15, 20));
        push(&mut chain, 1, run(21, 21));
        let nodes: Vec<(u32, u64, u64)> = chain
            .iter()
            .map(|n| (n.machine, n.run.first, n.run.last))
            .collect();
        assert_eq!(nodes, [(1, 0, 12), (2, 13, 13), (2, 15, 20), (1, 21, 21)]);
        let mut wide = vec![Node {
            machine: 0,
            run: run(0, NODE_MAX_VIDS - 2),
        }];
        push(&mut wide, 0, run(NODE_MAX_VIDS - 1, NODE_MAX_VIDS));
        assert_eq!(wide.len(), 2, "a node names at most 2^32 vids");
    }

    #[test]
    fn nodes_round_trip_and_refuse_runs_past_the_last_vid() {
        let mut message = capnp::message::Builder::new_default();
        let mut list =
            message.initn_root::<capnp::struct_list::Builder<'_, machine_vec_node::Owned>>(2);
        let node = Node {
            machine: 3,
            run: run(u64::MAX - 4, u64::MAX),
        };
        node.write(list.reborrow().get(0));
        let mut bad = list.reborrow().get(1);
        bad.set_vid(u64::MAX - 4);
        bad.set_more(5);
        let list = list.into_reader();
        assert_eq!(Node::read(list.get(0)).unwrap(), node);
        let err = Node::read(list.get(1)).unwrap_err().to_string();
        assert!(err.contains("passes the last vid"), "{err}");
    }

    #[test]
    fn gather_runs_round_trip_and_bad_ones_are_refused() {
        let runs = [run(0, 0), run(2, 7), run(u64::MAX, u64::MAX)];
        let bytes = runs_bytes(&runs);
        assert_eq!(read_runs(bytemuck::cast_slice(&bytes)).unwrap(), runs);
        for (bad, what) in [
            (vec![3u64, 2], "empty"),
            (vec![0, 5, 5, 9], "not after"),
            (vec![4, 5, 1, 2], "not after"),
            (vec![1, 2, 3], "not pairs"),
        ] {
            let err = read_runs(bytemuck::cast_slice(&bad)).unwrap_err();
            assert!(err.to_string().contains(what), "{bad:?}: {err}");
        }
    }

    /// A coordinator's result naming `count` failed machines `s0`, `s1`, ...
    fn failed(count: u32) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        let mut message = capnp::message::Builder::new_default();
        let result = message.init_root::<coordinate_result::Builder<'_>>();
        let mut list = result.init_failed_machines(count);
        for i in 0..count {
            let mut machine = list.reborrow().get(i);
            machine.set_name(format!("s{i}").as_str());
            machine.set_reason("connection refused");
        }
        message
    }

    #[test]
    fn a_coordinator_names_at_most_every_slave_as_failed() {
        let two = failed(2);
        let read = coordinator_failures(two.get_root_as_reader().unwrap(), 4).unwrap();
        let names: Vec<&str> = read.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["s0", "s1"]);
        let five = failed(5);
        let refused = coordinator_failures(five.get_root_as_reader().unwrap(), 4)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("5 failed machines in one message, more than the 4 allowed"),
            "{refused}"
        );
        // 24 bytes that would read as 2^27 - 16 failures of 72 bytes each.
        let empty = crate::wire::empty_structs((1 << 27) - 16);
        let mut message = capnp::message::Builder::new_default();
        message
            .init_root::<coordinate_result::Builder<'_>>()
            .set_failed_machines(empty.get_root().unwrap())
            .unwrap();
        let refused = coordinator_failures(message.get_root_as_reader().unwrap(), 4)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("134217712 failed machines"), "{refused}");
    }
}
