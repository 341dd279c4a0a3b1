use bitfold_proto::bitfold_capnp::{change, vid_vector};
use bitfold_proto::wire::{MAX_IMPORT_PARTS, MAX_PARTS, MAX_UPDATE_CHANGES};
use bitfold_proto::writes::{ChangeView, change_views, read_changes};
use capnp::struct_list;

use crate::message::read_message;
use crate::wire::{build, check_vector, naive, u16s};

/// The slave's decoding of an `update` request (master to slave). The
/// first byte picks how `data` becomes a list of changes: even, vectors
/// built from the bytes as for `wire` (with full keys if 2 modulo 4, hole
/// keys if 4 or 6 modulo 8), each made a clear, a delete or a replace by
/// its vid modulo 3; odd, the bytes read as a message as they come off the
/// socket. The changes are refused, or read as the store is handed them:
/// the bits a naive decoding of each part's fields gives.
pub fn update(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 {
        changes_of(&build(rest, mode % 4 == 2, mode % 8 >= 4))
    } else {
        rest.to_vec()
    };
    let Ok(message) = read_message(&bytes) else {
        return;
    };
    if let Ok(changes) = message.get_root::<struct_list::Reader<change::Owned>>() {
        check_update(changes);
    }
}

/// The vectors of a `wire` message as changes: vid modulo 3 picks a clear
/// of its parts, a delete, or a replace by its parts.
fn changes_of(vectors: &[u8]) -> Vec<u8> {
    let read = read_message(vectors).expect("a built message reads");
    let vectors: struct_list::Reader<'_, vid_vector::Owned> = read
        .get_root()
        .expect("a built message is a list of vectors");
    let mut message = capnp::message::Builder::new_default();
    let mut list = message.initn_root::<struct_list::Builder<'_, change::Owned>>(vectors.len());
    for (i, vector) in vectors.iter().enumerate() {
        let mut change = list.reborrow().get(i as u32);
        change.set_vid(vector.get_vid());
        let parts = vector.get_parts().expect("a built vector has parts");
        match vector.get_vid() % 3 {
            0 => change.set_clear(parts).expect("a built part copies"),
            1 => change.set_delete(()),
            _ => change.set_replace(parts).expect("a built part copies"),
        }
    }
    capnp::serialize::write_message_to_words(&message)
}

/// What one change of an update does, as a slave hands it to its store.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    /// Clear these bits of vector `vid`: one per part, in order.
    Clear(u64, Vec<u32>),
    /// Remove vector `vid`.
    Delete(u64),
    /// Make vector `vid` exactly these bits.
    Replace(u64, Vec<u32>),
}

/// `Slave.update`'s reading of `changes` ([`read_changes`],
/// [`change_views`]), without a store: the request's error if it is
/// malformed (over a bound, or a part that does not read, or a replace
/// whose parts overlap), else what it hands its store, in order; each bit
/// list ascending.
fn read_update(changes: struct_list::Reader<'_, change::Owned>) -> capnp::Result<Vec<Change>> {
    let read = read_changes(changes)?;
    let mut handed = Vec::new();
    for view in &change_views(&read)? {
        match view {
            ChangeView::Clear(vid, parts) => handed.extend(
                parts
                    .iter()
                    .map(|part| Change::Clear(*vid, part.bits().collect())),
            ),
            ChangeView::Delete(vid) => handed.push(Change::Delete(*vid)),
            ChangeView::Replace(vid, vector) => {
                handed.push(Change::Replace(*vid, vector.as_part().bits().collect()));
            }
        }
    }
    Ok(handed)
}

/// Changes over a bound, whose fields do not read, with a part that does
/// not read as a partial result's would (or holds full or hole keys), or a
/// replace whose parts overlap, are refused; any other is read as the store
/// is handed it: a clear per part, a delete, a replace as the union of its
/// parts, each with the bits of a naive decoding.
fn check_update(changes: struct_list::Reader<'_, change::Owned>) {
    let read = read_update(changes);
    if changes.len() > MAX_UPDATE_CHANGES {
        assert!(read.is_err(), "an update over the changes bound is refused");
        return;
    }
    let mut kinds = Vec::new();
    for change in changes.iter() {
        match change.which() {
            Ok(change::Clear(Ok(parts))) => kinds.push((change.get_vid(), Some(parts), false)),
            Ok(change::Replace(Ok(parts))) => kinds.push((change.get_vid(), Some(parts), true)),
            Ok(change::Delete(())) => kinds.push((change.get_vid(), None, false)),
            _ => {
                assert!(
                    read.is_err(),
                    "an update whose fields do not read is refused"
                );
                return;
            }
        }
    }
    let lists: Vec<_> = kinds.iter().filter_map(|(_, parts, _)| *parts).collect();
    let parts: u64 = lists.iter().map(|list| u64::from(list.len())).sum();
    let longest = lists.iter().map(|list| list.len()).max().unwrap_or(0);
    if parts > u64::from(MAX_IMPORT_PARTS) || longest > MAX_PARTS {
        assert!(read.is_err(), "an update over the parts bounds is refused");
        return;
    }
    let Ok(handed) = read else {
        let partial_only = lists.iter().flat_map(|list| list.iter()).any(|part| {
            part.get_full_keys().is_ok_and(|keys| !keys.is_empty())
                || part.get_hole_keys().is_ok_and(|keys| !keys.is_empty())
        });
        let unread = lists.iter().filter(|&&list| !check_vector(list)).count();
        let overlapping = kinds
            .iter()
            .any(|(_, parts, replace)| *replace && parts.is_some_and(|list| !key_disjoint(list)));
        assert!(
            partial_only || unread > 0 || overlapping,
            "an update whose parts all read, without full or hole keys or overlapping \
             replaces, is accepted"
        );
        return;
    };
    let mut want = Vec::new();
    for (vid, parts, replace) in kinds {
        match (parts, replace) {
            (None, _) => want.push(Change::Delete(vid)),
            (Some(list), false) => want.extend(list.iter().map(|part| {
                let mut bits = naive(part);
                bits.sort_unstable();
                Change::Clear(vid, bits)
            })),
            (Some(list), true) => {
                assert!(key_disjoint(list), "a replace's parts ascend, key-disjoint");
                let mut bits: Vec<u32> = list.iter().flat_map(naive).collect();
                bits.sort_unstable();
                want.push(Change::Replace(vid, bits));
            }
        }
    }
    assert!(handed == want, "the changes an update hands the store");
}

/// Whether the containers of `list`'s parts, in order, have strictly
/// ascending keys (what a replace's or a copy's parts put together must
/// have), empty containers included: each part's dense, sparse and full
/// keys, from its fields.
pub(crate) fn key_disjoint(
    list: struct_list::Reader<'_, bitfold_proto::bitfold_capnp::part::Owned>,
) -> bool {
    let mut keys = Vec::new();
    for part in list.iter() {
        let mut of_part = u16s(part.get_dense_keys().unwrap_or_default());
        of_part.extend(u16s(part.get_sparse_keys().unwrap_or_default()));
        of_part.extend(u16s(part.get_full_keys().unwrap_or_default()));
        of_part.sort_unstable();
        keys.extend(of_part);
    }
    keys.windows(2).all(|w| w[0] < w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An update of a clear (bits 3 and 70,000), a delete of vid 4 and a
    /// replace of vid 5 by two parts (bits 1 and 65,536), as a raw input.
    fn each_kind() -> Vec<u8> {
        let mut message = capnp::message::Builder::new_default();
        let mut list = message.initn_root::<struct_list::Builder<'_, change::Owned>>(3);
        let sparse =
            |mut part: bitfold_proto::bitfold_capnp::part::Builder<'_>, key: u16, lows: &[u16]| {
                part.set_sparse_keys(&key.to_le_bytes());
                part.set_sparse_ends(&(lows.len() as u32).to_le_bytes());
                let values: Vec<u8> = lows.iter().flat_map(|v| v.to_le_bytes()).collect();
                part.set_sparse_values(&values);
            };
        let mut clear = list.reborrow().get(0);
        clear.set_vid(3);
        let mut parts = clear.init_clear(2);
        sparse(parts.reborrow().get(0), 0, &[3]);
        sparse(parts.get(1), 1, &[4_464]);
        list.reborrow().get(1).set_vid(4);
        list.reborrow().get(1).set_delete(());
        let mut replace = list.get(2);
        replace.set_vid(5);
        let mut parts = replace.init_replace(2);
        sparse(parts.reborrow().get(0), 0, &[1]);
        sparse(parts.get(1), 1, &[0]);
        let mut input = vec![1];
        input.extend(capnp::serialize::write_message_to_words(&message));
        input
    }

    #[test]
    fn each_kind_of_change_is_handed_to_the_store_as_sent() {
        let input = each_kind();
        let message = read_message(&input[1..]).unwrap();
        let handed = read_update(message.get_root().unwrap()).unwrap();
        assert_eq!(
            handed,
            [
                Change::Clear(3, vec![3]),
                Change::Clear(3, vec![70_000]),
                Change::Delete(4),
                Change::Replace(5, vec![1, 65_536]),
            ]
        );
        update(&input);
    }

    #[test]
    fn an_update_of_millions_of_empty_changes_is_refused_at_once() {
        let count: u64 = (1 << 27) - 16;
        let mut input = vec![1];
        for word in [2 << 32, 1 | 7 << 32, count << 2] {
            input.extend(u64::to_le_bytes(word));
        }
        let message = read_message(&input[1..]).unwrap();
        let refused = read_update(message.get_root().unwrap()).unwrap_err();
        assert!(
            refused.to_string().contains("changes in one message"),
            "{refused}"
        );
        update(&input);
    }

    #[test]
    fn the_committed_seed_is_each_kind() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/seeds/update/each-kind"
        );
        if std::env::var_os("BITFOLD_WRITE_SEEDS").is_some() {
            std::fs::write(path, each_kind()).unwrap();
        }
        assert!(
            std::fs::read(path).unwrap() == each_kind(),
            "{path} is not the input this test builds: write it again with \
             BITFOLD_WRITE_SEEDS=1 cargo test -p bitfold-fuzz-targets"
        );
    }
}
