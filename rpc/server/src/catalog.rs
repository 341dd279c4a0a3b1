//! The master's catalog: which vids exist.
//!
//! A range term costs the number of existing vids in it, never its width,
//! because the master enumerates terms from this set. It lives in memory as
//! its runs of consecutive vids (a term of a dense index costs its runs) and
//! on disk as the engine's [`VidLog`] in the master's data directory. A delete (docs/protocol.md §8) takes vids out of it,
//! recorded in the same log.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use bitfold_engine::store::{Directory, MmapDirectory, StoreError, VidLog};

use crate::chain::VidRun;
use crate::pieces::Pieces;

/// The set of existing vids, durable in a [`VidLog`].
#[derive(Debug)]
pub struct Catalog {
    vids: Runs,
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
        for vid in vids {
            catalog.vids.insert(vid);
        }
        catalog
    }

    /// Opens the catalog in `dir`; a damaged log is refused with an error
    /// naming its file.
    pub(crate) fn with_directory(dir: Arc<dyn Directory>) -> Result<Catalog, StoreError> {
        let (log, vids) = VidLog::with_directory(dir.clone())?;
        Ok(Catalog {
            vids: Runs::of(vids),
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
        self.vids.contains(vid)
    }

    /// The existing vids in `first..=last`, ascending.
    pub fn range(&self, first: u64, last: u64) -> impl Iterator<Item = u64> + '_ {
        self.runs(first, last).flat_map(|run| run.vids())
    }

    /// The existing vids in `first..=last` as runs of consecutive vids,
    /// ascending, each as long as it can be: O(log n) plus one step per run.
    pub(crate) fn runs(&self, first: u64, last: u64) -> impl Iterator<Item = VidRun> + '_ {
        self.vids.clipped(first, last)
    }

    /// The pieces some existing vector holds a bit in, ascending: one
    /// search per piece found.
    pub(crate) fn pieces(&self, pieces: Pieces) -> Vec<u32> {
        let mut found = Vec::new();
        let mut next = 0;
        while next < pieces.count() {
            let Some(run) = self.runs(pieces.key(0, next), u64::MAX).next() else {
                break;
            };
            let piece = pieces.split(run.first).1;
            found.push(piece);
            next = piece + 1;
        }
        found
    }

    /// Number of existing vids.
    pub fn len(&self) -> usize {
        self.vids.len
    }

    /// Whether no vid exists.
    pub fn is_empty(&self) -> bool {
        self.vids.len == 0
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
                .filter(|&v| !catalog.vids.contains(v))
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
        let before = catalog.vids.len;
        for vid in new {
            catalog.vids.insert(vid);
        }
        Ok(catalog.vids.len - before)
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
                .filter(|&v| catalog.vids.contains(v))
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
        for &vid in &gone {
            catalog.vids.remove(vid);
        }
        Ok(gone.len())
    }
}

/// A set of vids kept as its maximal runs: `first -> last`, disjoint and
/// never touching.
#[derive(Debug, Default)]
struct Runs {
    runs: BTreeMap<u64, u64>,
    /// Vids in all the runs.
    len: usize,
}

impl Runs {
    /// The runs of `vids` (in any order, repeats allowed): a sort, then one
    /// map built in order, not a search of the map per vid.
    fn of(mut vids: Vec<u64>) -> Runs {
        vids.sort_unstable();
        vids.dedup();
        Runs {
            len: vids.len(),
            runs: VidRun::runs_of(&vids)
                .into_iter()
                .map(|run| (run.first, run.last))
                .collect(),
        }
    }

    /// The run holding `vid`, as `(first, last)`.
    fn holding(&self, vid: u64) -> Option<(u64, u64)> {
        let (&first, &last) = self.runs.range(..=vid).next_back()?;
        (last >= vid).then_some((first, last))
    }

    fn contains(&self, vid: u64) -> bool {
        self.holding(vid).is_some()
    }

    /// Adds `vid`; whether it was new.
    fn insert(&mut self, vid: u64) -> bool {
        if self.contains(vid) {
            return false;
        }
        let before = vid
            .checked_sub(1)
            .and_then(|v| self.holding(v))
            .map(|(first, _)| first);
        let after = vid.checked_add(1).and_then(|v| self.runs.remove(&v));
        let last = after.unwrap_or(vid);
        match before {
            Some(first) => self.runs.insert(first, last),
            None => self.runs.insert(vid, last),
        };
        self.len += 1;
        true
    }

    /// Takes `vid` out; whether it was there.
    fn remove(&mut self, vid: u64) -> bool {
        let Some((first, last)) = self.holding(vid) else {
            return false;
        };
        if first < vid {
            self.runs.insert(first, vid - 1);
        } else {
            self.runs.remove(&first);
        }
        if vid < last {
            self.runs.insert(vid + 1, last);
        }
        self.len -= 1;
        true
    }

    /// The runs within `first..=last`, cut to it.
    fn clipped(&self, first: u64, last: u64) -> impl Iterator<Item = VidRun> + '_ {
        let head = self
            .holding(first)
            .filter(|&(start, _)| start < first && first <= last);
        let rest = (first <= last).then(|| self.runs.range(first..=last));
        head.into_iter()
            .chain(rest.into_iter().flatten().map(|(&a, &b)| (a, b)))
            .map(move |(a, b)| VidRun {
                first: a.max(first),
                last: b.min(last),
            })
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

    proptest::proptest! {
        /// Runs hold exactly the vids a `BTreeSet` would, through inserts
        /// and removes near each other and at both ends of the vids, and
        /// clip to any range as the set's `range` does.
        #[test]
        fn runs_are_the_set_of_their_vids(
            steps in proptest::collection::vec((proptest::bool::ANY, 0u64..40), 0..120),
            ranges in proptest::collection::vec((0u64..44, 0u64..44), 1..8),
        ) {
            let mut runs = Runs::default();
            let mut oracle = BTreeSet::new();
            // Near 0 and near u64::MAX alike.
            let vid = |v: u64| if v < 20 { v } else { u64::MAX - (v - 20) };
            for (add, v) in steps {
                let v = vid(v);
                if add {
                    proptest::prop_assert_eq!(runs.insert(v), oracle.insert(v));
                } else {
                    proptest::prop_assert_eq!(runs.remove(v), oracle.remove(&v));
                }
                proptest::prop_assert_eq!(runs.len, oracle.len());
            }
            // Built at once from the vids, unsorted and repeated, as a
            // log is read back: the same runs.
            let logged: Vec<u64> = oracle.iter().rev().chain(&oracle).copied().collect();
            let built = Runs::of(logged);
            proptest::prop_assert_eq!(&built.runs, &runs.runs);
            proptest::prop_assert_eq!(built.len, runs.len);
            let maximal = runs
                .runs
                .iter()
                .zip(runs.runs.iter().skip(1))
                .all(|((_, &last), (&next, _))| last.checked_add(1).is_some_and(|l| l < next));
            proptest::prop_assert!(maximal, "runs touch: {:?}", runs.runs);
            for (a, b) in ranges {
                let (first, last) = (vid(a.min(b)).min(vid(a.max(b))), vid(a.min(b)).max(vid(a.max(b))));
                let got: Vec<u64> = runs.clipped(first, last).flat_map(|r| r.vids()).collect();
                let want: Vec<u64> = oracle.range(first..=last).copied().collect();
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert!(runs.clipped(last, first).next().is_none() || first == last);
            }
        }
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
