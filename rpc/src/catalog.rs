//! The master's catalog: which vids exist.
//!
//! A range term costs the number of existing vids in it, never its width,
//! because the master enumerates terms from this set. It lives in memory as
//! a `BTreeSet<u64>` and on disk as the engine's [`VidLog`] in the master's
//! data directory. A delete (docs/protocol.md §8) takes vids out of it,
//! recorded in the same log.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use bitfold_engine::store::{Directory, MmapDirectory, StoreError, VidLog};

/// The set of existing vids, durable in a [`VidLog`].
#[derive(Debug)]
pub struct Catalog {
    vids: BTreeSet<u64>,
    /// The master's data directory, locked while the catalog lives.
    dir: Arc<dyn Directory>,
    /// Shared with the blocking thread that appends and syncs.
    log: Arc<Mutex<VidLog>>,
}

impl Catalog {
    /// Opens the catalog in `dir` (created if missing); a damaged log is
    /// refused with an error naming its file.
    pub fn open(dir: &Path) -> Result<Catalog, StoreError> {
        Catalog::with_directory(Arc::new(MmapDirectory::open(dir)?))
    }

    /// A catalog of `vids` held in memory; nothing durable.
    #[cfg(test)]
    pub(crate) fn in_memory(vids: impl IntoIterator<Item = u64>) -> Catalog {
        let memory = bitfold_engine::store::MemoryDirectory::new();
        let mut catalog = Catalog::with_directory(Arc::new(memory))
            .expect("an empty in-memory directory always opens");
        catalog.vids.extend(vids);
        catalog
    }

    fn with_directory(dir: Arc<dyn Directory>) -> Result<Catalog, StoreError> {
        let (log, vids) = VidLog::with_directory(dir.clone())?;
        Ok(Catalog {
            vids: vids.into_iter().collect(),
            dir,
            log: Arc::new(Mutex::new(log)),
        })
    }

    /// The master's data directory the catalog lives in, for the master's
    /// other records.
    pub(crate) fn directory(&self) -> &Arc<dyn Directory> {
        &self.dir
    }

    /// The catalog's file.
    pub fn path(&self) -> std::path::PathBuf {
        lock(&self.log).path().to_owned()
    }

    /// Whether vector `vid` exists.
    pub fn contains(&self, vid: u64) -> bool {
        self.vids.contains(&vid)
    }

    /// The existing vids in `first..=last`, ascending.
    pub fn range(&self, first: u64, last: u64) -> impl Iterator<Item = u64> + '_ {
        self.vids.range(first..=last).copied()
    }

    /// Number of existing vids.
    pub fn len(&self) -> usize {
        self.vids.len()
    }

    /// Whether no vid exists.
    pub fn is_empty(&self) -> bool {
        self.vids.is_empty()
    }

    /// Records `vids` as existing, durably (synced) before returning; returns
    /// how many were new. Vids already known cost nothing. The write and
    /// sync run on a blocking thread, so the caller's event loop goes on
    /// serving meanwhile; the vids join the set once they are durable.
    pub async fn insert(
        catalog: &RefCell<Catalog>,
        vids: impl IntoIterator<Item = u64>,
    ) -> Result<usize, StoreError> {
        let (new, log) = {
            let catalog = catalog.borrow();
            let new: BTreeSet<u64> = vids
                .into_iter()
                .filter(|v| !catalog.vids.contains(v))
                .collect();
            (new, Arc::clone(&catalog.log))
        };
        if new.is_empty() {
            return Ok(0);
        }
        let new: Vec<u64> = new.into_iter().collect();
        let written = tokio::task::spawn_blocking(move || lock(&log).append(&new).map(|()| new));
        let new = match written.await {
            Ok(written) => written?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        };
        let mut catalog = catalog.borrow_mut();
        let before = catalog.vids.len();
        catalog.vids.extend(new);
        Ok(catalog.vids.len() - before)
    }
}

impl Catalog {
    /// Records that `vids` no longer exist, durably (synced) before
    /// returning, on a blocking thread like [`Catalog::insert`]; returns how
    /// many existed. The vids leave the set once that is durable.
    pub async fn remove(
        catalog: &RefCell<Catalog>,
        vids: impl IntoIterator<Item = u64>,
    ) -> Result<usize, StoreError> {
        let (gone, log) = {
            let catalog = catalog.borrow();
            let gone: BTreeSet<u64> = vids
                .into_iter()
                .filter(|v| catalog.vids.contains(v))
                .collect();
            (gone, Arc::clone(&catalog.log))
        };
        if gone.is_empty() {
            return Ok(0);
        }
        let gone: Vec<u64> = gone.into_iter().collect();
        let written = tokio::task::spawn_blocking(move || lock(&log).remove(&gone).map(|()| gone));
        let gone = match written.await {
            Ok(written) => written?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        };
        let mut catalog = catalog.borrow_mut();
        for vid in &gone {
            catalog.vids.remove(vid);
        }
        Ok(gone.len())
    }
}

fn lock(log: &Mutex<VidLog>) -> std::sync::MutexGuard<'_, VidLog> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(catalog: &RefCell<Catalog>, vids: &[u64]) -> usize {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(Catalog::insert(catalog, vids.iter().copied()))
            .unwrap()
    }

    #[test]
    fn survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = RefCell::new(Catalog::open(dir.path()).unwrap());
        assert!(catalog.borrow().is_empty());
        assert_eq!(insert(&catalog, &[5, 1, u64::MAX, 5]), 3);
        assert_eq!(insert(&catalog, &[1, 7]), 1);
        assert_eq!(insert(&catalog, &[7]), 0);
        drop(catalog);
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(
            catalog.range(0, u64::MAX).collect::<Vec<_>>(),
            vec![1, 5, 7, u64::MAX]
        );
        assert_eq!(catalog.range(2, 7).collect::<Vec<_>>(), vec![5, 7]);
        assert!(catalog.contains(u64::MAX) && !catalog.contains(2));
        assert_eq!(catalog.len(), 4);
    }

    #[test]
    fn removed_vids_stay_removed_after_reopening_until_inserted_again() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let catalog = RefCell::new(Catalog::open(dir.path()).unwrap());
        insert(&catalog, &[1, 2, 3, 4]);
        let removed = runtime.block_on(Catalog::remove(&catalog, [2, 4, 9]));
        assert_eq!(removed.unwrap(), 2);
        assert_eq!(catalog.borrow().range(0, 9).collect::<Vec<_>>(), [1, 3]);
        drop(catalog);
        let catalog = RefCell::new(Catalog::open(dir.path()).unwrap());
        assert_eq!(catalog.borrow().range(0, 9).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(insert(&catalog, &[4]), 1);
        drop(catalog);
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(catalog.range(0, 9).collect::<Vec<_>>(), [1, 3, 4]);
    }

    #[test]
    fn a_damaged_catalog_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = Catalog::open(dir.path()).unwrap().path();
        std::fs::write(&path, b"something else entirely").unwrap();
        let message = Catalog::open(dir.path()).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("bad magic"), "{message}");
    }
}
