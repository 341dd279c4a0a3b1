//! What a slave makes of a master's write: an import's or an update's
//! changes, read and validated as [`bitfold_proto::writes`] reads them,
//! handed to the store fenced by their stamp (`Store::import_at`,
//! `update_at`, `stage`), and the outcome as the master reads it.

use bitfold_engine::store::{Fenced, ImportStats, Staged, Stamp, Store, StoreError, Update};
use bitfold_proto::writes::{ChangeView, change_views, import_views, read_changes, read_import};

use crate::bitfold_capnp::change_result;

/// Why a write was not done.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The request did not read or validate: the call fails with it.
    #[error(transparent)]
    Malformed(#[from] capnp::Error),
    /// The store failed it: the outcome says so.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Validates the vectors of an import message and stores them durably as
/// write `stamp` of a master of `epoch` (fenced: [`Store::import_at`]).
pub(crate) fn import_batch(
    store: &Store,
    epoch: u64,
    stamp: Stamp,
    message: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> Result<Fenced<ImportStats>, WriteError> {
    let parts = read_import(message.get_root_as_reader()?)?;
    Ok(store.import_at(epoch, stamp, &import_views(&parts)?)?)
}

/// Validates the vectors of an import message and writes them as a staged
/// batch ([`Store::stage`]).
pub(super) fn stage_batch(
    store: &Store,
    message: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> Result<Staged, WriteError> {
    let parts = read_import(message.get_root_as_reader()?)?;
    Ok(store.stage(&import_views(&parts)?)?)
}

/// Why a write was refused by the fence, naming the newer epoch.
pub(super) fn fenced(newer: u64) -> String {
    format!(
        "refused: a master of epoch {newer} has written here since (this write comes from an \
         older master, which must not write any more)"
    )
}

/// Logs (at debug level) that write `stamp` was not applied again: the
/// store had applied `at` already.
pub(super) fn log_applied_already(stamp: Stamp, at: Stamp) {
    tracing::debug!(
        "write {} piece {}: applied already (the store is at write {} piece {})",
        stamp.write,
        stamp.piece,
        at.write,
        at.piece
    );
}

/// Writes the outcome of the fenced write `stamp` of vectors (`what` the
/// slave did) into `out`: the vids changed, none for a write applied
/// already, or why not.
pub(crate) fn write_changed(
    mut out: change_result::Builder<'_>,
    stamp: Stamp,
    applied: Result<Fenced<Vec<u64>>, StoreError>,
    what: &str,
) {
    match applied {
        Ok(Fenced::Applied(changed)) => {
            tracing::debug!(
                "write {} piece {}: changed {} vectors",
                stamp.write,
                stamp.piece,
                changed.len()
            );
            let bytes = out.init_changed(changed.len() as u32 * 8);
            bytes.copy_from_slice(bytemuck::cast_slice(&changed));
        }
        Ok(Fenced::AlreadyApplied(at)) => {
            log_applied_already(stamp, at);
            out.init_changed(0);
        }
        Ok(Fenced::OlderEpoch(newer)) => out.set_refused(fenced(newer)),
        Err(err) => out.set_error(format!("the slave could not {what}: {err}")),
    }
}

/// Validates the changes of an update message and applies them, in order,
/// as one durable update, write `stamp` of a master of `epoch` (fenced:
/// [`Store::update_at`]); returns the vids that changed.
pub(super) fn update_batch(
    store: &Store,
    epoch: u64,
    stamp: Stamp,
    message: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> Result<Fenced<Vec<u64>>, WriteError> {
    let read = read_changes(message.get_root_as_reader()?)?;
    let changes = change_views(&read)?;
    let batch: Vec<Update<'_>> = changes
        .iter()
        .flat_map(|change| -> Vec<Update<'_>> {
            match change {
                ChangeView::Clear(vid, parts) => {
                    parts.iter().map(|&p| Update::Clear(*vid, p)).collect()
                }
                ChangeView::Delete(vid) => vec![Update::Delete(*vid)],
                ChangeView::Replace(vid, vector) => vec![Update::Replace(*vid, vector.as_part())],
            }
        })
        .collect();
    Ok(match store.update_at(epoch, stamp, &batch)? {
        Fenced::Applied(stats) => Fenced::Applied(stats.changed),
        Fenced::AlreadyApplied(at) => Fenced::AlreadyApplied(at),
        Fenced::OlderEpoch(newer) => Fenced::OlderEpoch(newer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bitfold_capnp::vid_vector;
    use crate::wire;

    /// An import message of `count` vectors, vid `i` holding bit `i`.
    fn vectors(count: u32) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        let mut message = capnp::message::Builder::new_default();
        let mut list = message.initn_root::<capnp::struct_list::Builder<vid_vector::Owned>>(count);
        for i in 0..count {
            let mut vector = list.reborrow().get(i);
            vector.set_vid(u64::from(i));
            let bit = bitfold_engine::VectorBuf::from_bits(vec![i]);
            wire::write_part(vector.init_parts(1).get(0), &bit.as_part());
        }
        message
    }

    #[test]
    fn an_import_over_its_bounds_is_refused_whole_and_the_next_is_stored() {
        let store = Store::in_memory();
        let stamp = |write| Stamp { write, piece: 0 };
        let err =
            import_batch(&store, 1, stamp(1), &vectors(wire::MAX_IMPORT_VECTORS + 1)).unwrap_err();
        assert!(
            err.to_string()
                .contains("262145 vectors to import in one message"),
            "{err}"
        );
        assert_eq!(
            store.snapshot().vector_count(),
            0,
            "nothing of it is stored"
        );
        import_batch(&store, 1, stamp(2), &vectors(3)).unwrap();
        assert_eq!(store.snapshot().vids().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(store.identity().applied, stamp(2));
    }
}
