//! The `reply` target: the replies one bitfold process reads from another
//! (hop reports, a coordinator's failed machines, a `fetchMany` reply's
//! copies), as their readers take them.

use bitfold_proto::bitfold_capnp::{coordinate_result, fetched_copies, hop, part};
use bitfold_proto::chain::coordinator_failures;
use bitfold_proto::wire::MAX_PARTS;
use bitfold_proto::writes::read_copies;
use capnp::struct_list;

use crate::message::read_message;
use crate::update::key_disjoint;
use crate::wire::{check_vector, naive};

/// The first byte picks the reply and its setting (bits 0-1: hops, failures
/// or copies; bits 2-4: the slaves of the query, or how many vids were
/// asked, less one); the rest is the message.
pub fn reply(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(message) = read_message(rest) else {
        return;
    };
    let setting = u32::from(mode >> 2 & 7);
    match mode % 3 {
        0 => {
            if let Ok(list) = message.get_root() {
                check_hops(list);
            }
        }
        1 => {
            if let Ok(result) = message.get_root() {
                check_failures(result, setting);
            }
        }
        _ => {
            if let Ok(copies) = message.get_root() {
                let asked: Vec<u64> = (0..=u64::from(setting)).map(|i| i * 7).collect();
                check_copies(copies, &asked);
            }
        }
    }
}

/// A reply's hop reports as a slave or the master reads them
/// ([`bitfold_proto::hop::read_all`]): each hop's machine, kind (0 handle,
/// 1 gather, 2 and), term, vids, bytes read, bytes sent and micros.
fn read_hops(list: struct_list::Reader<'_, hop::Owned>) -> capnp::Result<Vec<[u64; 7]>> {
    Ok(bitfold_proto::hop::read_all(list)?
        .iter()
        .map(|h| {
            [
                u64::from(h.machine),
                h.kind as u64,
                u64::from(h.term),
                h.vids,
                h.read_bytes,
                h.sent_bytes,
                h.micros,
            ]
        })
        .collect())
}

/// A list of hops that take no words is refused; any other is read as sent
/// unless a hop's kind is not one bitfold knows.
fn check_hops(list: struct_list::Reader<'_, hop::Owned>) {
    let read = read_hops(list);
    if list.try_get(0).is_some_and(takes_no_words) {
        assert!(
            read.is_err(),
            "a list of hops that take no words is refused"
        );
        return;
    }
    let mut want = Vec::new();
    for h in list.iter() {
        let Ok(kind) = h.get_kind() else {
            assert!(read.is_err(), "a hop of an unknown kind is refused");
            return;
        };
        want.push([
            u64::from(h.get_machine()),
            kind as u64,
            u64::from(h.get_term()),
            h.get_vids(),
            h.get_read_bytes(),
            h.get_sent_bytes(),
            h.get_micros(),
        ]);
    }
    assert!(read.ok() == Some(want), "the hops as sent");
}

/// Whether a hop takes no words: no data, no pointers. (Its own sections
/// only: a total size walks all its pointers reach, which an input can
/// make a DAG of, seconds for a kilobyte.)
fn takes_no_words(hop: hop::Reader<'_>) -> bool {
    capnp::raw::get_struct_data_section(hop).is_empty()
        && capnp::raw::get_struct_pointer_section(hop).is_empty()
}

/// The machines a coordinator's result names failed, as the master reads
/// it ([`coordinator_failures`]) for a query whose machine table holds
/// `slaves`: each one's name, address and reason (none for an answer).
fn read_failures(
    result: coordinate_result::Reader<'_>,
    slaves: u32,
) -> capnp::Result<Vec<[String; 3]>> {
    Ok(coordinator_failures(result, slaves)?
        .into_iter()
        .map(|f| [f.name, f.addr, f.reason])
        .collect())
}

/// More failed machines than the query's `slaves` are refused; any other
/// list is read as sent unless a text is not UTF-8; an answer names none.
fn check_failures(result: coordinate_result::Reader<'_>, slaves: u32) {
    let read = read_failures(result, slaves);
    let list = match result.which() {
        Ok(coordinate_result::FailedMachines(Ok(list))) => list,
        Ok(coordinate_result::Vector(_) | coordinate_result::Count(_)) => {
            assert!(read.ok() == Some(Vec::new()), "an answer names no failure");
            return;
        }
        _ => {
            assert!(read.is_err(), "a result that does not read is refused");
            return;
        }
    };
    if list.len() > slaves {
        assert!(read.is_err(), "more failures than slaves are refused");
        return;
    }
    let mut want = Vec::new();
    for f in list.iter() {
        let text = |t: capnp::Result<capnp::text::Reader<'_>>| t.ok()?.to_string().ok();
        match (text(f.get_name()), text(f.get_addr()), text(f.get_reason())) {
            (Some(name), Some(addr), Some(reason)) => want.push([name, addr, reason]),
            _ => {
                assert!(
                    read.is_err(),
                    "a failure whose text does not read is refused"
                );
                return;
            }
        }
    }
    assert!(read.ok() == Some(want), "the failures as sent");
}

/// A vid a `fetchMany` reply answered, with its set bits ascending, or
/// `None` where the source does not hold it.
type Copied = (u64, Option<Vec<u32>>);

/// A `fetchMany` reply as the slave that pulls the vids `asked` reads it
/// ([`read_copies`]): how many vids it answered, and each vid answered with
/// its set bits ascending, or `None` where the source does not hold it (the
/// vectors sent in their order, then the vids missing).
fn read_copied(
    copies: fetched_copies::Reader<'_>,
    asked: &[u64],
) -> capnp::Result<(u32, Vec<Copied>)> {
    let read = read_copies(copies, asked)?;
    let vectors = read
        .vectors
        .iter()
        .map(|(vid, vector)| (*vid, vector.as_ref().map(|v| v.as_part().bits().collect())))
        .collect();
    Ok((read.answered, vectors))
}

/// A reply is taken only if it answers the first `answered` vids asked, each
/// once, as a vector or as missing, and each vector's parts read as an
/// import's would (no hole or full keys) with keys ascending across its parts; the
/// vectors then hold the bits of a naive decoding. A refused reply breaks
/// one of those rules.
fn check_copies(copies: fetched_copies::Reader<'_>, asked: &[u64]) {
    let read = read_copied(copies, asked);
    let answered = copies.get_answered() as usize;
    let (Ok(found), Ok(missing)) = (copies.get_vectors(), copies.get_missing()) else {
        assert!(read.is_err(), "a reply whose fields do not read is refused");
        return;
    };
    // Counted before the vids are collected and sorted: a few words can
    // claim thousands of missing vids, which would slow every input.
    if answered == 0
        || answered > asked.len()
        || missing.len() % 8 != 0
        || found.len() as usize + missing.len() / 8 != answered
    {
        assert!(
            read.is_err(),
            "a reply of no vid, too many, or a broken vid list is refused"
        );
        return;
    }
    let missing: Vec<u64> = missing
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    let mut sent: Vec<u64> = found.iter().map(|v| v.get_vid()).collect();
    sent.extend(&missing);
    let mut expected = asked[..answered].to_vec();
    sent.sort_unstable();
    expected.sort_unstable();
    if sent != expected {
        assert!(
            read.is_err(),
            "a reply that is not the vids asked is refused"
        );
        return;
    }
    let mut want = Vec::new();
    let mut readable = true;
    for vector in found.iter() {
        let Ok(parts) = vector.get_parts() else {
            readable = false;
            break;
        };
        // Partial-result keys first: a full key costs the naive decoding
        // 65,536 bits, and a vector that has one is refused anyway.
        if parts.len() > MAX_PARTS
            || has_partial_keys(parts)
            || !check_vector(parts)
            || !key_disjoint(parts)
        {
            readable = false;
            break;
        }
        let mut bits: Vec<u32> = parts.iter().flat_map(naive).collect();
        bits.sort_unstable();
        want.push((vector.get_vid(), Some(bits)));
    }
    want.extend(missing.iter().map(|&vid| (vid, None)));
    match read {
        Ok((got_answered, got)) => {
            assert!(
                readable,
                "a reply with a vector that does not read is refused"
            );
            assert!(
                got_answered as usize == answered && got == want,
                "the copies as sent"
            );
        }
        Err(_) => assert!(
            !readable,
            "a reply of the vids asked, each readable, is taken"
        ),
    }
}

/// Whether any of `parts` holds hole keys or full keys, which a partial
/// result may send and a stored vector never has.
fn has_partial_keys(parts: struct_list::Reader<'_, part::Owned>) -> bool {
    parts.iter().any(|part| {
        part.get_hole_keys().is_ok_and(|k| !k.is_empty())
            || part.get_full_keys().is_ok_and(|k| !k.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_proto::bitfold_capnp::HopKind;
    use capnp::message::{Builder, HeapAllocator};

    /// An input: the mode byte, then the message.
    fn input(mode: u8, message: &Builder<HeapAllocator>) -> Vec<u8> {
        let mut input = vec![mode];
        input.extend(capnp::serialize::write_message_to_words(message));
        input
    }

    /// Two hops, as a chain of two machines reports them.
    fn two_hops() -> Vec<u8> {
        let mut message = Builder::new_default();
        let mut list = message.initn_root::<struct_list::Builder<'_, hop::Owned>>(2);
        for (i, kind) in [HopKind::Handle, HopKind::And].into_iter().enumerate() {
            let mut h = list.reborrow().get(i as u32);
            h.set_machine(i as u32 + 1);
            h.set_kind(kind);
            h.set_vids(64);
            h.set_read_bytes(8_192);
            h.set_sent_bytes(1_024);
            h.set_micros(120);
        }
        input(0, &message)
    }

    /// A coordinator naming two of a query's four slaves failed.
    fn two_failures() -> Vec<u8> {
        let mut message = Builder::new_default();
        let result = message.init_root::<coordinate_result::Builder<'_>>();
        let mut list = result.init_failed_machines(2);
        for i in 0..2 {
            let mut f = list.reborrow().get(i);
            f.set_name(format!("s{i}").as_str());
            f.set_addr(format!("127.0.0.1:710{i}").as_str());
            f.set_reason("connection refused");
        }
        input(4 << 2, &message)
    }

    /// A reply to a pull of vids 0, 7, 14 and 21 answering the first three:
    /// vectors for 0 (bits 3 and 70,000, two parts) and 14 (a dense
    /// container; a full one would make every input made of it cost 65,536
    /// bits to check), 7 missing.
    fn three_copies() -> Vec<u8> {
        let mut message = Builder::new_default();
        let mut copies = message.init_root::<fetched_copies::Builder<'_>>();
        copies.set_answered(3);
        copies.set_missing(&7u64.to_le_bytes());
        let mut vectors = copies.init_vectors(2);
        let mut first = vectors.reborrow().get(0);
        first.set_vid(0);
        let mut parts = first.init_parts(2);
        let mut low = parts.reborrow().get(0);
        low.set_sparse_keys(&0u16.to_le_bytes());
        low.set_sparse_ends(&1u32.to_le_bytes());
        low.set_sparse_values(&3u16.to_le_bytes());
        let mut high = parts.get(1);
        high.set_sparse_keys(&1u16.to_le_bytes());
        high.set_sparse_ends(&1u32.to_le_bytes());
        high.set_sparse_values(&4_464u16.to_le_bytes());
        let mut second = vectors.get(1);
        second.set_vid(14);
        let mut dense = second.init_parts(1).get(0);
        dense.set_dense_keys(&2u16.to_le_bytes());
        let mut words = vec![0u8; 8_192];
        words[0] = 0b101;
        dense.set_dense_words(&words);
        input(14, &message)
    }

    #[test]
    fn each_reply_reads_as_sent() {
        let hops = two_hops();
        let message = read_message(&hops[1..]).unwrap();
        let read = read_hops(message.get_root().unwrap()).unwrap();
        assert_eq!(read[0], [1, 0, 0, 64, 8_192, 1_024, 120]);
        assert_eq!(read[1][..2], [2, 2]);
        let failures = two_failures();
        let message = read_message(&failures[1..]).unwrap();
        let read = read_failures(message.get_root().unwrap(), 4).unwrap();
        assert_eq!(read[1], ["s1", "127.0.0.1:7101", "connection refused"]);
        assert!(read_failures(message.get_root().unwrap(), 1).is_err());
        let copies = three_copies();
        let message = read_message(&copies[1..]).unwrap();
        let (answered, read) = read_copied(message.get_root().unwrap(), &[0, 7, 14, 21]).unwrap();
        assert_eq!(answered, 3);
        let fourteen = vec![2 << 16, 2 << 16 | 2];
        assert_eq!(
            read,
            [(0, Some(vec![3, 70_000])), (14, Some(fourteen)), (7, None)]
        );
        for seed in [hops, failures, copies] {
            reply(&seed);
        }
    }

    #[test]
    fn the_committed_seeds_are_these_replies() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/reply");
        for (name, seed) in [
            ("two-hops", two_hops()),
            ("two-failures", two_failures()),
            ("three-copies", three_copies()),
        ] {
            let path = format!("{dir}/{name}");
            if std::env::var_os("BITFOLD_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(&path, &seed).unwrap();
            }
            assert!(
                std::fs::read(&path).unwrap() == seed,
                "{path} is not the input this test builds: write it again with \
                 BITFOLD_WRITE_SEEDS=1 cargo test -p bitfold-fuzz-targets"
            );
        }
    }
}
