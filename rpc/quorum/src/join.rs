//! How a master with a new data directory learns whether its cluster is
//! new, and joins a running one (docs/protocol.md §12).
//!
//! Asked `hello`, a master answers the last entry of its log, if it holds
//! one. A master whose data directory is new asks the others until a
//! majority of the masters, itself included, has answered. If one holds
//! more than the entry a new cluster starts with, the cluster runs and
//! this master joins it as a new member, under an id no master had; else
//! it founds the cluster with the others. A master back with its data lost
//! is so never counted as the member it was: that member voted, and
//! vouched for entries, with a log it no longer holds.
//!
//! To join, it asks the masters in turn until the leader has added it. The
//! leader adds it as a learner, waits until it has caught up (from a
//! snapshot when the entries it needs are gone), then makes it a voter in
//! place of the master of the same name and of any master its cluster file
//! no longer lists; one join replaces at most one master.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::Raft;
use serde::{Deserialize, Serialize};

use crate::log::LogStore;
use crate::network::{Message, Reply, Transport};
use crate::node::QuorumOptions;
use crate::{Member, Records};

/// A master asking to become a member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Join {
    /// The id it took.
    pub(crate) id: u64,
    /// Its name and address.
    pub(crate) member: Member,
    /// The names of the masters its cluster file lists.
    pub(crate) masters: Vec<String>,
}

/// How often a master asks again while it waits.
const RETRY: Duration = Duration::from_millis(500);
/// How often a master that still waits says so.
const TELL: Duration = Duration::from_secs(5);

fn encode(reply: &Reply) -> Vec<u8> {
    postcard::to_stdvec(reply).unwrap_or_default()
}

/// The answer to `hello` of a master whose log ends at `last`.
pub(crate) fn hello(last: &Option<u64>) -> Reply {
    Reply::Hello(*last)
}

/// Answers `message` for a master whose Raft has not started: `hello`
/// from its log; anything else is refused until it runs.
pub(crate) fn answer_hello(log: &LogStore, message: &[u8]) -> Vec<u8> {
    match postcard::from_bytes::<Message>(message) {
        Ok(Message::Hello) => encode(&hello(&log.last_index())),
        Ok(_) => encode(&Reply::Refused("this master is starting".into())),
        Err(e) => encode(&Reply::Refused(format!("malformed message: {e}"))),
    }
}

/// Whether the cluster of `options` runs already: asks the other masters
/// until a majority of all (this one included) has answered.
pub(crate) async fn cluster_runs(
    transport: &dyn Transport,
    options: &QuorumOptions,
) -> Result<bool, String> {
    let others: Vec<&(String, String)> = options
        .masters
        .iter()
        .filter(|(name, _)| *name != options.name)
        .collect();
    let needed = options.masters.len() / 2;
    let mut heard: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    let mut told = Instant::now();
    let message = postcard::to_stdvec(&Message::Hello).map_err(|e| e.to_string())?;
    loop {
        for (name, addr) in &others {
            if heard.contains_key(name.as_str()) {
                continue;
            }
            let answer = transport.send(addr, message.clone(), RETRY).await;
            if let Ok(Reply::Hello(last)) = answer
                .map(|b| postcard::from_bytes(&b))
                .unwrap_or(Err(postcard::Error::DeserializeUnexpectedEnd))
            {
                heard.insert(name, last);
            }
        }
        // A new cluster's log starts with its membership, entry 0.
        if heard.values().any(|last| last.is_some_and(|i| i > 0)) {
            return Ok(true);
        }
        if heard.len() >= needed {
            return Ok(false);
        }
        if told.elapsed() >= TELL {
            tracing::warn!(
                "master {}'s data directory is new: it waits for a majority of the masters to \
                 answer, to learn whether the cluster is new or runs already (start the others)",
                options.name
            );
            told = Instant::now();
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Asks the masters at `others` in turn until the leader has made `join`
/// a member.
pub(crate) async fn join(transport: &dyn Transport, others: &[String], join: &Join) {
    let Ok(message) = postcard::to_stdvec(&Message::Join(join.clone())) else {
        return;
    };
    let mut told = Instant::now();
    loop {
        let mut why = Vec::new();
        for addr in others {
            // Catching up may take a snapshot's transfer.
            let answer = transport
                .send(addr, message.clone(), Duration::from_secs(600))
                .await;
            match answer.map(|b| postcard::from_bytes::<Reply>(&b)) {
                Ok(Ok(Reply::Joined(Ok(())))) => {
                    tracing::warn!("master {} has joined the masters", join.member.name);
                    return;
                }
                Ok(Ok(Reply::Joined(Err(e)))) => why.push(format!("{addr}: {e}")),
                Ok(_) => why.push(format!("{addr}: it does not take new members yet")),
                Err(e) => why.push(format!("{addr}: {e}")),
            }
        }
        if told.elapsed() >= TELL {
            tracing::warn!(
                "master {} cannot join the masters yet: {}",
                join.member.name,
                why.join("; ")
            );
            told = Instant::now();
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Makes `join` a member, if this master (`me`) leads (see the module).
pub(crate) async fn admit(raft: &Raft<Records>, me: u64, join: Join) -> Result<(), String> {
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader != Some(me) {
        return Err("not the leader".into());
    }
    let membership = metrics.membership_config.membership().clone();
    let before: BTreeSet<u64> = membership.voter_ids().collect();
    if before.contains(&join.id) {
        return Ok(());
    }
    let names: BTreeMap<u64, String> = membership
        .nodes()
        .map(|(id, member)| (*id, member.name.clone()))
        .collect();
    let mut voters: BTreeSet<u64> = before
        .iter()
        .copied()
        .filter(|id| {
            names
                .get(id)
                .is_some_and(|name| *name != join.member.name && join.masters.contains(name))
        })
        .collect();
    if voters.len() + 1 < before.len() {
        let kept: Vec<&str> = voters
            .iter()
            .filter_map(|id| names.get(id))
            .map(String::as_str)
            .collect();
        return Err(format!(
            "master {} would replace {} masters at once (it keeps only {kept:?} of the {} \
             there are): replace one master at a time, with a cluster file that lists the others",
            join.member.name,
            before.len() - voters.len(),
            before.len()
        ));
    }
    raft.add_learner(join.id, join.member.clone(), true)
        .await
        .map_err(|e| format!("cannot add master {} as a learner: {e}", join.member.name))?;
    voters.insert(join.id);
    raft.change_membership(voters, false)
        .await
        .map_err(|e| format!("cannot make master {} a voter: {e}", join.member.name))?;
    tracing::warn!(
        "master {} at {} is a member now",
        join.member.name,
        join.member.addr
    );
    Ok(())
}
