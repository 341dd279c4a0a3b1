//! The clients of a run: one writer (imports, clears, deletes, now and
//! then a rebalance) and readers (`P:` and small `R:` queries), each
//! drawing its operations from the seed and recording them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use bitfold_client::{Answer, Client, Error, ErrorKind, Format};
use bitfold_engine::VectorBuf;

use super::history::{Action, Outcome, Recorder, Seen, write_outcome};
use super::layout::Layout;
use crate::util::Rng;

/// The vids of a run: 0..24, spread by placement over every slave.
pub const VIDS: u64 = 24;

/// Deletes touch only vids `0..DELETED`: a delete drops what the master
/// lists as lacking on a slave, so a vector left unavailable among the
/// others stays so until the end, where the final reads find it.
const DELETED: u64 = 16;

/// How long a client waits for the master: beyond a paused slave's import
/// (the master waits up to 30 s for an owner that is up).
const CALL_TIMEOUT: Duration = Duration::from_secs(40);

/// A client of the master(s) at `addr` that waits [`CALL_TIMEOUT`].
pub fn client(addr: &str) -> Client {
    let mut client = Client::connect(addr).expect("the master accepts a client");
    client.set_timeout(CALL_TIMEOUT);
    client
}

/// A mask of `n` random bits below 64.
fn random_bits(rng: &mut Rng, n: u64) -> u64 {
    (0..n).fold(0, |m, _| m | 1 << rng.below(64))
}

/// `k` distinct vids.
fn some_vids(rng: &mut Rng, k: u64) -> Vec<u64> {
    let mut vids: Vec<u64> = Vec::new();
    while (vids.len() as u64) < k {
        let v = rng.below(VIDS);
        if !vids.contains(&v) {
            vids.push(v);
        }
    }
    vids
}

/// Each `(vid, mask)` as the vector `layout` writes it.
fn vectors(masks: &[(u64, u64)], layout: Layout) -> Vec<(u64, VectorBuf)> {
    masks
        .iter()
        .map(|&(vid, m)| {
            let bits = (0..64)
                .filter(|b| m >> b & 1 == 1)
                .map(|b| layout.position(b))
                .collect();
            (vid, VectorBuf::from_bits(bits))
        })
        .collect()
}

/// Does `action` (an import or a clear of each `(vid, mask)`) through
/// `client` and records it as `who`'s.
pub fn write(
    client: &Client,
    recorder: &Recorder,
    who: &'static str,
    action: Action,
    layout: Layout,
) -> Outcome {
    let (Action::Import(masks) | Action::Clear(masks)) = &action else {
        panic!("not an import or a clear: {action:?}")
    };
    let vectors = vectors(masks, layout);
    let import = matches!(action, Action::Import(_));
    recorder.record(who, action, || {
        let parts: Vec<_> = vectors.iter().map(|(v, b)| (*v, b.as_part())).collect();
        let done = if import {
            client.import(&parts)
        } else {
            client.clear(&parts).map(|_| ())
        };
        match done {
            Ok(()) => Outcome::Done,
            Err(e) => write_outcome(&e),
        }
    })
}

/// The writer: one write at a time through `client` until `stop`.
pub fn writer(client: &Client, seed: u64, recorder: &Recorder, stop: &AtomicBool) {
    let mut rng = Rng(seed ^ 0x7772_6974_6572_0000);
    let layout = Layout::of(seed);
    while !stop.load(Ordering::Acquire) {
        let pick = rng.below(100);
        let outcome = if pick < 50 {
            let k = 1 + rng.below(3);
            let masks: Vec<(u64, u64)> = some_vids(&mut rng, k)
                .into_iter()
                .map(|v| {
                    let n = 1 + rng.below(4);
                    (v, random_bits(&mut rng, n))
                })
                .collect();
            write(client, recorder, "writer", Action::Import(masks), layout)
        } else if pick < 75 {
            let k = 1 + rng.below(2);
            let masks: Vec<(u64, u64)> = some_vids(&mut rng, k)
                .into_iter()
                .map(|v| (v, rng.next_u64() & rng.next_u64()))
                .collect();
            write(client, recorder, "writer", Action::Clear(masks), layout)
        } else if pick < 99 {
            let spans: Vec<(u64, u64)> = (0..1 + rng.below(2))
                .map(|_| {
                    let a = rng.below(DELETED);
                    (a, (a + rng.below(3)).min(DELETED - 1))
                })
                .collect();
            recorder.record("writer", Action::Delete(spans.clone()), || {
                match client.delete(&spans) {
                    Ok(_) => Outcome::Done,
                    Err(e) => write_outcome(&e),
                }
            })
        } else {
            recorder.record(
                "writer",
                Action::Rebalance,
                || match super::nemesis::rebalance(client) {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Failed(e),
                },
            )
        };
        // A master that is away: wait a little rather than pile up writes
        // of unknown outcome.
        let pause = match outcome {
            Outcome::Unknown(_) | Outcome::Refused(_) | Outcome::Failed(_) => 100,
            _ => rng.below(4),
        };
        thread::sleep(Duration::from_millis(pause));
    }
}

/// A reader: `P:` and `R:` queries in the roaring form through `client`
/// until `stop`.
pub fn reader(
    client: &Client,
    seed: u64,
    who: &'static str,
    recorder: &Recorder,
    stop: &AtomicBool,
) {
    let stream = who.bytes().fold(0u64, |h, b| h << 8 | b as u64);
    let mut rng = Rng(seed ^ stream);
    let layout = Layout::of(seed);
    while !stop.load(Ordering::Acquire) {
        let action = if rng.below(100) < 55 {
            Action::Point(rng.below(VIDS))
        } else {
            let terms = (0..1 + rng.below(3))
                .map(|_| {
                    (0..1 + rng.below(2))
                        .map(|_| {
                            let a = rng.below(VIDS);
                            (a, a + rng.below(6))
                        })
                        .collect()
                })
                .collect();
            Action::Range(terms)
        };
        read(client, recorder, who, action, layout);
        thread::sleep(Duration::from_millis(1 + rng.below(6)));
    }
}

/// Asks `action` (a `P:` or `R:`) in the roaring form and records the
/// answer, read as `layout` writes a run's bits.
pub fn read(
    client: &Client,
    recorder: &Recorder,
    who: &'static str,
    action: Action,
    layout: Layout,
) -> Outcome {
    let query = action.query();
    recorder.record(who, action, || {
        match client.query(&query, Format::Roaring) {
            Ok(Answer::Roaring(bytes)) => {
                match roaring::RoaringBitmap::deserialize_from(&bytes[..]) {
                    Ok(bitmap) => Outcome::Read(Seen::of(layout, bitmap.iter())),
                    // An answer that does not decode is a wrong one.
                    Err(e) => {
                        eprintln!("{query}: the roaring answer does not decode: {e}");
                        Outcome::Read(Seen::Beyond(Vec::new()))
                    }
                }
            }
            Ok(other) => Outcome::Failed(format!("an answer in another form: {other:?}")),
            Err(Error::Query {
                kind: ErrorKind::NotFound,
                ..
            }) if query.starts_with("P:") => Outcome::Read(Seen::Missing),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    })
}
