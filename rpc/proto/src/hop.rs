//! Hop reports: what each machine did for one query (the vids it read,
//! the bytes it read and sent on, its own time), returned with the answer
//! when the master asks (`report`, docs/slave-protocol.md S6), for its
//! slow-query log (docs/protocol.md §10). Without `report` nothing is
//! measured or sent.

use std::time::Instant;

use crate::bitfold_capnp::{HopKind, hop};
use crate::budget::micros;

/// A list of hops on the wire.
pub type HopList<'a> = capnp::struct_list::Reader<'a, hop::Owned>;

/// One machine's work for one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    /// The machine, as an index into the query's machine table.
    pub machine: u32,
    /// What it did.
    pub kind: HopKind,
    /// For a `handle` hop, the index of its term's chain; else 0.
    pub term: u32,
    /// Vids it was asked to read.
    pub vids: u64,
    /// Bytes of vectors it read.
    pub read_bytes: u64,
    /// Bytes of the vector (or count) it sent on.
    pub sent_bytes: u64,
    /// Its own time, in microseconds.
    pub micros: u64,
}

impl Hop {
    /// A hop of `kind` by `machine` that began at `began` and ends now.
    pub fn ending_now(
        machine: u32,
        kind: HopKind,
        began: Instant,
        vids: u64,
        read_bytes: u64,
        sent_bytes: u64,
    ) -> Hop {
        Hop {
            machine,
            kind,
            term: 0,
            vids,
            read_bytes,
            sent_bytes,
            micros: micros(began.elapsed()),
        }
    }

    /// Reads one from the wire.
    pub fn read(reader: hop::Reader<'_>) -> capnp::Result<Hop> {
        Ok(Hop {
            machine: reader.get_machine(),
            kind: reader.get_kind()?,
            term: reader.get_term(),
            vids: reader.get_vids(),
            read_bytes: reader.get_read_bytes(),
            sent_bytes: reader.get_sent_bytes(),
            micros: reader.get_micros(),
        })
    }

    /// Writes it to the wire.
    pub fn write(&self, mut builder: hop::Builder<'_>) {
        builder.set_machine(self.machine);
        builder.set_kind(self.kind);
        builder.set_term(self.term);
        builder.set_vids(self.vids);
        builder.set_read_bytes(self.read_bytes);
        builder.set_sent_bytes(self.sent_bytes);
        builder.set_micros(self.micros);
    }
}

/// Reads every hop of `list`, refusing a list of hops that take no words.
pub fn read_all(list: HopList<'_>) -> capnp::Result<Vec<Hop>> {
    crate::wire::check_sized(list, "hops")?;
    list.iter().map(Hop::read).collect()
}

/// Writes `hops` into `list` (of their length).
pub fn write_all(mut list: capnp::struct_list::Builder<'_, hop::Owned>, hops: &[Hop]) {
    for (i, hop) in hops.iter().enumerate() {
        hop.write(list.reborrow().get(i as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_read_back_as_written_and_a_list_of_empty_hops_is_refused() {
        let hops = [
            Hop::ending_now(2, HopKind::Handle, Instant::now(), 64, 8192, 1024),
            Hop::ending_now(0, HopKind::And, Instant::now(), 0, 2048, 8),
        ];
        let mut message = capnp::message::Builder::new_default();
        write_all(
            message.initn_root::<capnp::struct_list::Builder<'_, hop::Owned>>(2),
            &hops,
        );
        assert_eq!(
            read_all(message.get_root_as_reader().unwrap()).unwrap(),
            hops
        );
        // 24 bytes that would read as 2^27 - 16 hops of 48 bytes each.
        let empty = crate::wire::empty_structs((1 << 27) - 16);
        let refused = read_all(empty.get_root().unwrap()).unwrap_err().to_string();
        assert!(refused.contains("hops that take no words"), "{refused}");
    }
}
