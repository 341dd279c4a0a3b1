//! Batch fetch (`Slave.fetchMany`): the copies a move or a refill makes,
//! many vectors per reply, each written from the store's snapshot straight
//! into the reply. A reply stops once it holds the bytes asked for, so the
//! master can send one batch on while it fetches the next.

use bitfold_engine::VectorPart;
use bitfold_engine::fold::UnionPlan;
use bitfold_engine::store::Snapshot;

use crate::bitfold_capnp::slave;
use crate::wire;

use super::Slave;

/// What one reply holds.
struct Selection<'s> {
    /// How many of the vids asked it answers (the first ones).
    answered: u32,
    /// The vectors held among them, in the order asked, as stored parts.
    found: Vec<(u64, Vec<VectorPart<'s>>)>,
    /// Those not held, ascending.
    missing: Vec<u64>,
}

/// Picks the first of `vids` whose vectors fill `max_bytes` (cut to
/// [`wire::MAX_FETCH_BYTES`]; at least one vid is answered).
fn select<'s>(
    snapshot: &'s Snapshot,
    vids: &[u64],
    max_bytes: u64,
) -> capnp::Result<Selection<'s>> {
    let asked = u32::try_from(vids.len()).unwrap_or(u32::MAX);
    wire::at_most(asked, wire::MAX_FETCH_VIDS, "vids to fetch")?;
    let budget = max_bytes.min(wire::MAX_FETCH_BYTES);
    let mut selection = Selection {
        answered: 0,
        found: Vec::new(),
        missing: Vec::new(),
    };
    let mut bytes = 0u64;
    for &vid in vids {
        if selection.answered > 0 && bytes >= budget {
            break;
        }
        selection.answered += 1;
        if snapshot.contains(vid) {
            let cover = snapshot.cover(&[vid]);
            bytes += cover.stats.bytes;
            selection.found.push((vid, cover.parts));
        } else {
            selection.missing.push(vid);
        }
    }
    selection.missing.sort_unstable();
    Ok(selection)
}

/// `Slave.fetchMany`.
pub(crate) fn fetch_many(
    slave: &Slave,
    params: slave::FetchManyParams,
    mut results: slave::FetchManyResults,
) -> capnp::Result<()> {
    let params = params.get()?;
    slave.check_session(params.get_session())?;
    let vids = wire::vids(params.get_vids()?)?;
    let snapshot = slave.store.snapshot();
    let selection = select(&snapshot, &vids, params.get_max_bytes())?;
    let mut copies = results.get().init_copies();
    copies.set_answered(selection.answered);
    copies
        .reborrow()
        .init_missing(selection.missing.len() as u32 * 8)
        .copy_from_slice(bytemuck::cast_slice(&selection.missing));
    let mut list = copies.init_vectors(selection.found.len() as u32);
    for (i, (vid, parts)) in selection.found.iter().enumerate() {
        let mut vector = list.reborrow().get(i as u32);
        vector.set_vid(*vid);
        if let [part] = parts.as_slice() {
            // Held whole in one place: copied as it is, no union to fold.
            wire::write_part(vector.init_parts(1).get(0), part);
            continue;
        }
        let plan = UnionPlan::new(parts);
        wire::write_union(vector.init_parts(plan.parts().len() as u32), &plan, parts);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bitfold_engine::VectorBuf;
    use bitfold_engine::store::Store;

    use super::*;

    /// A store holding vids 0, 2, 4, ... 18, each one dense container (8 KiB and its key).
    fn store() -> Store {
        let store = Store::in_memory();
        let vectors: Vec<VectorBuf> = (0..10)
            .map(|_| VectorBuf::from_bits((0..5000).map(|b| b * 2).collect()))
            .collect();
        let batch: Vec<_> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u64 * 2, v.as_part()))
            .collect();
        store.import(&batch).unwrap();
        store
    }

    #[test]
    fn a_reply_stops_once_it_holds_the_bytes_asked_for() {
        let store = store();
        let snapshot = store.snapshot();
        let vids: Vec<u64> = (0..20).collect();
        // Three vectors' worth: vids 0..=4 hold 0, 2 and 4, then it stops.
        let three = select(&snapshot, &vids, 3 * 8192).unwrap();
        assert_eq!(three.answered, 5);
        let found: Vec<u64> = three.found.iter().map(|(vid, _)| *vid).collect();
        assert_eq!(found, [0, 2, 4]);
        assert_eq!(three.missing, [1, 3]);
        // Asking for nothing still answers one vid, so a copy always advances.
        assert_eq!(select(&snapshot, &vids[2..], 0).unwrap().answered, 1);
        // Enough for all: every vid is answered, each found one whole.
        let all = select(&snapshot, &vids, u64::MAX).unwrap();
        assert_eq!((all.answered, all.found.len()), (20, 10));
        let parts = &all.found[9].1;
        assert_eq!(
            UnionPlan::new(parts).run(parts)[0].as_part().cardinality(),
            5000
        );
    }

    #[test]
    fn a_request_for_too_many_vids_is_refused_naming_the_bound() {
        let store = store();
        let snapshot = store.snapshot();
        let vids: Vec<u64> = (0..u64::from(wire::MAX_FETCH_VIDS) + 1).collect();
        let Err(err) = select(&snapshot, &vids, 1) else {
            panic!("65,537 vids were accepted");
        };
        assert!(
            err.to_string()
                .contains("65537 vids to fetch in one message, more than the 65536 allowed"),
            "{err}"
        );
        assert_eq!(
            select(&snapshot, &vids[1..], u64::MAX).unwrap().answered,
            wire::MAX_FETCH_VIDS
        );
    }
}
