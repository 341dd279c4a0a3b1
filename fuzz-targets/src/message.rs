//! The fuzzer's bytes as one Cap'n Proto message, read with the limits of
//! every connection ([`bitfold_proto::reader_options`]).

use std::ops::Deref;

use capnp::Word;
use capnp::message::Reader;
use capnp::serialize::BufferSegments;

/// Reads `bytes` as one message (segment table first), in place, from one
/// aligned copy of the whole words of `bytes` (a stream reader cannot use a
/// last partial word either): a segment table that claims more words than
/// follow it is refused without allocating what it claims. (A connection's
/// stream reader, which the `framing` target drives, allocates what the
/// table claims, up to 16 MiB, before the words arrive: too slow for every
/// input.)
pub(crate) fn read_message(bytes: &[u8]) -> capnp::Result<Reader<BufferSegments<Words>>> {
    let whole = bytes.len() / 8;
    let mut words = Word::allocate_zeroed_vec(whole);
    Word::words_to_bytes_mut(&mut words).copy_from_slice(&bytes[..whole * 8]);
    let options = bitfold_proto::reader_options();
    Ok(Reader::new(
        BufferSegments::new(Words(words), options)?,
        options,
    ))
}

/// The words of a message, read as bytes: what [`read_message`] reads.
pub(crate) struct Words(Vec<Word>);

impl Deref for Words {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        Word::words_to_bytes(&self.0)
    }
}
