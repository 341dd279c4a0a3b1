//! Copies straight from slave to slave (`Slave.pull`): a move or a refill
//! has the slave that gains vectors ask their source for them with one
//! `fetchMany` and store them, so the copies cross the network once and
//! never pass through the master.

use std::rc::Rc;
use std::time::Duration;

use bitfold_engine::store::{Fenced, Update, spawn_background};
use bitfold_proto::writes::read_copies;

use crate::bitfold_capnp::slave;
use crate::wire;

use super::Slave;

/// The longest this slave waits for a source's `fetchMany` reply.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

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
