//! Import batching: a batch of vectors cut into import messages of bounded size.

use bitfold_engine::VectorPart;

use crate::bitfold_capnp::vid_vector;
use crate::wire;

/// The most vector bytes one import message carries; a larger batch is
/// sent as several messages (a single vector may exceed it, in its own).
const IMPORT_MESSAGE_BYTES: usize = 64 << 20;

/// Splits an import batch into messages of about [`IMPORT_MESSAGE_BYTES`],
/// each of at most `wire::MAX_IMPORT_VECTORS` vectors.
pub(super) fn import_messages(
    batch: &[(u64, VectorPart<'_>)],
) -> Vec<capnp::message::Builder<capnp::message::HeapAllocator>> {
    let size = |part: &VectorPart<'_>| {
        part.dense_words().len() * 8 + part.sparse_values().len() * 2 + part.container_count() * 6
    };
    let mut groups: Vec<Vec<(u64, Vec<VectorPart<'_>>)>> = vec![Vec::new()];
    let mut bytes = 0;
    for (vid, part) in batch {
        let part_bytes = size(part);
        let full = groups.last().map_or(0, Vec::len) == wire::MAX_IMPORT_VECTORS as usize;
        if (bytes + part_bytes > IMPORT_MESSAGE_BYTES && bytes > 0) || full {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += part_bytes;
        let group = groups.last_mut().expect("there is always a group");
        group.push((*vid, wire::pieces(part)));
    }
    groups
        .into_iter()
        .filter(|group| !group.is_empty())
        .map(|group| {
            let mut message = capnp::message::Builder::new_default();
            let mut list: capnp::struct_list::Builder<'_, vid_vector::Owned> =
                message.initn_root(group.len() as u32);
            for (i, (vid, pieces)) in group.iter().enumerate() {
                let mut entry = list.reborrow().get(i as u32);
                entry.set_vid(*vid);
                wire::write_parts(entry.init_parts(pieces.len() as u32), pieces);
            }
            message
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_imports_are_cut_into_messages() {
        let dense = bitfold_engine::VectorBuf::from_sorted_bits(&(0..1 << 22).collect::<Vec<_>>());
        let batch: Vec<_> = (0..40).map(|vid| (vid, dense.as_part())).collect();
        let messages = import_messages(&batch);
        // 40 vectors of 512 KiB in messages of at most 64 MiB.
        assert_eq!(messages.len(), 1);
        let batch: Vec<_> = (0..300).map(|vid| (vid, dense.as_part())).collect();
        let messages = import_messages(&batch);
        assert_eq!(messages.len(), 3);
        let vids: usize = messages
            .iter()
            .map(|m| {
                m.get_root_as_reader::<capnp::struct_list::Reader<'_, vid_vector::Owned>>()
                    .unwrap()
                    .len() as usize
            })
            .sum();
        assert_eq!(vids, 300);
    }
}
