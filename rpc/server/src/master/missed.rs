//! The master's record of the writes an owner missed (docs/protocol.md §9).
//!
//! A slave found holding another store than the one the ledger names (a
//! wiped or new disk, a restored backup) missed writes to every vector it
//! owns; it may hold some of them all the same, from writes since. The
//! master reads them from the other owners until they are copied back
//! (`refill`). That choice must outlive the master: nothing a restarted
//! master could ask the slave would show what it lacks. So the vids are
//! recorded, per slave by its name, in one sealed file of the master's data
//! directory, `missed-writes`, rewritten whole as they change. (Masters
//! before the journal of imports wrote it for imports that failed on an
//! owner; such a record is read the same way.)

use std::collections::BTreeSet;
use std::sync::Arc;

use bitfold_engine::store::{Directory, read_sealed};
use capnp::message::{Builder, ReaderOptions};

use super::journal::Write;
use super::recorded;
use crate::bitfold_capnp::missed_writes;
use crate::cluster::SlaveEntry;

/// The file, in the master's data directory.
const FILE: &str = "missed-writes";

/// Per slave of `slaves` (in order), the vids `dir` records it missed. A
/// slave the record names that is not in `slaves` (removed from the
/// cluster since) has nothing left to be read from; a damaged record is
/// refused with an error naming its file.
pub(super) fn read(
    dir: &dyn Directory,
    slaves: &[SlaveEntry],
) -> Result<Vec<BTreeSet<u64>>, String> {
    let mut missed = vec![BTreeSet::new(); slaves.len()];
    if !recorded::holds(dir, FILE)? {
        return Ok(missed);
    }
    let damaged = |reason: String| {
        format!(
            "{} is damaged ({reason}); it names the vectors a failed import left different \
             between their owners: restore it from a backup, or remove it and import those \
             vectors again",
            dir.path(FILE).display()
        )
    };
    let body = read_sealed(dir, FILE).map_err(|e| damaged(e.to_string()))?;
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(crate::net::MAX_MESSAGE_WORDS));
    let message = capnp::serialize::read_message_from_flat_slice(&mut &body[..], options)
        .map_err(|e| damaged(e.to_string()))?;
    let mut named = || -> capnp::Result<()> {
        let list = message
            .get_root::<missed_writes::Reader<'_>>()?
            .get_slaves()?;
        super::start::within_file(list.len(), body.len(), "slaves")?;
        for by in list.iter() {
            let name = by.get_name()?.to_str()?;
            if let Some(index) = slaves.iter().position(|s| s.name == name) {
                missed[index].extend(by.get_vids()?.iter());
            }
        }
        Ok(())
    };
    named().map_err(|e| damaged(e.to_string()))?;
    Ok(missed)
}

/// The write that records `missed`, per slave of `slaves` (in order), in
/// `dir`; make it durable with [`Write::persist`].
pub(super) fn write(
    dir: Arc<dyn Directory>,
    slaves: &[SlaveEntry],
    missed: &[BTreeSet<u64>],
) -> Write {
    let mut message = Builder::new_default();
    let root: missed_writes::Builder<'_> = message.init_root();
    let named: Vec<(&SlaveEntry, &BTreeSet<u64>)> = slaves
        .iter()
        .zip(missed)
        .filter(|(_, vids)| !vids.is_empty())
        .collect();
    let mut list = root.init_slaves(named.len() as u32);
    for (i, (slave, vids)) in named.into_iter().enumerate() {
        let mut by = list.reborrow().get(i as u32);
        by.set_name(&slave.name);
        let mut out = by.init_vids(vids.len() as u32);
        for (j, &vid) in vids.iter().enumerate() {
            out.set(j as u32, vid);
        }
    }
    let bytes = capnp::serialize::write_message_to_words(&message);
    Write::Replace(dir, FILE.to_string(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::store::MemoryDirectory;

    fn slaves(names: &[&str]) -> Vec<SlaveEntry> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| SlaveEntry {
                name: name.to_string(),
                addr: format!("127.0.0.1:{}", 7000 + i),
            })
            .collect()
    }

    #[test]
    fn the_record_reads_back_by_slave_name() {
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        assert_eq!(
            read(&*dir, &slaves(&["s0", "s1"])).unwrap(),
            vec![BTreeSet::new(); 2],
            "no record: nothing missed"
        );
        let missed = vec![BTreeSet::new(), BTreeSet::from([3, u64::MAX])];
        let Write::Replace(_, name, bytes) = write(dir.clone(), &slaves(&["s0", "s1"]), &missed)
        else {
            panic!("the record is written whole");
        };
        bitfold_engine::store::write_sealed(&*dir, &name, &bytes).unwrap();
        assert_eq!(read(&*dir, &slaves(&["s0", "s1"])).unwrap(), missed);
        // s1 moved to the end of a longer cluster keeps its vids by name; a
        // cluster without it has nothing to read them from.
        assert_eq!(
            read(&*dir, &slaves(&["s0", "s2", "s1"])).unwrap()[2],
            missed[1]
        );
        assert_eq!(
            read(&*dir, &slaves(&["s0"])).unwrap(),
            vec![BTreeSet::new()]
        );
    }

    #[test]
    fn a_damaged_record_is_refused_naming_its_file() {
        let dir = MemoryDirectory::new();
        bitfold_engine::store::write_sealed(&dir, FILE, b"not a message").unwrap();
        let err = read(&dir, &slaves(&["s0"])).unwrap_err();
        assert!(err.contains("missed-writes is damaged"), "{err}");
        let mut file = dir.create(FILE).unwrap();
        file.write_all(b"torn").unwrap();
        file.commit().unwrap();
        assert!(
            read(&dir, &slaves(&["s0"]))
                .unwrap_err()
                .contains("damaged")
        );
        // Three words naming 2^27 - 16 slaves of no words each, which a
        // master once read into 6 GiB.
        let count: u64 = (1 << 27) - 16;
        let mut body = Vec::new();
        for word in [3 << 32, 1 << 48, 1 | 7 << 32, count << 2] {
            body.extend(u64::to_le_bytes(word));
        }
        bitfold_engine::store::write_sealed(&dir, FILE, &body).unwrap();
        let err = read(&dir, &slaves(&["s0"])).unwrap_err();
        assert!(
            err.contains(&format!("{count} slaves in a file of 32 bytes")),
            "{err}"
        );
    }
}
