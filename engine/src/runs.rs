//! Runs of consecutive vids: how a cover and an existence check are asked
//! for a range of vids, so that they cost its runs, not its vids.

/// The vids `first..=last` (`first <= last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VidRun {
    /// The first vid of the run.
    pub first: u64,
    /// The last vid of the run (included).
    pub last: u64,
}

impl VidRun {
    /// The run of the one vid `vid`.
    pub fn one(vid: u64) -> VidRun {
        VidRun {
            first: vid,
            last: vid,
        }
    }

    /// How many vids it names (`u64::MAX` for all 2^64 of them).
    pub fn count(&self) -> u64 {
        (self.last - self.first).saturating_add(1)
    }

    /// Its vids, ascending.
    pub fn vids(&self) -> std::ops::RangeInclusive<u64> {
        self.first..=self.last
    }

    /// `runs` sorted, with overlapping and touching runs merged into one:
    /// the same vids, each named once, ascending.
    pub fn merged(mut runs: Vec<VidRun>) -> Vec<VidRun> {
        runs.sort_unstable();
        let mut out: Vec<VidRun> = Vec::with_capacity(runs.len());
        for run in runs {
            match out.last_mut() {
                Some(last) if run.first <= last.last.saturating_add(1) => {
                    last.last = last.last.max(run.last);
                }
                _ => out.push(run),
            }
        }
        out
    }

    /// The runs of `vids` (ascending, distinct), ascending.
    pub fn runs_of(vids: &[u64]) -> Vec<VidRun> {
        let mut runs: Vec<VidRun> = Vec::new();
        for &vid in vids {
            match runs.last_mut() {
                Some(run) if run.last.checked_add(1) == Some(vid) => run.last = vid,
                _ => runs.push(VidRun::one(vid)),
            }
        }
        runs
    }
}

/// Whether `runs` ascend, each after the one before: what the run readers
/// of a snapshot take.
#[cfg(feature = "store")]
pub(crate) fn ascending(runs: &[VidRun]) -> bool {
    runs.iter().all(|r| r.first <= r.last) && runs.windows(2).all(|w| w[0].last < w[1].first)
}

/// The vids of `runs` that are in none of `holes`, as runs; both ascending
/// (holes may touch, not overlap).
#[cfg(feature = "store")]
pub(crate) fn subtract(runs: &[VidRun], holes: &[VidRun]) -> Vec<VidRun> {
    if holes.is_empty() {
        return runs.to_vec();
    }
    let mut out = Vec::with_capacity(runs.len());
    let mut h = 0;
    for &run in runs {
        while h < holes.len() && holes[h].last < run.first {
            h += 1;
        }
        let mut first = run.first;
        let mut open = true;
        let mut k = h;
        while open && k < holes.len() && holes[k].first <= run.last {
            let hole = holes[k];
            if hole.first > first {
                out.push(VidRun {
                    first,
                    last: hole.first - 1,
                });
            }
            if hole.last >= run.last {
                open = false;
            } else {
                first = first.max(hole.last + 1);
                k += 1;
            }
        }
        if open {
            out.push(VidRun {
                first,
                last: run.last,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn vids_of(runs: &[VidRun]) -> BTreeSet<u64> {
        runs.iter().flat_map(|r| r.vids()).collect()
    }

    /// Ascending runs near 0 or near `u64::MAX`, from a set of offsets.
    fn runs(offsets: BTreeSet<u64>, high: bool) -> Vec<VidRun> {
        let vids: Vec<u64> = if high {
            offsets.iter().rev().map(|o| u64::MAX - o).collect()
        } else {
            offsets.into_iter().collect()
        };
        VidRun::runs_of(&vids)
    }

    proptest! {
        #[test]
        fn subtract_leaves_the_vids_in_no_hole(
            a in proptest::collection::btree_set(0u64..200, 0..80),
            b in proptest::collection::btree_set(0u64..200, 0..80),
            high in any::<bool>(),
        ) {
            let (runs, holes) = (runs(a, high), runs(b, high));
            prop_assert!(ascending(&runs) && ascending(&holes));
            let left = subtract(&runs, &holes);
            prop_assert!(ascending(&left));
            let want: BTreeSet<u64> = vids_of(&runs).difference(&vids_of(&holes)).copied().collect();
            prop_assert_eq!(vids_of(&left), want);
        }
    }

    proptest! {
        #[test]
        fn merged_names_the_same_vids_once_ascending(
            spans in proptest::collection::vec((0u64..300, 0u64..40), 0..20),
            high in any::<bool>(),
        ) {
            let given: Vec<VidRun> = spans
                .iter()
                .map(|&(first, len)| {
                    let run = VidRun { first, last: first + len };
                    if high {
                        VidRun { first: u64::MAX - run.last, last: u64::MAX - run.first }
                    } else {
                        run
                    }
                })
                .collect();
            let merged = VidRun::merged(given.clone());
            prop_assert!(ascending(&merged));
            // Touching runs are joined: no gap of zero vids between two.
            prop_assert!(merged.windows(2).all(|w| w[0].last + 1 < w[1].first));
            prop_assert_eq!(vids_of(&merged), vids_of(&given));
        }
    }

    #[test]
    fn runs_of_joins_consecutive_vids() {
        let runs = VidRun::runs_of(&[0, 1, 2, 5, 7, 8, u64::MAX - 1, u64::MAX]);
        let pairs: Vec<(u64, u64)> = runs.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(pairs, [(0, 2), (5, 5), (7, 8), (u64::MAX - 1, u64::MAX)]);
        assert_eq!(runs[3].count(), 2);
        assert!(!ascending(&[VidRun::one(3), VidRun::one(3)]));
    }
}
