//! How a master with a new data directory learns whether its cluster is
//! new, and joins a running one (docs/protocol.md §12).
//!
//! Asked `hello`, a master answers the last entry of its log, if it holds
//! one, and a number its process drew at start. A master whose data
//! directory is new asks the others until a majority of the masters,
//! itself included, has answered, and then for up to [`FOUNDING_WAIT`]
//! more until all have. If one holds more than the entry a new cluster
//! starts with, the cluster runs and this master joins it as a new member,
//! under an id no master had; else it founds the cluster with the others.
//! A master back with its data lost is so never counted as the member it
//! was: that member voted, and vouched for entries, with a log it no
//! longer holds.
//!
//! One exception closes a race at the first start: a master that founded
//! the cluster names, in its `hello` answers, the processes (by their
//! number) it heard say their data directory was new before it founded.
//! A master that finds its own process there takes its founding id: that
//! id can have neither voted nor held an entry, since this very process
//! held it back until now. So three masters started at about the same
//! time are three founding members, not two and one joining late.
//!
//! To join, it asks the masters in turn until the leader has added it. The
//! leader adds it as a learner, waits until it has caught up (from a
//! snapshot when the entries it needs are gone), then makes it a voter in
//! place of the master of the same name and of any master its cluster file
//! no longer lists; one join replaces at most one master.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
/// How long a master with a new data directory that has heard a majority
/// waits for the other masters before it founds the cluster without them.
pub(crate) const FOUNDING_WAIT: Duration = Duration::from_secs(3);

fn encode(reply: &Reply) -> Vec<u8> {
    postcard::to_stdvec(reply).unwrap_or_default()
}

/// A master's answer to `hello`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Greeting {
    /// The last entry of its log, if it holds one.
    pub(crate) last: Option<u64>,
    /// The number its process drew at start.
    pub(crate) process: u64,
    /// If this process founded the cluster: the masters (name, process
    /// number) it heard say their data directory was new before it did.
    pub(crate) founded_with: Vec<(String, u64)>,
}

/// A number for this process, unlike any other master process's.
pub(crate) fn process_number() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    crate::member_id(&format!("process#{nanos}#{}", std::process::id()))
}

/// Answers `message` for a master whose Raft has not started (its log
/// `log`, its process `process`): `hello`; anything else is refused until
/// it runs.
pub(crate) fn answer_hello(log: &LogStore, process: u64, message: &[u8]) -> Vec<u8> {
    match postcard::from_bytes::<Message>(message) {
        Ok(Message::Hello) => encode(&Reply::Hello(Greeting {
            last: log.last_index(),
            process,
            founded_with: Vec::new(),
        })),
        Ok(_) => encode(&Reply::Refused("this master is starting".into())),
        Err(e) => encode(&Reply::Refused(format!("malformed message: {e}"))),
    }
}

/// How a master with a new data directory starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    /// It founds a new cluster with the others, having heard these masters
    /// (name, process number) say their data directory was new.
    Found(Vec<(String, u64)>),
    /// The cluster was founded after a founder heard this process say it
    /// was new: it takes its founding id.
    Founder,
    /// The cluster runs: it joins as a new member.
    Join,
}

/// How master `options.name` (process `process`), whose data directory is
/// new, starts: asks the other masters until a majority of all (this one
/// included) has answered, then for up to [`FOUNDING_WAIT`] until all have.
pub(crate) async fn how_to_start(
    transport: &dyn Transport,
    options: &QuorumOptions,
    process: u64,
) -> Result<Start, String> {
    let others: Vec<&(String, String)> = options
        .masters
        .iter()
        .filter(|(name, _)| *name != options.name)
        .collect();
    let needed = options.masters.len() / 2;
    let mut heard: BTreeMap<&str, Greeting> = BTreeMap::new();
    let mut told = Instant::now();
    let mut majority: Option<Instant> = None;
    let message = postcard::to_stdvec(&Message::Hello).map_err(|e| e.to_string())?;
    loop {
        for (name, addr) in &others {
            if heard.contains_key(name.as_str()) {
                continue;
            }
            let answer = transport.send(addr, message.clone(), RETRY).await;
            if let Ok(Reply::Hello(greeting)) = answer
                .map(|b| postcard::from_bytes(&b))
                .unwrap_or(Err(postcard::Error::DeserializeUnexpectedEnd))
            {
                heard.insert(name, greeting);
            }
        }
        // A new cluster's log starts with its membership, entry 0.
        if heard.values().any(|g| g.last.is_some_and(|i| i > 0)) {
            let me = (options.name.clone(), process);
            let founder = heard.values().any(|g| g.founded_with.contains(&me));
            return Ok(if founder { Start::Founder } else { Start::Join });
        }
        if heard.len() >= needed {
            let since = *majority.get_or_insert_with(Instant::now);
            if heard.len() == others.len() || since.elapsed() >= FOUNDING_WAIT {
                let new = heard
                    .iter()
                    .map(|(name, g)| (name.to_string(), g.process))
                    .collect();
                return Ok(Start::Found(new));
            }
            tokio::time::sleep(RETRY / 5).await;
            continue;
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
