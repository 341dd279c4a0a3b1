use bitfold_engine::store::Directory;
use bitfold_engine::store::VID_LOG_NAME;
use bitfold_server::fuzzing::master_restart;

use crate::files::directory;

/// The names a fuzzed master directory's files get, by the first byte of
/// their record: the cluster file the master is started with, then what
/// the master keeps in its data directory.
const NAMES: [&str; 8] = [
    "cluster.toml",
    "placement.toml",
    "move.toml",
    "update-00000000000000000001.pending",
    "update-00000000000000000002.pending",
    "missed-writes",
    VID_LOG_NAME,
    "ledger",
];

/// The cluster file a master is started with when the input has none.
const CLUSTER: &str = "replicas = 2\ngroup = 16\npiece = 4294967296\n\
    [[slaves]]\nname = \"s0\"\naddr = \"127.0.0.1:7101\"\n\
    [[slaves]]\nname = \"s1\"\naddr = \"127.0.0.1:7102\"\n\
    [[slaves]]\nname = \"s2\"\naddr = \"127.0.0.1:7103\"\n";

/// A master's start: `data` is a list of files (`files.rs`) put in a
/// `MemoryDirectory`, the cluster file among them (or a default one of three slaves); the
/// journal's, the missed writes' and the ledger's sealed files and the
/// catalog log are resealed where asked. Starting never panics, and if it starts: its
/// layouts are valid, a move's target extends the current layout (the same
/// group, the same slave at every position both have), the missed writes
/// name existing vectors, one set per slave; and the records the master
/// writes of what it read, read back, start it the same way.
pub fn master(data: &[u8]) {
    let dir = directory(data, &NAMES);
    let cluster = match dir.read(NAMES[0]) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => CLUSTER.to_owned(),
    };
    let Ok((first, second)) = master_restart(dir, &cluster) else {
        return;
    };
    assert_eq!(
        second.as_ref(),
        Ok(&first),
        "a master reads back what it writes"
    );
    assert_eq!(first.current.validate(), Ok(()));
    assert!(first.vids.windows(2).all(|w| w[0] < w[1]));
    let mut slaves = first.current.slaves.len();
    if let Some((target, _)) = &first.moving {
        assert_eq!(target.validate(), Ok(()));
        assert_eq!(target.group, first.current.group, "a move keeps the group");
        for (now, then) in first.current.slaves.iter().zip(&target.slaves) {
            assert_eq!(now.name, then.name, "a move keeps every slave in place");
        }
        slaves = slaves.max(target.slaves.len());
    }
    assert_eq!(
        first.missed.len(),
        slaves,
        "one set of missed writes per slave"
    );
    for vids in &first.missed {
        assert!(vids.iter().all(|v| first.vids.binary_search(v).is_ok()));
    }
    assert!(
        first.stores.windows(2).all(|w| w[0].0 < w[1].0),
        "one store per slave name"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bitfold_engine::store::{MemoryDirectory, VidLog, write_sealed};
    use bitfold_proto::bitfold_capnp::{ledger, missed_writes, pending_update};
    use capnp::message::Builder;

    use super::*;
    use crate::files::records;

    /// A move to a fourth slave, 3 vids in.
    const MOVE: &str = "next = 3\n[target]\nreplicas = 2\ngroup = 16\n\
        [[target.slaves]]\nname = \"s0\"\naddr = \"127.0.0.1:7101\"\n\
        [[target.slaves]]\nname = \"s1\"\naddr = \"127.0.0.1:7102\"\n\
        [[target.slaves]]\nname = \"s2\"\naddr = \"127.0.0.1:7103\"\n\
        [[target.slaves]]\nname = \"s3\"\naddr = \"127.0.0.1:7104\"\n";

    /// A pending update `id`: a delete of `deleted` and a clear of `cleared`,
    /// waiting for `waiting`, as the sealed file the journal writes.
    fn update(id: u64, deleted: u64, cleared: u64, waiting: &[u32]) -> Vec<u8> {
        let mut message = Builder::new_default();
        let mut root: pending_update::Builder<'_> = message.init_root();
        root.set_id(id);
        let mut list = root.reborrow().init_waiting(waiting.len() as u32);
        for (i, &owner) in waiting.iter().enumerate() {
            list.set(i as u32, owner);
        }
        let mut changes = root.init_changes(2);
        changes.reborrow().get(0).set_vid(deleted);
        changes.reborrow().get(0).set_delete(());
        changes.reborrow().get(1).set_vid(cleared);
        changes.reborrow().get(1).init_clear(0);
        sealed(&capnp::serialize::write_message_to_words(&message))
    }

    fn sealed(body: &[u8]) -> Vec<u8> {
        let dir = MemoryDirectory::new();
        write_sealed(&dir, "f", body).unwrap();
        dir.read("f").unwrap().to_vec()
    }

    /// A master's data directory with every record: a catalog of vids 1, 2,
    /// 3, 9 and 40, its placement, a move in progress, two pending updates
    /// and s1's missed writes of vids 2, 9 and 77 (gone since).
    fn every_record() -> Vec<(&'static str, Vec<u8>)> {
        let log = Arc::new(MemoryDirectory::new());
        let (mut vids, _) = VidLog::with_directory(log.clone()).unwrap();
        vids.append(&[1, 2, 3, 9, 40]).unwrap();
        let mut book = Builder::new_default();
        let mut root: ledger::Builder<'_> = book.init_root();
        root.set_epoch(4);
        root.set_next_write(100);
        let mut slave = root.init_slaves(1).get(0);
        slave.set_name("s2");
        slave.set_store(77);
        slave.set_applied(12);
        let mut missed = Builder::new_default();
        let root: missed_writes::Builder<'_> = missed.init_root();
        let mut by = root.init_slaves(1).get(0);
        by.set_name("s1");
        let mut list = by.init_vids(3);
        for (i, vid) in [2, 9, 77].into_iter().enumerate() {
            list.set(i as u32, vid);
        }
        vec![
            (NAMES[0], CLUSTER.into()),
            // A placement record from before pieces: whole vectors.
            (NAMES[1], CLUSTER.replace("piece = 4294967296\n", "").into()),
            (NAMES[2], MOVE.into()),
            (NAMES[3], update(1, 40, 2, &[1])),
            (NAMES[4], update(2, 3, 9, &[0, 3])),
            (
                NAMES[5],
                sealed(&capnp::serialize::write_message_to_words(&missed)),
            ),
            (NAMES[6], log.read(VID_LOG_NAME).unwrap().to_vec()),
            (
                NAMES[7],
                sealed(&capnp::serialize::write_message_to_words(&book)),
            ),
        ]
    }

    fn input(reseal: bool) -> Vec<u8> {
        let files = every_record();
        let files: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, &b[..])).collect();
        records(&files, &NAMES, reseal)
    }

    #[test]
    fn a_directory_with_every_record_starts_and_restarts_the_same() {
        for reseal in [false, true] {
            let (first, second) =
                master_restart(directory(&input(reseal), &NAMES), CLUSTER).unwrap();
            assert_eq!(second.as_ref(), Ok(&first));
            assert_eq!(first.vids, [1, 2, 3, 9, 40]);
            let (target, next) = first.moving.as_ref().unwrap();
            assert_eq!((target.slaves.len(), *next), (4, 3));
            let ids: Vec<(u64, Vec<usize>)> = first
                .pending
                .iter()
                .map(|(id, w, _)| (*id, w.clone()))
                .collect();
            assert_eq!(ids, [(1, vec![1]), (2, vec![0, 3])]);
            assert_eq!(first.deleted, [3, 40]);
            assert_eq!(first.missed, [vec![], vec![2, 9], vec![], vec![]]);
            assert_eq!(first.stores, [("s2".to_string(), 77, 12)]);
            master(&input(reseal));
        }
    }

    #[test]
    fn the_committed_seeds_are_every_record() {
        let seeds = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/master");
        for (name, reseal) in [("every-record", false), ("every-record-resealed", true)] {
            let path = format!("{seeds}/{name}");
            if std::env::var_os("BITFOLD_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(seeds).unwrap();
                std::fs::write(&path, input(reseal)).unwrap();
            }
            let committed = std::fs::read(&path).unwrap();
            assert!(
                committed == input(reseal),
                "{path} is not the input this test builds: write it again with \
                 BITFOLD_WRITE_SEEDS=1 cargo test -p bitfold-fuzz-targets"
            );
        }
    }

    #[test]
    fn a_damaged_move_record_stops_the_start() {
        let mut files = every_record();
        files[2].1 = MOVE.replace("name = \"s1\"", "name = \"x1\"").into_bytes();
        let files: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, &b[..])).collect();
        let refused = master_restart(directory(&records(&files, &NAMES, false), &NAMES), CLUSTER)
            .unwrap_err();
        assert!(
            refused.contains("move.toml is not a move record"),
            "{refused}"
        );
    }
}
