//! Compaction: which segments to merge ([`full_run`]) and writing the
//! merged segment ([`write`]).
//!
//! Segments fall in size tiers a factor of [`MERGE_FACTOR`] apart; when a
//! tier holds [`MERGE_FACTOR`] segments, the shortest run of *consecutive*
//! segments (in age order) holding that many of the tier is merged into one
//! segment that takes the run's place. Only consecutive runs may be merged:
//! a `base` record of an old segment merged with a newer `set` record could
//! no longer be told apart from a `base` written after a segment outside the
//! group. The price is that a run may take in segments of other tiers lying
//! between those of the full tier (an import of a big batch between small
//! ones), which are then rewritten early; the number of segments keeps the
//! bound of merging whole tiers, since every merge leaves each tier below
//! [`MERGE_FACTOR`] segments.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::segment::{RecordKind, Segment, SegmentWriter};
use super::snapshot::VidMerge;
use super::storage::Directory;
use super::{MERGE_FACTOR, StoreError, aggregate, ends_range};

/// Segments smaller than `TIER_BASE × MERGE_FACTOR` bytes form the first tier.
const TIER_BASE: u64 = 1 << 20;

/// The size tier of a segment of `len` bytes.
fn tier_of(len: u64) -> u32 {
    let mut tier = 0;
    let mut size = len / (TIER_BASE * MERGE_FACTOR as u64);
    while size > 0 {
        size /= MERGE_FACTOR as u64;
        tier += 1;
    }
    tier
}

/// The run of consecutive `segments` (oldest first) to merge next: in the
/// smallest tier holding at least [`MERGE_FACTOR`] segments, the shortest
/// run holding [`MERGE_FACTOR`] of them (the oldest such run on a tie).
pub(super) fn full_run(segments: &[Arc<Segment>]) -> Option<Range<usize>> {
    let mut tiers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (at, segment) in segments.iter().enumerate() {
        tiers.entry(tier_of(segment.len())).or_default().push(at);
    }
    let (_, positions) = tiers
        .into_iter()
        .find(|(_, positions)| positions.len() >= MERGE_FACTOR)?;
    positions
        .windows(MERGE_FACTOR)
        .map(|w| w[0]..w[MERGE_FACTOR - 1] + 1)
        .min_by_key(|run| run.len())
}

/// Writes segment `id` holding what the consecutive segments `group`
/// (oldest first) hold; `at_oldest` says whether no segment is older than
/// the group. Returns the file's length.
///
/// Each vid's records are resolved newest first as a read does. The merged
/// record is `set` unless the group ended the vid's chain: then it is `base`
/// (the newer bits, or none) or `deleted` if nothing was set after the
/// delete. A group starting at the oldest segment has nothing older to
/// mask, so there a `base` with bits becomes `set` and a `deleted` record is
/// dropped; an empty `base` stays, being an existing empty vector. `keep`
/// records are dropped: the merged segment's aggregates cover only its own
/// records.
pub(super) fn write(
    dir: &dyn Directory,
    id: u64,
    group: &[Arc<Segment>],
    at_oldest: bool,
) -> Result<u64, StoreError> {
    let mut writer = SegmentWriter::create(dir, id)?;
    let mut merge = VidMerge::new(group);
    let (mut hits, mut kept, mut parts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut vids, mut all_kept, mut ends) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(vid) = merge.next_group(&mut hits) {
        hits.sort_unstable_by(|a, b| b.cmp(a));
        kept.clear();
        let mut end = None;
        for &(s, i) in &hits {
            let kind = group[s].kind_at(i);
            if kind != RecordKind::Deleted && kind != RecordKind::Keep {
                kept.push((s, i));
            }
            if kind.ends_chain() {
                end = Some(kind);
                break;
            }
        }
        parts.clear();
        parts.extend(kept.iter().map(|&(s, i)| group[s].part_at(i)));
        let has_bits = parts.iter().any(|part| !part.is_empty());
        let kind = match end {
            None => has_bits.then_some(RecordKind::Set),
            Some(_) if at_oldest && has_bits => Some(RecordKind::Set),
            Some(RecordKind::Deleted) if at_oldest => None,
            Some(RecordKind::Deleted) if kept.is_empty() => Some(RecordKind::Deleted),
            Some(_) => Some(RecordKind::Base),
        };
        let Some(kind) = kind else { continue };
        writer.add_record(vid, kind, &parts)?;
        if has_bits {
            vids.push(vid);
            all_kept.extend_from_slice(&kept);
            ends.push(all_kept.len());
        }
    }
    aggregate::write(&mut writer, &vids, |range| {
        let kept = &all_kept[ends_range(&ends, range)];
        kept.iter().map(|&(s, i)| group[s].part_at(i))
    })?;
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_a_merge_factor_apart() {
        const MIB: u64 = 1 << 20;
        assert_eq!(tier_of(0), 0);
        assert_eq!(tier_of(8 * MIB - 1), 0);
        assert_eq!(tier_of(8 * MIB), 1);
        assert_eq!(tier_of(64 * MIB - 1), 1);
        assert_eq!(tier_of(64 * MIB), 2);
        assert_eq!(tier_of(1 << 40), 6);
    }
}
