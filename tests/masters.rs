//! A client given several masters (issue 41's client side): it skips a
//! master that is down and one that answers `notLeader` (going straight to
//! the leader it names), and fails as `unavailable`, naming every master
//! and why, when none leads for the whole failover window; `bitfold
//! status` lists the masters. The masters that are not the leader are
//! [`FakeMaster`]s in this process; the leader is a real `bitfold master`
//! (a replicated one does not exist yet).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::{Answer, Client, Error, ErrorKind, Format, MasterState};
use bitfold_proto::bitfold_capnp::{ErrorKind as WireKind, error, master};

use crate::util::{Cluster, bitfold, import_one_bit_each, stderr, stdout};

/// The `notLeader` message of a master that knows no leader.
const NO_LEADER: &str = "not the leader: no master leads now (an election is under way)";

/// An address nobody listens on.
fn dead_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").to_string()
}

/// A master in this process that answers as [`Acts`] says, counting
/// calls. Stops when dropped.
struct FakeMaster {
    addr: String,
    calls: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeMaster {
    /// A master that does not lead, answering every call `says`.
    fn not_leader(says: &str) -> FakeMaster {
        FakeMaster::start(Acts::NotLeader(says.to_owned()))
    }

    /// A fake master on a free loopback port, acting as `acts`.
    fn start(acts: Acts) -> FakeMaster {
        let calls = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready, listening) = std::sync::mpsc::channel();
        let fake = Fake {
            acts,
            calls: calls.clone(),
        };
        thread::spawn(move || {
            bitfold_net::block_on_local(async move {
                let listener = bitfold_net::bind("127.0.0.1:0").await.expect("a free port");
                let _ = ready.send(listener.local_addr().expect("its address").to_string());
                let serve = move |_: &bitfold_net::Peer| {
                    let client: master::Client = capnp_rpc::new_client(fake.clone());
                    Ok(client.client)
                };
                let accept = bitfold_net::accept_loop(listener, serve, Default::default(), None);
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            })
            .expect("a runtime");
        });
        FakeMaster {
            addr: listening.recv().expect("the fake master listens"),
            calls,
            stop: Some(stop),
        }
    }

    /// How many calls it has answered.
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How a [`FakeMaster`] answers.
#[derive(Clone)]
enum Acts {
    /// Every call `notLeader` with this message (or, for `status` and
    /// `placement`, failed with it).
    NotLeader(String),
    /// `status` with these masters and no slaves, `placement` with nothing
    /// placed; nothing else.
    Leads(Vec<MasterState>),
}

/// The capability a [`FakeMaster`] serves.
#[derive(Clone)]
struct Fake {
    acts: Acts,
    calls: Arc<AtomicUsize>,
}

impl Fake {
    /// Counts the call; its `notLeader` message, if it does not lead.
    fn counted(&self) -> Option<String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match &self.acts {
            Acts::NotLeader(says) => Some(says.clone()),
            Acts::Leads(_) => None,
        }
    }

    /// Counts the call and writes its `notLeader` error, or refuses
    /// `method` when it leads.
    fn not_leader(&self, method: &str, mut error: error::Builder<'_>) -> capnp::Result<()> {
        let says = self
            .counted()
            .ok_or_else(|| capnp::Error::unimplemented(method.into()))?;
        error.set_kind(WireKind::NotLeader);
        error.set_message(says);
        Ok(())
    }
}

impl master::Server for Fake {
    async fn query(
        self: capnp::capability::Rc<Self>,
        _: master::QueryParams,
        mut results: master::QueryResults,
    ) -> Result<(), capnp::Error> {
        self.not_leader("query", results.get().init_result().init_error())
    }

    async fn import(
        self: capnp::capability::Rc<Self>,
        _: master::ImportParams,
        mut results: master::ImportResults,
    ) -> Result<(), capnp::Error> {
        self.not_leader("import", results.get().init_outcome().init_error())
    }

    async fn status(
        self: capnp::capability::Rc<Self>,
        _: master::StatusParams,
        mut results: master::StatusResults,
    ) -> Result<(), capnp::Error> {
        if let Some(says) = self.counted() {
            return Err(capnp::Error::failed(says));
        }
        let Acts::Leads(masters) = &self.acts else {
            unreachable!("a fake that does not lead has answered")
        };
        let mut listed = results.get().init_masters(masters.len() as u32);
        for (i, m) in masters.iter().enumerate() {
            let mut entry = listed.reborrow().get(i as u32);
            entry.set_name(&m.name);
            entry.set_addr(&m.addr);
            entry.set_state(&m.state);
            entry.set_log_index(m.log_index);
            entry.set_applied(m.applied);
            entry.set_term(m.term);
            entry.set_reason(m.reason.as_deref().unwrap_or(""));
        }
        Ok(())
    }

    async fn placement(
        self: capnp::capability::Rc<Self>,
        _: master::PlacementParams,
        _: master::PlacementResults,
    ) -> Result<(), capnp::Error> {
        match self.counted() {
            Some(says) => Err(capnp::Error::failed(says)),
            None => Ok(()),
        }
    }
}

/// A master that is down before the leader in the list is skipped, by the
/// library and by every command.
#[test]
fn a_master_that_is_down_is_skipped() {
    let cluster = Cluster::start(2, 1);
    let masters = format!("{},{}", dead_addr(), cluster.master_addr());
    let client = Client::connect(&masters).expect("the second master answers");
    import_one_bit_each(&client, 8, 3);
    assert!(matches!(
        client.query("P:5", Format::Count),
        Ok(Answer::Count(1))
    ));
    assert_eq!(client.status().expect("status answers").len(), 2);
    let run = bitfold(&["query", "--master", &masters, "--output", "count", "R:0-7"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stdout(&run), "3\n");
    let run = bitfold(&["status", "--master", &masters]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        !stdout(&run).lines().any(|l| l.starts_with("master ")),
        "a single master's cluster lists no masters: {}",
        stdout(&run)
    );
}

/// A master that is not the leader sends every call, reads, writes and the
/// calls that fail with a Cap'n Proto error alike, to the leader its
/// message names: the master between them in the list is never asked.
#[test]
fn a_master_that_is_not_the_leader_sends_calls_to_the_one_it_names() {
    let cluster = Cluster::start(2, 1);
    let leader = cluster.master_addr();
    let follower = FakeMaster::not_leader(&format!("not the leader: master m2 at {leader} leads"));
    let skipped = FakeMaster::not_leader(NO_LEADER);
    let masters = format!("{},{},{leader}", follower.addr, skipped.addr);
    let run = bitfold(&["status", "--master", &masters]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains("2 of 2 slaves up"),
        "{}",
        stdout(&run)
    );
    let pairs = cluster.dir().join("bits.pairs");
    std::fs::write(&pairs, "10,1\n11,2\n").expect("the pairs file is written");
    let run = bitfold(&["import", "--master", &masters, &pairs.display().to_string()]);
    assert!(run.status.success(), "{}", stderr(&run));
    let client = Client::connect(&masters).expect("the follower takes the connection");
    import_one_bit_each(&client, 4, 2);
    assert!(matches!(
        client.query("R:0-11", Format::Count),
        Ok(Answer::Count(3))
    ));
    assert!(follower.calls() >= 2, "the follower was asked first");
    assert_eq!(skipped.calls(), 0, "the named leader is asked next");
}

/// A follower that still names a leader that is down (as one does for
/// about a second after the leader dies) does not send the client back to
/// it: the client tries the next master in turn, and finds the leader.
#[test]
fn a_follower_naming_a_dead_leader_does_not_send_the_client_back_to_it() {
    let cluster = Cluster::start(2, 1);
    let dead = dead_addr();
    let follower = FakeMaster::not_leader(&format!("not the leader: master m0 at {dead} leads"));
    let masters = format!("{dead},{},{}", follower.addr, cluster.master_addr());
    let mut client = Client::connect(&masters).expect("a master takes the connection");
    client.set_failover(Duration::from_secs(3));
    import_one_bit_each(&client, 5, 5);
    // Which master leads (it cannot say), then the import once or twice.
    assert!(
        follower.calls() <= 3,
        "the follower was asked {} times: the client went back to the dead leader it named",
        follower.calls()
    );
}

/// While no master leads, a call tries each in turn for the failover
/// window, then fails as `unavailable` naming each master and why.
#[test]
fn with_no_master_leading_a_call_fails_unavailable_naming_each_master() {
    let dead = dead_addr();
    let follower = FakeMaster::not_leader(NO_LEADER);
    let masters = format!("{dead},{}", follower.addr);
    let mut client = Client::connect(&masters).expect("the follower takes the connection");
    client.set_failover(Duration::from_millis(800));
    let start = Instant::now();
    let err = client.query("P:1", Format::Count).unwrap_err();
    let took = start.elapsed();
    let Error::Query {
        kind: ErrorKind::Unavailable,
        message,
        failed_machines,
    } = &err
    else {
        panic!("not unavailable: {err:?}");
    };
    assert!(
        message.starts_with("unavailable: no master leads: ")
            && message.contains(&format!("{dead}: connection refused"))
            && message.contains(&format!("{}: {NO_LEADER}", follower.addr)),
        "{message}"
    );
    assert_eq!(failed_machines, &[dead.clone(), follower.addr.clone()]);
    assert!(follower.calls() >= 2, "the masters were tried again");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(30),
        "{took:?}"
    );
}

/// Every master down: the command fails as `unavailable` (exit 5) after
/// the default window, naming each; a single master's error is as before.
#[test]
fn with_every_master_down_a_command_names_each() {
    let (a, b) = (dead_addr(), dead_addr());
    let run = bitfold(&["query", "--master", &format!("{a},{b}"), "P:1"]);
    assert_eq!(run.status.code(), Some(5), "{}", stderr(&run));
    let line = stderr(&run);
    assert!(
        line.starts_with(&format!(
            "error: unavailable: no master leads: {a}: connection refused; {b}: connection refused"
        )) && line.lines().count() == 1,
        "{line}"
    );
    let run = bitfold(&["query", "--master", &a, "P:1"]);
    assert_eq!(
        stderr(&run),
        format!(
            "error: cannot reach the master at {a}: connection refused (start it with `bitfold up`)\n"
        )
    );
}

/// A client given several masters asks the first that answers which one
/// leads, and sends its calls there (a follower would send each on: one
/// more hop per call). Here the first, a fake, names the real master the
/// leader: the status the client then gets is the real one's.
#[test]
fn a_client_moves_to_the_leader_the_first_master_names() {
    let cluster = Cluster::start(2, 1);
    let leader = cluster.master_addr();
    let follower = FakeMaster::start(Acts::Leads(vec![MasterState {
        name: "m1".into(),
        addr: leader.clone(),
        state: "leader".into(),
        log_index: 7,
        applied: 7,
        term: 2,
        reason: None,
    }]));
    let client = Client::connect(&format!("{},{leader}", follower.addr))
        .expect("a master takes the connection");
    let status = client.full_status().expect("status answers");
    assert_eq!(
        status.slaves.len(),
        2,
        "the status came from the follower, not the leader it named"
    );
    assert_eq!(
        follower.calls(),
        1,
        "the follower was asked which master leads, once"
    );
}

/// `bitfold status` prints one line per master, before the slaves'.
#[test]
fn status_lists_every_master_before_the_slaves() {
    let master = |name: &str, addr: &str, state: &str, reason: Option<&str>| MasterState {
        name: name.into(),
        addr: addr.into(),
        state: state.into(),
        log_index: 7,
        applied: 7,
        term: 2,
        reason: reason.map(Into::into),
    };
    let dead = dead_addr();
    let masters = vec![
        master("m0", "127.0.0.1:7100", "leader", None),
        master("m1", &dead, "down", Some("connection refused")),
    ];
    let leader = FakeMaster::start(Acts::Leads(masters.clone()));
    let client = Client::connect(&leader.addr).expect("the fake master answers");
    assert_eq!(
        client.full_status().expect("status answers").masters,
        masters
    );
    let run = bitfold(&["status", "--master", &leader.addr]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    let lines: Vec<&str> = text.lines().take(3).collect();
    assert_eq!(
        lines,
        [
            "master m0 127.0.0.1:7100 leader log 7 applied 7 term 2",
            &format!("master m1 {dead} down log 7 term 2: connection refused"),
            lines[2],
        ],
        "{text}"
    );
    assert!(lines[2].starts_with("SLAVE "), "{text}");
}
