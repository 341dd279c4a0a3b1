//! The bounds on what a peer can send (docs/protocol.md §7, Limits, and
//! docs/slave-protocol.md S9), each
//! against real `bitfold slave` and `bitfold master` processes: a peer that
//! goes over one gets an error naming the bound, and the process goes on
//! answering everyone else exactly. The requests are built by hand, as no
//! bitfold client would send them; and the largest requests a client does
//! send (vectors of 2^32 bits) go through within the bounds.

use std::future::Future;
use std::io::Write;

use bitfold_client::Client;
use bitfold_proto::bitfold_capnp::{
    ErrorKind, PlanKind, error, gather_result, machine_vec_node, master, outcome, slave,
    update_outcome, vid_vector,
};
use capnp::capability::FromClientHook;
use capnp::message::ReaderOptions;

use crate::util::{Cluster, Oracle, assert_answer};

/// The bounds of docs/protocol.md §7 and docs/slave-protocol.md S9, as a
/// peer meets them.
const MAX_MESSAGE_WORDS: u32 = 1 << 27;
const MAX_CONNECTIONS_PER_PEER: usize = 256;
const MAX_PARTS: u32 = 131_072;
const MAX_IMPORT_VECTORS: u32 = 262_144;
const MAX_IMPORT_PARTS: u32 = 1_048_576;
const MAX_CHAINS: u32 = 10_000;
const MAX_DELETE_SPANS: u32 = 65_536;

/// Vectors `0..VECTORS` spread over both slaves, and the query over them all.
const VECTORS: u64 = 40;
const ALL: &str = "R:0-39";

/// A cluster of two slaves holding `0..VECTORS`, its oracle and a client;
/// one query over every vector has been answered, so the master and the
/// slaves hold their connections to each other.
fn loaded_cluster(seed: u64) -> (Cluster, Oracle, Client) {
    let cluster = Cluster::start(2, 1);
    let oracle = Oracle::load(&cluster, seed, VECTORS, 200, 1 << 20);
    let client = cluster.client();
    assert_answer(&client, ALL, &oracle.range(&[(0, VECTORS - 1)]));
    (cluster, oracle, client)
}

/// Checks that `cluster` still answers exactly, through the master and
/// to a new connection of its own on slave `s0`.
fn still_answers(cluster: &Cluster, oracle: &Oracle, client: &Client) {
    assert_answer(client, ALL, &oracle.range(&[(0, VECTORS - 1)]));
    assert_answer(client, "R:3&4-20", &oracle.range(&[(3, 3), (4, 20)]));
    // A peer that went over the connection bound closed its connections;
    // the slave counts them off as it sees them close.
    for _ in 0..200 {
        let health = on_runtime(async {
            let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
            let health = slave.health_request().send().promise.await?;
            Ok::<_, capnp::Error>(health.get()?.get_vectors())
        });
        match health {
            Ok(vectors) => {
                assert!(vectors > 0, "s0 holds some of the vectors");
                return;
            }
            Err(err) if err.to_string().contains("too many connections") => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(err) => panic!("s0 does not answer a new peer: {err}"),
        }
    }
    panic!("s0 refuses a new peer long after the others closed");
}

/// Runs `body` on a current-thread runtime (capnp-rpc clients are `!Send`).
fn on_runtime<F: Future>(body: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    tokio::task::LocalSet::new().block_on(&runtime, body)
}

/// A Cap'n Proto connection to `addr` and its bootstrap capability.
async fn connect<C: FromClientHook>(addr: &str) -> C {
    crate::util::connect_capnp(addr)
        .await
        .expect("the server accepts a connection")
}

/// The text of a failed call, or a panic if it did not fail.
/// The session a slave's calls must name (its health answer's).
async fn session(slave: &slave::Client) -> u64 {
    let health = slave.health_request().send().promise.await.unwrap();
    health.get().unwrap().get_state().unwrap().get_session()
}

fn refusal<T>(answer: capnp::Result<T>, what: &str) -> String {
    match answer {
        Ok(_) => panic!("{what} was accepted"),
        Err(err) => err.to_string(),
    }
}

#[track_caller]
fn assert_names(text: &str, count: u32, most: u32, what: &str) {
    let wanted = format!("{count} {what} in one message, more than the {most} allowed");
    assert!(text.contains(&wanted), "wanted {wanted:?} in {text:?}");
}

#[test]
fn a_message_over_the_size_bound_closes_its_connection_only() {
    let (cluster, oracle, client) = loaded_cluster(71);
    for addr in [&cluster.slave_addrs[0], &cluster.master_addr()] {
        // A message's first words announce its size: one segment of one
        // word more than the bound. The rest is never sent (nor read).
        let mut stream = std::net::TcpStream::connect(addr.as_str()).unwrap();
        // A server that said nothing would fail the test, not hang it.
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let mut header = 0u32.to_le_bytes().to_vec();
        header.extend((MAX_MESSAGE_WORDS + 1).to_le_bytes());
        stream.write_all(&header).unwrap();
        // The server answers with an abort naming the bound, then closes.
        let abort = capnp::serialize::read_message(&mut stream, ReaderOptions::new())
            .expect("the server says why it closes the connection");
        let abort = abort
            .get_root::<capnp_rpc::rpc_capnp::message::Reader<'_>>()
            .unwrap();
        let reason = match abort.which().unwrap() {
            capnp_rpc::rpc_capnp::message::Abort(exception) => exception
                .unwrap()
                .get_reason()
                .unwrap()
                .to_string()
                .unwrap(),
            _ => panic!("{addr} answered something other than an abort"),
        };
        assert_names(&reason, MAX_MESSAGE_WORDS + 1, MAX_MESSAGE_WORDS, "words");
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut stream, &mut rest).expect("the connection is closed");
        assert!(rest.is_empty(), "{addr} sent more after the abort");
        still_answers(&cluster, &oracle, &client);
    }
}

#[test]
fn a_peer_over_its_connection_bound_is_refused_while_others_are_served() {
    let (cluster, oracle, client) = loaded_cluster(72);
    let slave = &cluster.slave_addrs[0];
    on_runtime(until_refused(slave, |s: &slave::Client| {
        let health = s.health_request().send().promise;
        async move { health.await.map(drop) }
    }));
    // The refused peer's connections are gone with its runtime; the
    // cluster, connected before, answered throughout and still does.
    still_answers(&cluster, &oracle, &client);
    on_runtime(until_refused(
        &cluster.master_addr(),
        |m: &master::Client| {
            let placement = m.placement_request().send().promise;
            async move { placement.await.map(drop) }
        },
    ));
    still_answers(&cluster, &oracle, &client);
}

/// Opens connections to `addr`, asking each something, until one is
/// refused; checks the refusal names the bound, and that the connections
/// opened before it are still served.
async fn until_refused<C, F, Fut>(addr: &str, ask: F)
where
    C: FromClientHook,
    F: Fn(&C) -> Fut,
    Fut: Future<Output = capnp::Result<()>>,
{
    // The cluster's own processes reach `addr` from 127.0.0.1 as well,
    // so this peer shares the bound with a few of their connections.
    let mut held: Vec<C> = Vec::new();
    let refused = loop {
        let connection: C = connect(addr).await;
        let answer = ask(&connection).await;
        held.push(connection);
        if let Err(err) = answer {
            break err.to_string();
        }
        assert!(held.len() <= MAX_CONNECTIONS_PER_PEER, "{addr}: no bound");
    };
    assert!(
        refused.contains(&format!(
            "too many connections from 127.0.0.1: a peer may hold at most \
             {MAX_CONNECTIONS_PER_PEER} at once"
        )),
        "{addr}: {refused}"
    );
    assert!(
        held.len() > MAX_CONNECTIONS_PER_PEER - 8,
        "{addr}: refused after {} connections",
        held.len()
    );
    let first = ask(&held[0]).await;
    assert!(
        first.is_ok(),
        "{addr}: the first connection: {:?}",
        first.err()
    );
}

/// An import request of `vectors` vectors, the vector `i` of `parts(i)`
/// empty parts.
fn import_message(
    vectors: u32,
    parts: impl Fn(u32) -> u32,
) -> capnp::message::Builder<capnp::message::HeapAllocator> {
    let mut message = capnp::message::Builder::new_default();
    let mut list: capnp::struct_list::Builder<'_, vid_vector::Owned> = message.initn_root(vectors);
    for i in 0..vectors {
        let mut vector = list.reborrow().get(i);
        vector.set_vid(u64::from(i));
        vector.init_parts(parts(i));
    }
    message
}

/// Sends `vectors` to slave `s0` as an import; the text of its refusal.
fn slave_refuses_import(
    cluster: &Cluster,
    vectors: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> String {
    on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        let session = session(&slave).await;
        let mut request = slave.import_request();
        request.get().init_stamp().set_session(session);
        request
            .get()
            .set_vectors(vectors.get_root_as_reader().unwrap())
            .unwrap();
        refusal(request.send().promise.await, "the import")
    })
}

#[test]
fn a_vector_of_too_many_parts_is_refused_by_slave_and_master_as_a_bad_request() {
    let (cluster, oracle, client) = loaded_cluster(73);
    let over = import_message(2, |i| if i == 1 { MAX_PARTS + 1 } else { 1 });
    let refused = slave_refuses_import(&cluster, &over);
    assert_names(&refused, MAX_PARTS + 1, MAX_PARTS, "parts of a vector");
    still_answers(&cluster, &oracle, &client);

    // The master checks each vector of an import or a clear before it
    // sends anything: the request is malformed, a `badQuery`, and nothing
    // of it is applied.
    let [import, clear] = master_refuses(&cluster, &over);
    for (kind, message) in [import, clear] {
        assert_eq!(kind, ErrorKind::BadQuery, "{message}");
        assert!(message.starts_with("vector 1 is malformed: "), "{message}");
        assert_names(&message, MAX_PARTS + 1, MAX_PARTS, "parts of a vector");
    }
    // Vector 0 of the refused import (one empty part) was not applied
    // either; it held bits before and holds the same ones now.
    still_answers(&cluster, &oracle, &client);
    assert_answer(&client, "R:0", &oracle.range(&[(0, 0)]));
}

#[test]
fn an_import_with_full_keys_is_refused_by_the_master_before_any_slave_stores_it() {
    let (cluster, oracle, client) = loaded_cluster(74);
    // Vector 0 sets a bit it lacks; vector 1 says its first container is
    // full the way only a partial result may (a stored vector has none).
    let held = oracle.range(&[(0, 0)]);
    let new_bit = (0u32..1 << 16).find(|b| !held.contains(b)).unwrap();
    let mut message = capnp::message::Builder::new_default();
    let mut list: capnp::struct_list::Builder<'_, vid_vector::Owned> = message.initn_root(2);
    let mut first = list.reborrow().get(0);
    first.set_vid(0);
    let mut part = first.init_parts(1).get(0);
    part.set_sparse_keys(&0u16.to_le_bytes());
    part.set_sparse_ends(&1u32.to_le_bytes());
    part.set_sparse_values(&(new_bit as u16).to_le_bytes());
    let mut second = list.reborrow().get(1);
    second.set_vid(1);
    second
        .init_parts(1)
        .get(0)
        .set_full_keys(&0u16.to_le_bytes());

    // Once, the master sent it on, and the owner of vector 1 refused it:
    // the master took that slave for down and answered no query of its
    // vectors until a probe found it up again.
    let [import, clear] = master_refuses(&cluster, &message);
    for (kind, message) in [import, clear] {
        assert_eq!(kind, ErrorKind::BadQuery, "{message}");
        assert!(
            message.starts_with("vector 1 is malformed: ") && message.contains("full keys"),
            "{message}"
        );
    }
    // Neither vector reached a slave: vector 0 lacks the bit still, and
    // every slave answers.
    still_answers(&cluster, &oracle, &client);
    assert_answer(&client, "R:0", &oracle.range(&[(0, 0)]));
}

/// Sends `vectors` to the master as an import; the kind and text of the
/// error it answered (it must refuse it).
fn master_refuses_import(
    cluster: &Cluster,
    vectors: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> (ErrorKind, String) {
    on_runtime(async {
        let master: master::Client = connect(&cluster.master_addr()).await;
        let mut request = master.import_request();
        request.get().set_vectors(vectors.get_root_as_reader()?)?;
        let response = request.send().promise.await?;
        match response.get()?.get_outcome()?.which()? {
            outcome::Error(error) => told(error?),
            outcome::Ok(()) => panic!("the master imported what it must refuse"),
        }
    })
    .unwrap()
}

/// Sends `vectors` to the master as an import, then as a clear; the kind
/// and text of the error it answered each (it must refuse both).
fn master_refuses(
    cluster: &Cluster,
    vectors: &capnp::message::Builder<capnp::message::HeapAllocator>,
) -> [(ErrorKind, String); 2] {
    let import = master_refuses_import(cluster, vectors);
    on_runtime(async {
        let master: master::Client = connect(&cluster.master_addr()).await;
        let vectors = vectors.get_root_as_reader()?;
        let mut request = master.clear_request();
        request.get().set_vectors(vectors)?;
        let response = request.send().promise.await?;
        let clear = match response.get()?.get_outcome()?.which()? {
            update_outcome::Error(error) => told(error?)?,
            update_outcome::Changed(_) => panic!("the master cleared what it must refuse"),
        };
        Ok::<_, capnp::Error>([import, clear])
    })
    .unwrap()
}

/// The kind and text of an error a master answered.
fn told(error: error::Reader<'_>) -> capnp::Result<(ErrorKind, String)> {
    Ok((error.get_kind()?, error.get_message()?.to_string()?))
}

#[test]
fn an_import_of_too_many_vectors_is_refused() {
    let (cluster, oracle, client) = loaded_cluster(74);
    let over = import_message(MAX_IMPORT_VECTORS + 1, |_| 0);
    let refused = slave_refuses_import(&cluster, &over);
    assert_names(
        &refused,
        MAX_IMPORT_VECTORS + 1,
        MAX_IMPORT_VECTORS,
        "vectors to import",
    );
    // The master refuses as much before reading a vector (an import or a
    // clear), and a delete of too many spans, as bad requests.
    let [import, clear] = master_refuses(&cluster, &over);
    let delete = on_runtime(async {
        let master: master::Client = connect(&cluster.master_addr()).await;
        let mut request = master.delete_request();
        let mut spans = request.get().init_spans(MAX_DELETE_SPANS + 1);
        for i in 0..=MAX_DELETE_SPANS {
            spans.reborrow().get(i).set_first(u64::from(i));
            spans.reborrow().get(i).set_last(u64::from(i));
        }
        let response = request.send().promise.await?;
        match response.get()?.get_outcome()?.which()? {
            update_outcome::Error(error) => told(error?),
            update_outcome::Changed(_) => panic!("the master deleted over the bound"),
        }
    })
    .unwrap();
    for ((kind, message), what, most) in [
        (import, "vectors to import", MAX_IMPORT_VECTORS),
        (clear, "vectors to clear", MAX_IMPORT_VECTORS),
        (delete, "spans to delete", MAX_DELETE_SPANS),
    ] {
        assert_eq!(kind, ErrorKind::BadQuery, "{message}");
        assert_names(&message, most + 1, most, what);
    }
    // Nothing of them was applied: vectors 0 to 39 are all still there.
    still_answers(&cluster, &oracle, &client);
}

#[test]
fn an_import_of_too_many_parts_in_all_is_refused() {
    let (cluster, oracle, client) = loaded_cluster(75);
    // Every vector within its own bound, the message over the import's.
    let vectors = MAX_IMPORT_PARTS / MAX_PARTS + 1;
    let over = import_message(vectors, |i| if i == 0 { 1 } else { MAX_PARTS });
    let refused = slave_refuses_import(&cluster, &over);
    assert_names(
        &refused,
        MAX_IMPORT_PARTS + 1,
        MAX_IMPORT_PARTS,
        "parts of vectors to import",
    );
    still_answers(&cluster, &oracle, &client);

    // The same through the master, each vector's first part now holding
    // bits its vector lacks: refused before any slave is sent any of it (a
    // master that sent it on took the slaves' refusal for their failure).
    let mut over = over;
    let mut list = over
        .get_root::<capnp::struct_list::Builder<'_, vid_vector::Owned>>()
        .unwrap();
    for i in 0..vectors {
        let mut part = list.reborrow().get(i).get_parts().unwrap().get(0);
        part.set_sparse_keys(&0u16.to_le_bytes());
        part.set_sparse_ends(&1u32.to_le_bytes());
        let held = oracle.range(&[(u64::from(i), u64::from(i))]);
        let new_bit = (0u32..1 << 16).find(|b| !held.contains(b)).unwrap();
        part.set_sparse_values(&(new_bit as u16).to_le_bytes());
    }
    let (kind, message) = master_refuses_import(&cluster, &over);
    assert_eq!(kind, ErrorKind::BadQuery, "{message}");
    assert_names(
        &message,
        MAX_IMPORT_PARTS + 1,
        MAX_IMPORT_PARTS,
        "parts of vectors to import",
    );
    still_answers(&cluster, &oracle, &client);
}

#[test]
fn an_update_of_too_many_changes_or_parts_is_refused_and_changes_nothing() {
    let (cluster, oracle, client) = loaded_cluster(78);
    let (changes, parts) = on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        // Deletes of every vid, and one more change than the bound.
        let mut request = slave.update_request();
        let mut list = request.get().init_changes(MAX_IMPORT_VECTORS + 1);
        for i in 0..=MAX_IMPORT_VECTORS {
            let mut change = list.reborrow().get(i);
            change.set_vid(u64::from(i));
            change.set_delete(());
        }
        let changes = refusal(request.send().promise.await, "the update");
        // Eight clears of the most parts a vector holds, and one part more.
        let mut request = slave.update_request();
        let mut list = request.get().init_changes(9);
        for i in 0..9 {
            let mut change = list.reborrow().get(i);
            change.set_vid(u64::from(i));
            change.init_clear(if i == 8 { 1 } else { MAX_PARTS });
        }
        let parts = refusal(request.send().promise.await, "the update");
        (changes, parts)
    });
    assert_names(
        &changes,
        MAX_IMPORT_VECTORS + 1,
        MAX_IMPORT_VECTORS,
        "changes",
    );
    assert_names(
        &parts,
        MAX_IMPORT_PARTS + 1,
        MAX_IMPORT_PARTS,
        "parts of changes",
    );
    // Nothing of either was applied: every vector is still there, whole.
    still_answers(&cluster, &oracle, &client);
}

#[test]
fn a_coordinate_or_gather_of_too_many_chains_is_refused() {
    let (cluster, oracle, client) = loaded_cluster(76);
    let (coordinate, gather) = on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        let mut request = slave.coordinate_request();
        request.get().set_budget_micros(10_000_000);
        request.get().init_chains(MAX_CHAINS + 1);
        let coordinate = refusal(request.send().promise.await, "the coordinate");
        let mut request = slave.gather_request();
        request.get().init_terms(MAX_CHAINS + 1);
        let gather = refusal(request.send().promise.await, "the gather");
        (coordinate, gather)
    });
    assert_names(&coordinate, MAX_CHAINS + 1, MAX_CHAINS, "chains");
    assert_names(&gather, MAX_CHAINS + 1, MAX_CHAINS, "terms");
    still_answers(&cluster, &oracle, &client);
}

#[test]
fn a_chain_of_nodes_that_take_no_words_is_refused() {
    let (cluster, oracle, client) = loaded_cluster(79);
    // A list of 2^26 empty nodes, in three words: Cap'n Proto copies a list
    // of empty structs as it is, so the request carries it in as few.
    const NODES: u64 = 1 << 26;
    let mut words = Vec::new();
    for word in [2 << 32, 1 | 7 << 32, NODES << 2] {
        words.extend(u64::to_le_bytes(word));
    }
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(MAX_MESSAGE_WORDS as usize));
    let empty = capnp::serialize::read_message_from_flat_slice(&mut &words[..], options).unwrap();
    let nodes: capnp::struct_list::Reader<'_, machine_vec_node::Owned> = empty.get_root().unwrap();
    let (handle, chains, fan_out) = on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        let mut request = slave.handle_request();
        request.get().set_budget_micros(10_000_000);
        request
            .get()
            .init_machines(1)
            .get(0)
            .set_addr(cluster.slave_addrs[0].as_str());
        request.get().set_chain(nodes).unwrap();
        let handle = refusal(request.send().promise.await, "the handle");
        let mut refused = Vec::new();
        for plan in [PlanKind::Chain, PlanKind::FanOut] {
            let mut request = slave.coordinate_request();
            request.get().set_budget_micros(10_000_000);
            request.get().set_plan(plan);
            request
                .get()
                .init_machines(1)
                .get(0)
                .set_addr(cluster.slave_addrs[0].as_str());
            request.get().init_chains(1).set(0, nodes).unwrap();
            refused.push(refusal(request.send().promise.await, "the coordinate"));
        }
        (handle, refused.remove(0), refused.remove(0))
    });
    for refused in [handle, chains, fan_out] {
        assert!(
            refused.contains(&format!("a list of {NODES} chain nodes that take no words")),
            "{refused}"
        );
    }
    still_answers(&cluster, &oracle, &client);
}

#[test]
fn runs_of_vids_past_the_last_vid_or_out_of_order_are_refused() {
    let (cluster, oracle, client) = loaded_cluster(77);
    let (handle, gather, widest) = on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        let mut request = slave.handle_request();
        request.get().set_budget_micros(10_000_000);
        let mut machine = request.get().init_machines(1).get(0);
        machine.set_name("s0");
        machine.set_addr(cluster.slave_addrs[0].as_str());
        let mut node = request.get().init_chain(1).get(0);
        node.set_vid(u64::MAX - 1);
        node.set_more(5);
        let handle = refusal(request.send().promise.await, "the handle");
        let term = |runs: &[u64]| {
            runs.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let session = session(&slave).await;
        let mut request = slave.gather_request();
        request.get().set_session(session);
        request.get().init_terms(1).set(0, &term(&[0, 3, 2, 9]));
        let gather = refusal(request.send().promise.await, "the gather");
        // One run naming every vid: the slave answers with the first it
        // lacks, having looked at what it holds, not at 2^64 vids.
        let mut request = slave.gather_request();
        request.get().set_session(session);
        request.get().init_terms(1).set(0, &term(&[0, u64::MAX]));
        let answer = request
            .send()
            .promise
            .await
            .expect("a gather of every vid is answered");
        let widest = match answer.get().unwrap().get_result().unwrap().which().unwrap() {
            gather_result::Missing(vid) => vid,
            gather_result::Terms(_) => panic!("s0 holds every vid"),
        };
        (handle, gather, widest)
    });
    assert!(handle.contains("passes the last vid"), "{handle}");
    assert!(
        gather.contains("is empty or not after the one before"),
        "{gather}"
    );
    let held = on_runtime(async {
        let slave: slave::Client = connect(&cluster.slave_addrs[0]).await;
        let catalog = slave.catalog_request().send().promise.await.unwrap();
        let bytes = catalog.get().unwrap().get_vids().unwrap().to_vec();
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<u64>>()
    });
    let first_lacked = (0..).find(|v| !held.contains(v)).unwrap();
    assert_eq!(
        widest, first_lacked,
        "the first vid s0 lacks (it holds {held:?})"
    );
    still_answers(&cluster, &oracle, &client);
}

/// A vector of the dense containers `keys`, every even bit of each set
/// (32,768 bits, 8 KiB a container).
fn evens_in(keys: impl IntoIterator<Item = u16>) -> bitfold_engine::VectorBuf {
    let evens = [0x5555_5555_5555_5555u64; 1024];
    let mut vector = bitfold_engine::VectorBuf::new();
    for key in keys {
        vector.push_dense(key, &evens).unwrap();
    }
    vector
}

/// The count `client` answers for `query`.
#[track_caller]
fn count_of(client: &Client, query: &str) -> u64 {
    match client.query(query, bitfold_client::Format::Count) {
        Ok(bitfold_client::Answer::Count(n)) => n,
        other => panic!("{query}: {other:?}"),
    }
}

#[test]
fn a_gather_reply_over_the_bound_arrives_in_pieces_exactly() {
    // Three terms, each one vector of 2^32 bits (every container dense)
    // on slave 0 and a small one on slave 1: slave 0's gather reply, its
    // three vectors ORed with nothing, crosses the network whenever slave 1
    // coordinates. A query over 1.5 GiB of vectors takes longer than the
    // 5 s an attempt may take by default on this machine.
    let cluster = Cluster::start_with(
        2,
        1,
        &[
            "--plan",
            "fan-out",
            "--rpc-timeout",
            "120s",
            "--query-timeout",
            "300s",
        ],
    );
    let client = cluster.client();
    // Three terms `v-(v+1)`: `v` on slave 0, `v + 1` on slave 1.
    let starts: Vec<u64> = (0..)
        .filter(|&v| {
            bitfold_server::placement::primary(v, 2) == 0
                && bitfold_server::placement::primary(v + 1, 2) == 1
        })
        .scan(None, |last: &mut Option<u64>, v| {
            let next = last.is_none_or(|l| v > l + 1).then_some(v);
            if next.is_some() {
                *last = next;
            }
            Some(next)
        })
        .flatten()
        .take(3)
        .collect();
    // Term 1's big vector has every container, term 2's lacks key 5, term
    // 3's key 7: an answer with the terms mixed up or one lost differs.
    for (t, &v) in starts.iter().enumerate() {
        let big = evens_in((0..=u16::MAX).filter(|&key| (t, key) != (1, 5) && (t, key) != (2, 7)));
        let small = bitfold_engine::VectorBuf::from_bits(vec![1, 3]);
        client
            .import(&[(v, big.as_part()), (v + 1, small.as_part())])
            .expect("the vectors import");
    }
    let query = starts
        .iter()
        .map(|v| format!("{v}-{}", v + 1))
        .collect::<Vec<_>>()
        .join("&");
    let query = format!("R:{query}");
    // Round-robin over the two slaves, which both hold vectors of every term.
    for _ in 0..2 {
        assert_eq!(
            count_of(&client, &query),
            (65_536 - 2) * 32_768 + 2,
            "{query}"
        );
    }
}

#[test]
fn a_vector_of_every_container_imports_and_clears_through_the_master() {
    // 65,536 dense containers: 512 MiB, half the message bound, sent to
    // both owners. The master once read an import three times over (its
    // size, its check, a copy per owner), past the traversal limit, and
    // refused it as malformed.
    let cluster = Cluster::start(2, 2);
    let client = cluster.client();
    client
        .import(&[(9, evens_in(0..=u16::MAX).as_part())])
        .expect("the vector imports");
    assert_eq!(count_of(&client, "R:9"), 1 << 31);
    assert_eq!(count_of(&client, "P:9"), 1 << 31);
    // A clear of the whole vector but one container, as large.
    client
        .clear(&[(9, evens_in(1..=u16::MAX).as_part())])
        .expect("the clear applies");
    assert_eq!(count_of(&client, "R:9"), 32_768);
}
