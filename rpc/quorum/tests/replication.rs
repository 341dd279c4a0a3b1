//! Three Raft nodes in one process, each on its own folder, talking over
//! an in-memory transport: what one leader writes through its records
//! directory every node holds; a node stopped while the others went on
//! catches up from a snapshot; a leader stopped is replaced; one whose data
//! is lost joins again as a new member.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bitfold_engine::store::{Directory, MmapDirectory, StoreError, read_sealed, write_sealed};
use bitfold_quorum::network::Sent;
use bitfold_quorum::{Opening, Quorum, QuorumOptions, Transport, member_id};

/// A node as the transport reaches it.
enum Reached {
    Opening(Arc<Opening>),
    Running(Weak<Quorum>),
}

/// Carries each message straight to the node at its address, if running.
#[derive(Default)]
struct InMemory {
    nodes: Mutex<HashMap<String, Reached>>,
}

impl Transport for InMemory {
    fn send(&self, addr: &str, message: Vec<u8>, _timeout: Duration) -> Sent {
        let answer = match self.nodes.lock().unwrap().get(addr) {
            Some(Reached::Opening(opening)) => Ok(Ok(opening.answer(&message))),
            Some(Reached::Running(node)) => node.upgrade().map(Err).ok_or(()),
            None => Err(()),
        };
        Box::pin(async move {
            match answer {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(node)) => Ok(node.answer(&message).await),
                Err(()) => Err("stopped".to_owned()),
            }
        })
    }
}

const NAMES: [&str; 3] = ["m0", "m1", "m2"];

struct Cluster {
    /// How long a write waits for a majority.
    write_timeout: Duration,
    root: tempfile::TempDir,
    transport: Arc<InMemory>,
    nodes: Vec<Option<Arc<Quorum>>>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster::waiting(Duration::from_secs(60))
    }

    /// A cluster whose writes wait `write_timeout` for a majority.
    fn waiting(write_timeout: Duration) -> Cluster {
        let mut cluster = Cluster::stopped(write_timeout);
        cluster.start_together(&[0, 1, 2]);
        cluster
    }

    /// A cluster none of whose nodes has started.
    fn stopped(write_timeout: Duration) -> Cluster {
        Cluster {
            write_timeout,
            root: tempfile::tempdir().unwrap(),
            transport: Arc::new(InMemory::default()),
            nodes: vec![None, None, None],
        }
    }

    fn dir(&self, i: usize) -> std::path::PathBuf {
        self.root.path().join(NAMES[i])
    }

    fn start(&mut self, i: usize) {
        self.start_together(&[i]);
    }

    /// Starts nodes `which` at once: a new cluster's wait for each other.
    fn start_together(&mut self, which: &[usize]) {
        let openings: Vec<(usize, Arc<Opening>)> =
            which.iter().map(|&i| (i, self.open(i))).collect();
        self.run(openings);
    }

    /// Opens node `i`: from now on it answers `hello`, as a master process
    /// does before its Raft starts.
    fn open(&self, i: usize) -> Arc<Opening> {
        let masters = NAMES
            .iter()
            .map(|n| (n.to_string(), format!("addr-{n}")))
            .collect();
        let mut options = QuorumOptions::new(NAMES[i].into(), masters, self.dir(i));
        options.snapshot_every = 20;
        options.message_bytes = 1 << 20;
        options.write_timeout = self.write_timeout;
        let opening = Arc::new(Opening::open(options).unwrap());
        self.transport.nodes.lock().unwrap().insert(
            format!("addr-{}", NAMES[i]),
            Reached::Opening(opening.clone()),
        );
        opening
    }

    /// Starts the Raft of each opened node, all at once.
    fn run(&mut self, openings: Vec<(usize, Arc<Opening>)>) {
        let starting: Vec<_> = openings
            .into_iter()
            .map(|(i, opening)| {
                let transport = self.transport.clone();
                (
                    i,
                    std::thread::spawn(move || opening.start(transport).unwrap()),
                )
            })
            .collect();
        for (i, started) in starting {
            let node = Arc::new(started.join().unwrap());
            self.transport.nodes.lock().unwrap().insert(
                format!("addr-{}", NAMES[i]),
                Reached::Running(Arc::downgrade(&node)),
            );
            self.nodes[i] = Some(node);
        }
    }

    fn stop(&mut self, i: usize) {
        self.transport
            .nodes
            .lock()
            .unwrap()
            .remove(&format!("addr-{}", NAMES[i]));
        let node = self.nodes[i].take().unwrap();
        // Only this test holds it (answers in flight hold it briefly).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut node = node;
        loop {
            match Arc::try_unwrap(node) {
                Ok(node) => break drop(node),
                Err(back) if Instant::now() < deadline => {
                    node = back;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => panic!("node {i} is still in use"),
            }
        }
    }

    /// The node that leads, waiting up to 20 s for one.
    fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leaders: Vec<usize> = (0..3)
                .filter(|&i| self.nodes[i].as_ref().is_some_and(|n| n.is_leader()))
                .collect();
            if leaders.len() == 1 {
                return leaders[0];
            }
            assert!(
                Instant::now() < deadline,
                "no single leader within 20 s: {leaders:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes file `name` through the leader, again through the next one
    /// if the lead changes meanwhile (a loaded machine delays heartbeats).
    fn write(&self, name: &str, body: &[u8]) {
        self.through_leader(name, |records| write_sealed(records, name, body));
    }

    /// Deletes file `name` through the leader, as [`Cluster::write`] writes.
    fn delete(&self, name: &str) {
        self.through_leader(name, |records| records.delete(name));
    }

    fn through_leader(
        &self,
        name: &str,
        change: impl Fn(&dyn Directory) -> Result<(), StoreError>,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let records = self.nodes[self.leader()].as_ref().unwrap().records();
            match change(&*records) {
                Ok(()) => return,
                Err(e) if e.to_string().contains("lost the lead") && Instant::now() < deadline => {}
                Err(e) => panic!("cannot change {name}: {e}"),
            }
        }
    }

    /// Waits until node `i`'s records hold file `name` with `body`.
    fn wait_for(&self, i: usize, name: &str, body: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if read_copy(&self.dir(i), name).as_deref() == Some(body) {
                return;
            }
            assert!(Instant::now() < deadline, "node {i} never held {name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// File `name` of the records of the node in `dir`, read while it runs.
fn read_copy(dir: &Path, name: &str) -> Option<Vec<u8>> {
    let path = dir.join("records").join(name);
    let bytes = std::fs::read(path).ok()?;
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(scratch.path().join(name), bytes).unwrap();
    let copy = MmapDirectory::open(scratch.path()).unwrap();
    read_sealed(&copy, name).ok()
}

#[test]
fn writes_reach_every_node_a_stopped_one_catches_up_and_a_new_leader_takes_over() {
    let mut cluster = Cluster::new();
    let leader = cluster.leader();
    cluster.write("catalog", b"first");
    for i in 0..3 {
        cluster.wait_for(i, "catalog", b"first");
    }

    // A follower stops; the others go on past a snapshot and drop the log.
    let follower = (leader + 1) % 3;
    cluster.stop(follower);
    for n in 0..60u32 {
        cluster.write(&format!("f{}", n % 7), &n.to_le_bytes());
    }
    cluster.delete("f0");
    cluster.write("catalog", b"second");
    cluster.start(follower);
    cluster.wait_for(follower, "catalog", b"second");
    assert_eq!(
        read_copy(&cluster.dir(follower), "f6").unwrap(),
        55u32.to_le_bytes()
    );
    assert!(
        read_copy(&cluster.dir(follower), "f0").is_none(),
        "a deleted file came back"
    );
    let purged = std::fs::read_dir(cluster.dir(follower).join("raft"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name() == "snapshot");
    assert!(purged, "the follower caught up without a snapshot");

    // The leader stops: another leads, holding everything written.
    let leader = cluster.leader();
    cluster.stop(leader);
    let next = cluster.leader();
    assert_ne!(next, leader);
    let records = cluster.nodes[next].as_ref().unwrap().records();
    assert!(records.list().unwrap().contains(&"catalog".to_owned()));
    cluster.write("catalog", b"third");
    cluster.start(leader);
    cluster.wait_for(leader, "catalog", b"third");
}

#[test]
fn a_write_without_a_majority_fails_and_changes_nothing_it_reports() {
    let mut cluster = Cluster::waiting(Duration::from_secs(3));
    cluster.write("ledger", b"one");
    let leader = cluster.leader();
    let records = cluster.nodes[leader].as_ref().unwrap().records();
    cluster.stop((leader + 1) % 3);
    cluster.stop((leader + 2) % 3);
    let err = write_sealed(&*records, "ledger", b"two").unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("no majority of masters") || err.contains("lost the lead"),
        "{err}"
    );
    assert_eq!(read_copy(&cluster.dir(leader), "ledger").unwrap(), b"one");
}

#[test]
fn a_node_whose_data_is_lost_joins_again_as_a_new_member_and_catches_up() {
    let mut cluster = Cluster::new();
    let leader = cluster.leader();
    for n in 0..50u32 {
        cluster.write(&format!("f{}", n % 5), &n.to_le_bytes());
    }
    let lost = (leader + 1) % 3;
    cluster.stop(lost);
    std::fs::remove_dir_all(cluster.dir(lost)).unwrap();
    cluster.start(lost);
    cluster.write("catalog", b"after");
    cluster.wait_for(lost, "catalog", b"after");
    assert_eq!(
        read_copy(&cluster.dir(lost), "f4").unwrap(),
        49u32.to_le_bytes()
    );
    // Three members still, the lost one under its name again, a voter.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let standing = cluster.nodes[cluster.leader()].as_ref().unwrap().standing();
        let names: Vec<(&str, &str)> = standing
            .masters
            .iter()
            .map(|m| (m.name.as_str(), m.state))
            .collect();
        if names.len() == 3 && names.iter().all(|(_, state)| *state != "learner") {
            let mut sorted: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
            sorted.sort();
            assert_eq!(sorted, NAMES);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lost node never became a voter again: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The leader stops: the two others, the new member among them unless
    // it led, elect a leader and take writes.
    let leader = cluster.leader();
    cluster.stop(leader);
    cluster.write("catalog", b"last");
}

#[test]
fn large_records_reach_a_follower_in_messages_it_can_take_and_large_files_go_in_pieces() {
    let mut cluster = Cluster::new();
    let leader = cluster.leader();
    let follower = (leader + 1) % 3;
    cluster.stop(follower);
    // 10 MiB of entries behind: more than one message carries.
    let big = vec![7u8; 1 << 20];
    for n in 0..10 {
        cluster.write(&format!("journal-{n}"), &big);
    }
    cluster.start(follower);
    cluster.wait_for(follower, "journal-9", &big);

    // A file larger than one entry carries goes in pieces, and arrives whole.
    let large: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 251) as u8).collect();
    cluster.write("ledger", &large);
    cluster.wait_for(follower, "ledger", &large);
    let staging = cluster.dir(follower).join("records").join("ledger.staging");
    assert!(!staging.exists(), "the pieces' file is left");
    cluster.write("after", b"ok");
    cluster.wait_for(follower, "after", b"ok");
}

/// Three nodes of a new cluster started moments apart, as three machines
/// are, all found it under their founding ids: none joins as a new member
/// (which would leave the cluster a fault away from no majority until its
/// join ends). The last one is heard before the others found the cluster
/// but starts its Raft only after they elected a leader and wrote: it
/// finds its own process among those the founders heard, and so takes its
/// founding id. A node whose data is lost after it ran is never heard
/// again as that process: it joins as a new member (the test above).
#[test]
fn nodes_started_moments_apart_all_found_the_cluster_under_their_founding_ids() {
    let mut cluster = Cluster::stopped(Duration::from_secs(60));
    let late = cluster.open(2);
    let first = [(0, cluster.open(0)), (1, cluster.open(1))];
    cluster.run(first.into());
    cluster.write("catalog", b"founded");
    cluster.run(vec![(2, late)]);
    cluster.wait_for(2, "catalog", b"founded");
    for (i, name) in NAMES.iter().enumerate() {
        assert_eq!(
            cluster.nodes[i].as_ref().unwrap().id(),
            member_id(name),
            "{name} is not a founding member"
        );
    }
    // Every node a voter that acknowledges: the two first nodes stopped in
    // turn, the cluster still takes writes.
    let leader = cluster.leader();
    cluster.stop(leader);
    cluster.write("catalog", b"one down");
}

/// A node of a new cluster started after the others' wait for it
/// (`FOUNDING_WAIT`) joins as a new member; the cluster takes writes the
/// whole time.
#[test]
fn a_node_started_after_the_founding_wait_joins_as_a_new_member() {
    let mut cluster = Cluster::stopped(Duration::from_secs(60));
    cluster.start_together(&[0, 1]);
    cluster.write("catalog", b"founded");
    cluster.start(2);
    cluster.wait_for(2, "catalog", b"founded");
    assert_ne!(cluster.nodes[2].as_ref().unwrap().id(), member_id("m2"));
}
