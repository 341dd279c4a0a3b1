//! What a master reads from its data directory when it starts, beside its
//! catalog: the layout its vectors were placed under (`placement.toml`), a
//! move in progress (`move.toml`), the journal of updates not yet applied
//! everywhere (`update-*.pending`), the writes owners missed
//! (`missed-writes`) and the ledger of epochs, write numbers and slaves'
//! stores (`ledger`, which a start moves to a new epoch). Each is checked
//! before the master serves; a damaged one stops it with an error naming
//! the file and the fix.

use std::collections::BTreeSet;

use super::journal::Journal;
use super::layout::Layout;
use super::ledger::Ledger;
use super::{missed, recorded};
use crate::catalog::Catalog;
use crate::cluster::ClusterConfig;

/// The master's records, read and checked.
pub(super) struct OnDisk {
    /// The layout vectors are read from, and the one they move to.
    pub(super) layout: Layout,
    /// The first vid a move in progress has not copied yet.
    pub(super) move_next: u64,
    /// The updates some owners have not applied yet.
    pub(super) journal: Journal,
    /// Per slave of the layout, the existing vectors it missed writes of.
    pub(super) missed: Vec<BTreeSet<u64>>,
    /// The epoch this start begins, the write numbers and slaves' stores.
    pub(super) ledger: Ledger,
}

/// Reads the records in `catalog`'s directory for a master started with
/// the cluster file `file`.
pub(super) fn read(catalog: &Catalog, file: &ClusterConfig) -> Result<OnDisk, String> {
    let dir = catalog.directory();
    let current = recorded::layout(&**dir, file, !catalog.is_empty())?;
    let moving = recorded::read_move(&**dir, &current, file)?;
    let move_next = moving.as_ref().map_or(0, |m| m.next);
    let layout = Layout {
        current,
        target: moving.map(|m| m.target),
    };
    let journal = Journal::open(dir.clone())?;
    let ledger = Ledger::start(dir.clone(), journal.last_id())?;
    let mut missed = missed::read(&**dir, layout.slaves())?;
    for vids in &mut missed {
        vids.retain(|&vid| catalog.contains(vid));
    }
    Ok(OnDisk {
        layout,
        move_next,
        journal,
        missed,
        ledger,
    })
}

/// Refuses a record's list of `len` `what`s in a file of `bytes`: more than
/// the file has words. Each entry the master writes takes a word at least; a
/// list of empty structs takes none, and reading it would cost memory in
/// proportion to a count no byte of the file paid for.
pub(super) fn within_file(len: u32, bytes: usize, what: &str) -> capnp::Result<()> {
    if len as usize > bytes / 8 {
        return Err(capnp::Error::failed(format!(
            "{len} {what} in a file of {bytes} bytes"
        )));
    }
    Ok(())
}

#[cfg(feature = "fuzzing")]
pub use fuzzing::{Started, restart};

/// A master's start without a network, for the fuzz targets.
#[cfg(feature = "fuzzing")]
mod fuzzing {
    use std::path::Path;
    use std::sync::Arc;

    use bitfold_engine::store::{Directory, MemoryDirectory, VidLog};

    use super::{OnDisk, missed, read, recorded};
    use crate::catalog::Catalog;
    use crate::cluster::{ClusterConfig, ClusterFile};

    /// What a master started with, in plain values.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Started {
        /// The layout vectors are read from.
        pub current: ClusterConfig,
        /// The layout a move in progress goes to, and its next vid.
        pub moving: Option<(ClusterConfig, u64)>,
        /// The catalog: every existing vid, ascending.
        pub vids: Vec<u64>,
        /// Each pending update: its id, the owners waiting, its changes as text.
        pub pending: Vec<(u64, Vec<usize>, String)>,
        /// The vids the pending writes leave deleted, ascending, which a
        /// start takes out of the catalog.
        pub deleted: Vec<u64>,
        /// Per slave, the vids whose writes it missed.
        pub missed: Vec<Vec<u64>>,
        /// The ledger's stores: each slave's name, store id and a write
        /// that store applied.
        pub stores: Vec<(String, u64, u64)>,
    }

    /// Starts a master on `dir` with the cluster file `cluster` (its text),
    /// as far as a start reads and checks its records, then writes those
    /// records with the master's own writers into a new directory and starts
    /// on that. `Err` when the first start refuses (the reason); otherwise
    /// both starts, the second as it went.
    pub fn restart(
        dir: Arc<dyn Directory>,
        cluster: &str,
    ) -> Result<(Started, Result<Started, String>), String> {
        let file = ClusterFile::parse(cluster, Path::new("cluster.toml"))
            .map_err(|e| e.to_string())?
            .cluster;
        let catalog = Catalog::with_directory(dir).map_err(|e| e.to_string())?;
        let records = read(&catalog, &file)?;
        let first = started(&catalog, &records)?;
        let again: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let second = rewrite(&catalog, &records, &again).and_then(|()| {
            let catalog = Catalog::with_directory(again).map_err(|e| e.to_string())?;
            let records = read(&catalog, &file)?;
            started(&catalog, &records)
        });
        Ok((first, second))
    }

    fn started(catalog: &Catalog, records: &OnDisk) -> Result<Started, String> {
        let mut pending = Vec::new();
        for (id, update) in records.journal.pending() {
            let changes = update.changes().map_err(|e| e.to_string())?;
            let text = changes
                .iter()
                .map(|change| format!("{change:?}"))
                .collect::<Vec<_>>()
                .join("\n");
            pending.push((id, update.waiting.iter().copied().collect(), text));
        }
        Ok(Started {
            current: records.layout.current.clone(),
            moving: records
                .layout
                .target
                .clone()
                .map(|target| (target, records.move_next)),
            vids: catalog.range(0, u64::MAX).collect(),
            pending,
            deleted: records.journal.catalog_changes()?.1,
            missed: records
                .missed
                .iter()
                .map(|vids| vids.iter().copied().collect())
                .collect(),
            stores: records.ledger.stores(),
        })
    }

    /// Writes `records` and the catalog's vids into `to` as a master does.
    fn rewrite(catalog: &Catalog, records: &OnDisk, to: &Arc<dyn Directory>) -> Result<(), String> {
        let vids: Vec<u64> = catalog.range(0, u64::MAX).collect();
        let (mut log, _) = VidLog::with_directory(to.clone()).map_err(|e| e.to_string())?;
        log.append(&vids).map_err(|e| e.to_string())?;
        recorded::record(&**to, &records.layout.current).map_err(|e| e.to_string())?;
        if let Some(target) = &records.layout.target {
            let moving = recorded::Move {
                next: records.move_next,
                target: target.clone(),
            };
            recorded::record_move(&**to, &moving).map_err(|e| e.to_string())?;
        }
        records.journal.copy_to(to)?;
        records
            .ledger
            .record_in(to.clone())
            .apply()
            .map_err(|e| e.to_string())?;
        missed::write(to.clone(), records.layout.slaves(), &records.missed)
            .apply()
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
