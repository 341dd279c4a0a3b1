//! Three Raft nodes in one process, each on its own folder, talking over
//! an in-memory transport: what one leader writes through its records
//! directory every node holds; a node stopped while the others went on
//! catches up from a snapshot; a leader stopped is replaced.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bitfold_engine::store::{MmapDirectory, read_sealed, write_sealed};
use bitfold_quorum::network::Sent;
use bitfold_quorum::{Quorum, QuorumOptions, Transport};

/// Carries each message straight to the node at its address, if running.
#[derive(Default)]
struct InMemory {
    nodes: Mutex<HashMap<String, Weak<Quorum>>>,
}

impl Transport for InMemory {
    fn send(&self, addr: &str, message: Vec<u8>, _timeout: Duration) -> Sent {
        let node = self.nodes.lock().unwrap().get(addr).and_then(Weak::upgrade);
        Box::pin(async move {
            match node {
                Some(node) => Ok(node.answer(&message).await),
                None => Err("stopped".to_owned()),
            }
        })
    }
}

const NAMES: [&str; 3] = ["m0", "m1", "m2"];

struct Cluster {
    root: tempfile::TempDir,
    transport: Arc<InMemory>,
    nodes: Vec<Option<Arc<Quorum>>>,
}

impl Cluster {
    fn new() -> Cluster {
        let mut cluster = Cluster {
            root: tempfile::tempdir().unwrap(),
            transport: Arc::new(InMemory::default()),
            nodes: vec![None, None, None],
        };
        for i in 0..3 {
            cluster.start(i);
        }
        cluster
    }

    fn dir(&self, i: usize) -> std::path::PathBuf {
        self.root.path().join(NAMES[i])
    }

    fn start(&mut self, i: usize) {
        let masters = NAMES
            .iter()
            .map(|n| (n.to_string(), format!("addr-{n}")))
            .collect();
        let mut options = QuorumOptions::new(NAMES[i].into(), masters, self.dir(i));
        options.snapshot_every = 20;
        options.write_timeout = Duration::from_secs(3);
        let node = Arc::new(Quorum::open(options, self.transport.clone()).unwrap());
        self.transport
            .nodes
            .lock()
            .unwrap()
            .insert(format!("addr-{}", NAMES[i]), Arc::downgrade(&node));
        self.nodes[i] = Some(node);
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

    /// Waits until node `i`'s records hold file `name` with `body`.
    fn wait_for(&self, i: usize, name: &str, body: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(20);
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
    let records = cluster.nodes[leader].as_ref().unwrap().records();
    write_sealed(&*records, "catalog", b"first").unwrap();
    for i in 0..3 {
        cluster.wait_for(i, "catalog", b"first");
    }

    // A follower stops; the others go on past a snapshot and drop the log.
    let follower = (leader + 1) % 3;
    cluster.stop(follower);
    for n in 0..60u32 {
        write_sealed(&*records, &format!("f{}", n % 7), &n.to_le_bytes()).unwrap();
    }
    records.delete("f0").unwrap();
    write_sealed(&*records, "catalog", b"second").unwrap();
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
    drop(records);
    cluster.stop(leader);
    let next = cluster.leader();
    assert_ne!(next, leader);
    let records = cluster.nodes[next].as_ref().unwrap().records();
    assert!(records.list().unwrap().contains(&"catalog".to_owned()));
    write_sealed(&*records, "catalog", b"third").unwrap();
    cluster.start(leader);
    cluster.wait_for(leader, "catalog", b"third");
}

#[test]
fn a_write_without_a_majority_fails_and_changes_nothing_it_reports() {
    let mut cluster = Cluster::new();
    let leader = cluster.leader();
    let records = cluster.nodes[leader].as_ref().unwrap().records();
    write_sealed(&*records, "ledger", b"one").unwrap();
    cluster.stop((leader + 1) % 3);
    cluster.stop((leader + 2) % 3);
    let err = write_sealed(&*records, "ledger", b"two").unwrap_err();
    assert!(err.to_string().contains("no majority of masters"), "{err}");
    assert_eq!(read_copy(&cluster.dir(leader), "ledger").unwrap(), b"one");
}
