//! Copies straight from slave to slave (`Slave.pull`): a move or a refill
//! has the slave that gains vectors ask their source for them with one
//! `fetchMany` and store them, so the copies cross the network once and
//! never pass through the master.

use std::rc::Rc;
use std::time::Duration;

use bitfold_engine::store::{Fenced, Update, spawn_background};
use bitfold_engine::{VectorBuf, VectorPart};

use crate::bitfold_capnp::{fetched_copies, slave};
use crate::wire;

use super::{Slave, concatenate};

/// The longest this slave waits for a source's `fetchMany` reply.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// What a source answered, copied out of its reply so that another thread
/// can store it: each vid fetched, with its vector, or `None` where the
/// source does not hold it (deleted here).
pub(crate) struct Copies {
    /// How many of the vids asked the source answered (the first ones).
    pub(crate) answered: u32,
    /// Each vid answered, with its vector or `None`: the vectors sent in
    /// their order, then the vids missing.
    pub(crate) vectors: Vec<(u64, Option<VectorBuf>)>,
    /// Bytes of the vectors' containers as they travelled (words, keys,
    /// ends and values of every part).
    pub(crate) bytes: u64,
}

/// `Slave.pull`.
pub(crate) async fn pull(
    slave: Rc<Slave>,
    params: slave::PullParams,
    mut results: slave::PullResults,
) -> Result<(), capnp::Error> {
    let (from, from_session, asked, max_bytes, (epoch, stamp)) = {
        let params = params.get()?;
        let fence = slave.check_stamp(params.get_stamp()?)?;
        let vids = wire::vids(params.get_vids()?)?;
        let count = u32::try_from(vids.len()).unwrap_or(u32::MAX);
        wire::at_most(count, wire::MAX_FETCH_VIDS, "vids to pull")?;
        (
            params.get_from()?.to_str()?.to_owned(),
            params.get_from_session(),
            vids.into_owned(),
            params.get_max_bytes(),
            fence,
        )
    };
    drop(params);
    let fetched = slave
        .pool
        .call(&from, FETCH_TIMEOUT, |client| {
            let mut request = client.fetch_many_request();
            request.get().set_vids(bytemuck::cast_slice(&asked));
            request.get().set_max_bytes(max_bytes);
            request.get().set_session(from_session);
            request.send().promise
        })
        .await;
    let copied = fetched.and_then(|response| {
        response
            .get()
            .and_then(|reply| read_copies(reply.get_copies()?, &asked))
            .map_err(|e| format!("it answered a malformed message: {e}"))
    });
    let copies = match copied {
        Ok(copied) => copied,
        Err(reason) => {
            let mut reply = results.get();
            reply
                .reborrow()
                .init_outcome()
                .set_source_failed(format!("{from}: {reason}").as_str());
            slave.write_state(reply.init_state());
            return Ok(());
        }
    };
    let (answered, bytes) = (copies.answered, copies.bytes);
    let vectors = copies.vectors.iter().filter(|(_, v)| v.is_some()).count() as u64;
    let store = slave.store.clone();
    let stored = in_background(move || {
        let batch: Vec<Update<'_>> = copies
            .vectors
            .iter()
            .map(|(vid, vector)| match vector {
                Some(vector) => Update::Replace(*vid, vector.as_part()),
                None => Update::Delete(*vid),
            })
            .collect();
        store.update_at(epoch, stamp, &batch)
    })
    .await?;
    let mut reply = results.get();
    match stored {
        Ok(Fenced::Applied(_)) => {
            reply.set_answered(answered);
            reply.set_vectors(vectors);
            reply.set_bytes(bytes);
            reply.reborrow().init_outcome().set_done(());
        }
        Ok(Fenced::OlderEpoch(newer)) => reply
            .reborrow()
            .init_outcome()
            .set_refused(super::fenced(newer)),
        // Copies from several sources travel at once, each stamped when
        // the master sent it: one that arrives after a later one is not
        // stored, and the master sends it again with a later stamp.
        Ok(Fenced::AlreadyApplied(at)) => reply.reborrow().init_outcome().set_stale(at.write),
        Err(err) => reply
            .reborrow()
            .init_outcome()
            .set_store_failed(format!("the slave could not store the copies: {err}").as_str()),
    }
    slave.write_state(reply.init_state());
    Ok(())
}

/// Runs `work` on a background thread (lower CPU priority than queries:
/// [`spawn_background`]) and returns its result.
async fn in_background<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, capnp::Error> {
    let (done, result) = futures::channel::oneshot::channel();
    spawn_background("bitfold-pull", move || {
        // The receiver is gone only if the call was cancelled.
        let _ = done.send(work());
    })
    .map_err(|e| wire::failed(format!("cannot start a thread to store copies: {e}")))?;
    result
        .await
        .map_err(|_| wire::failed("the thread storing the copies ended without storing them"))
}

/// The copies of a `fetchMany` reply to the vids `asked`, checked as an
/// import is (bounds, parts that read as a vector) and against what was
/// asked.
pub(crate) fn read_copies(
    copies: fetched_copies::Reader<'_>,
    asked: &[u64],
) -> capnp::Result<Copies> {
    let answered = copies.get_answered();
    if answered == 0 || answered as usize > asked.len() {
        return Err(wire::failed(format!(
            "it answered {answered} of the {} vids asked",
            asked.len()
        )));
    }
    let found = copies.get_vectors()?;
    let missing = wire::vids(copies.get_missing()?)?;
    // Counted before any is read: a list of empty vectors costs its sender
    // nothing a vector, and each read one takes memory here.
    if u64::from(found.len()) + missing.len() as u64 != u64::from(answered) {
        return Err(wire::failed(format!(
            "it answered {answered} of the vids asked with {} vectors and {} missing",
            found.len(),
            missing.len()
        )));
    }
    let mut vectors = Vec::with_capacity(found.len() as usize + missing.len());
    let mut bytes = 0;
    for vector in found.iter() {
        // As an import's: no full keys, which a source never writes (its
        // copies are stored vectors) and each of which, two bytes sent,
        // would take 8 KiB here.
        let parts = wire::read_parts(vector.get_parts()?)?;
        let views = wire::stored_views(&parts)?;
        bytes += views.iter().map(VectorPart::byte_len).sum::<u64>();
        vectors.push((vector.get_vid(), Some(concatenate(&views)?)));
    }
    vectors.extend(missing.iter().map(|&vid| (vid, None)));
    // Exactly the first `answered` vids asked, each once: no copy is lost
    // and none is stored that was not asked for.
    let mut sent: Vec<u64> = vectors.iter().map(|(vid, _)| *vid).collect();
    let mut expected = asked[..answered as usize].to_vec();
    sent.sort_unstable();
    expected.sort_unstable();
    if sent != expected {
        return Err(wire::failed(format!(
            "it did not send the first {answered} vids asked, each once, as vectors or missing"
        )));
    }
    Ok(Copies {
        answered,
        vectors,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `fetchMany` reply: `answered`, the vectors `found` (vid `v` holding
    /// bit `v`), and the vids `missing`.
    fn reply(
        answered: u32,
        found: &[u64],
        missing: &[u64],
    ) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        let mut message = capnp::message::Builder::new_default();
        let mut copies = message.init_root::<fetched_copies::Builder<'_>>();
        copies.set_answered(answered);
        copies.set_missing(bytemuck::cast_slice(missing));
        let mut list = copies.init_vectors(found.len() as u32);
        for (i, &vid) in found.iter().enumerate() {
            let mut vector = list.reborrow().get(i as u32);
            vector.set_vid(vid);
            let bits = VectorBuf::from_bits(vec![vid as u32]);
            wire::write_part(vector.init_parts(1).get(0), &bits.as_part());
        }
        message
    }

    fn read(
        message: &capnp::message::Builder<capnp::message::HeapAllocator>,
        asked: &[u64],
    ) -> capnp::Result<Copies> {
        read_copies(message.get_root_as_reader()?, asked)
    }

    #[test]
    fn an_honest_reply_gives_each_vid_asked_its_vector_or_a_delete() {
        let copies = read(&reply(3, &[5, 9], &[7]), &[5, 7, 9, 11]).unwrap();
        assert_eq!(copies.answered, 3);
        let got: Vec<(u64, Option<Vec<u32>>)> = copies
            .vectors
            .iter()
            .map(|(vid, v)| (*vid, v.as_ref().map(|v| v.as_part().bits().collect())))
            .collect();
        assert_eq!(got, [(5, Some(vec![5])), (9, Some(vec![9])), (7, None)]);
        // What a move reports as copied: the two vectors' containers.
        let one_bit = VectorBuf::from_bits(vec![5]).as_part().byte_len();
        assert!(one_bit > 0);
        assert_eq!(copies.bytes, 2 * one_bit);
    }

    #[test]
    fn a_reply_that_is_not_what_was_asked_is_refused() {
        let asked = [5, 7, 9, 11];
        let refused = |message| read(&message, &asked).err().map(|e| e.to_string());
        // A vid it was not asked for, one it dropped, one sent twice, none
        // answered, more answered than asked: nothing of it is stored.
        for message in [
            reply(2, &[5, 8], &[]),
            reply(3, &[5, 9], &[]),
            reply(2, &[5, 5], &[]),
            reply(2, &[5], &[7, 7]),
            reply(0, &[], &[]),
            reply(5, &[5, 7, 9, 11], &[]),
        ] {
            let err = refused(message).expect("a wrong reply was accepted");
            assert!(err.contains("vids asked"), "{err}");
        }
    }

    #[test]
    fn a_copy_with_full_keys_is_refused() {
        // 65,536 full keys, 128 KiB sent, would be 512 MiB of words here.
        let mut message = reply(1, &[5], &[]);
        let copies = message.get_root::<fetched_copies::Builder<'_>>().unwrap();
        let keys: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut vector = copies.get_vectors().unwrap().get(0);
        vector.set_vid(5);
        vector.init_parts(1).get(0).set_full_keys(&keys);
        let err = read(&message, &[5]).err().expect("full keys were accepted");
        assert!(err.to_string().contains("full keys"), "{err}");
    }

    #[test]
    fn a_reply_of_more_vectors_than_it_answered_is_refused_before_they_are_read() {
        // 2^26 empty vectors, which would take 2.7 GB read, for one vid.
        let empty = wire::empty_structs(1 << 26);
        let mut message = reply(1, &[], &[]);
        let mut copies = message.get_root::<fetched_copies::Builder<'_>>().unwrap();
        copies.set_vectors(empty.get_root().unwrap()).unwrap();
        let err = read(&message, &[5]).err().expect("the reply was accepted");
        assert!(
            err.to_string()
                .contains("answered 1 of the vids asked with 67108864 vectors and 0 missing"),
            "{err}"
        );
    }
}
