//! Each slave's own copies, read straight from it (its `catalog` and
//! `fetch` on the `Slave` interface), not through the master.

use std::collections::BTreeMap;
use std::time::Duration;

use bitfold_proto::bitfold_capnp::{Want, fetch_result, part, slave};

use super::history::Seen;
use super::layout::Layout;

/// Every vector (or piece, by its key) slave `addr` holds, as it holds it,
/// read as `layout` writes a run's bits.
pub fn copies(addr: &str, layout: Layout) -> Result<BTreeMap<u64, Seen>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let read = async {
            let slave = connect(addr).await?;
            // Reads name the process they are for: this one's.
            let health = slave.health_request().send().promise.await?;
            let session = health.get()?.get_state()?.get_session();
            let catalog = slave.catalog_request().send().promise.await?;
            let bytes = catalog.get()?.get_vids()?;
            let vids: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let mut held = BTreeMap::new();
            for vid in vids {
                let mut request = slave.fetch_request();
                request.get().set_vid(vid);
                request.get().set_want(Want::Vector);
                request.get().set_session(session);
                let response = request.send().promise.await?;
                let seen = match response.get()?.get_result()?.which()? {
                    fetch_result::Vector(parts) => {
                        let mut bits = Vec::new();
                        for p in parts?.iter() {
                            bits.extend(decode(p)?);
                        }
                        Seen::of(layout, bits)
                    }
                    fetch_result::NotFound(()) => Seen::Missing,
                    fetch_result::Count(_) => {
                        return Err(capnp::Error::failed(
                            "a count where the vector was asked".into(),
                        ));
                    }
                };
                // A vid listed but not found is not held.
                if seen != Seen::Missing {
                    held.insert(vid, seen);
                }
            }
            Ok::<_, capnp::Error>(held)
        };
        match tokio::time::timeout(Duration::from_secs(30), read).await {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(err)) => Err(format!("slave {addr}: {err}")),
            Err(_) => Err(format!("slave {addr}: no answer within 30 s")),
        }
    })
}

async fn connect(addr: &str) -> capnp::Result<slave::Client> {
    crate::util::connect_capnp(addr)
        .await
        .map_err(capnp::Error::failed)
}

/// The bits of one part, decoded naively from its fields; full and hole
/// keys never travel in a copy (docs/slave-protocol.md S4), so they are refused.
fn decode(p: part::Reader<'_>) -> capnp::Result<Vec<u32>> {
    let u16s = |d: &[u8]| -> Vec<u32> {
        d.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
            .collect()
    };
    let u32s = |d: &[u8]| -> Vec<usize> {
        d.chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize)
            .collect()
    };
    if !p.get_full_keys()?.is_empty() || !p.get_hole_keys()?.is_empty() {
        return Err(capnp::Error::failed("a copy with full or hole keys".into()));
    }
    let mut bits = Vec::new();
    let words = p.get_dense_words()?;
    for (i, key) in u16s(p.get_dense_keys()?).into_iter().enumerate() {
        let container = words
            .get(i * 8192..(i + 1) * 8192)
            .ok_or_else(|| capnp::Error::failed("dense words cut short".into()))?;
        for (w, chunk) in container.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            for b in 0..64 {
                if word >> b & 1 == 1 {
                    bits.push((key << 16) | (w * 64 + b) as u32);
                }
            }
        }
    }
    let values = u16s(p.get_sparse_values()?);
    let mut from = 0;
    for (key, end) in u16s(p.get_sparse_keys()?)
        .into_iter()
        .zip(u32s(p.get_sparse_ends()?))
    {
        let run = values
            .get(from..end)
            .ok_or_else(|| capnp::Error::failed("sparse ends out of order".into()))?;
        bits.extend(run.iter().map(|&v| (key << 16) | v));
        from = end;
    }
    Ok(bits)
}
