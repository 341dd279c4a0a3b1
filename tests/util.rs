//! The harness of the process-level tests: real `bitfold slave` and
//! `bitfold master` processes on free loopback ports, stopped when the test
//! ends (whether it passes or not), and a local oracle to check answers.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::{Answer, Client, Format};

pub use crate::oracle::Oracle;

/// How long a process may take to print its readiness line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`Server::log_once`] waits for a line the test expects.
const LOG_TIMEOUT: Duration = Duration::from_secs(30);

/// Master flags that keep fault scenarios short: a dead or hung slave is
/// given up on after 1 s, and a slave that is down is probed every 200 ms.
pub const QUICK_MASTER: &[&str] = &[
    "--rpc-timeout",
    "1s",
    "--query-timeout",
    "10s",
    "--attempts",
    "4",
    "--probe-interval",
    "200ms",
];

/// A raw Cap'n Proto connection to `addr` (a slave or a master, as `C`)
/// and its bootstrap capability, for requests the client library does not
/// make; the connection lives as long as the runtime's local tasks.
pub async fn connect_capnp<C: capnp::capability::FromClientHook>(addr: &str) -> Result<C, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    Ok(capnp_over(stream))
}

/// Like [`connect_capnp`], from the IPv4 address `source` of this machine
/// (on Linux every address of 127.0.0.0/8 is loopback).
pub async fn connect_capnp_from<C: capnp::capability::FromClientHook>(
    source: std::net::Ipv4Addr,
    addr: &str,
) -> Result<C, String> {
    let cannot = |e: std::io::Error| format!("cannot connect to {addr} from {source}: {e}");
    let target: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let socket = tokio::net::TcpSocket::new_v4().map_err(cannot)?;
    socket.bind((source, 0).into()).map_err(cannot)?;
    let stream = socket.connect(target).await.map_err(cannot)?;
    Ok(capnp_over(stream))
}

/// A Cap'n Proto client over `stream`, its system run as a local task.
fn capnp_over<C: capnp::capability::FromClientHook>(stream: tokio::net::TcpStream) -> C {
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
    let (reader, writer) = stream.into_split();
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(bitfold_proto::MAX_MESSAGE_WORDS));
    let network = capnp_rpc::twoparty::VatNetwork::new(
        reader.compat(),
        writer.compat_write(),
        capnp_rpc::rpc_twoparty_capnp::Side::Client,
        options,
    );
    let mut system = capnp_rpc::RpcSystem::new(Box::new(network), None);
    let client = system.bootstrap(capnp_rpc::rpc_twoparty_capnp::Side::Server);
    tokio::task::spawn_local(system);
    client
}

/// A span of vids as a query writes it: `7` or `10-19`.
/// The layouts the exactness tests of updates and membership run under
/// (the cluster file's lines that place vectors), with a name for
/// messages: vectors of at most 2^20 bits whole and placed vid by vid (the
/// tests' own), cut into pieces of 65,536 bits placed vid by vid, and so
/// cut with piece `p` of every vector together (`group = "all"`).
pub const LAYOUTS: [(&str, &str); 3] = [
    ("whole, group 1", "group = 1\n"),
    ("pieces of 2^16, group 1", "group = 1\npiece = 65536\n"),
    (
        "pieces of 2^16, group all",
        "group = \"all\"\npiece = 65536\n",
    ),
];

/// How a cluster file with `layout`'s lines places vectors on `slaves`
/// slaves with `replicas` copies.
pub fn placement_of(
    layout: &str,
    slaves: usize,
    replicas: usize,
) -> bitfold_server::placement::Placement {
    let mut text = format!("replicas = {replicas}\n{layout}");
    for i in 0..slaves {
        text.push_str(&format!("[[slaves]]\nname = \"s{i}\"\naddr = \"h:{i}\"\n"));
    }
    bitfold_server::cluster::ClusterFile::parse(&text, Path::new("layout.toml"))
        .expect("a valid layout")
        .cluster
        .placement()
}

/// The keys (docs/protocol.md §4: the pieces) `oracle`'s vectors are
/// stored under with `placement`.
pub fn stored_keys(oracle: &Oracle, placement: &bitfold_server::placement::Placement) -> Vec<u64> {
    let pieces = placement.pieces;
    let mut keys = Vec::new();
    for (&vid, bits) in &oracle.vectors {
        let cut: BTreeSet<u32> = bits
            .iter()
            .map(|&bit| pieces.of_container((bit >> 16) as u16))
            .collect();
        keys.extend(cut.into_iter().map(|piece| pieces.key(vid, piece)));
    }
    keys
}

pub fn span_text((first, last): (u64, u64)) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    }
}

/// The `bitfold` binary under test.
pub fn bitfold_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_bitfold"))
}

/// Runs `bitfold ARGS...` to completion.
pub fn bitfold(args: &[&str]) -> Output {
    Command::new(bitfold_bin())
        .args(args)
        .output()
        .expect("the bitfold binary runs")
}

/// Standard output of a run, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Standard error of a run, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that `run` failed with exit code `code` and printed exactly one
/// line on stderr, `error: {line}`.
#[track_caller]
pub fn assert_fails_with(run: &Output, code: i32, line: &str) {
    assert_eq!(
        (run.status.code(), stderr(run)),
        (Some(code), format!("error: {line}\n"))
    );
}

/// Four consecutive free loopback ports (master + 3 slaves for `up`).
pub fn free_port_block() -> u16 {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port > 65_000 {
            continue;
        }
        let rest: Vec<_> = (1..4)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", port + i)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no block of four free ports");
}

/// `count` ports free on 127.0.0.1 now, for servers whose addresses are
/// written in a file before they start (masters listen on the address the
/// cluster file gives them).
pub fn free_ports(count: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("its address").port())
        .collect()
}

/// A server process that is killed when dropped.
pub struct Server {
    child: Child,
    /// The address it printed when it became ready.
    pub addr: String,
    /// Everything it has written on stderr so far.
    log: Arc<Mutex<String>>,
    /// Everything it has written on stdout so far.
    printed: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `bitfold ARGS...` and waits for the line `<what> listening on ADDR`.
    pub fn start(what: &str, args: &[String]) -> Result<Server, String> {
        let mut child = Command::new(bitfold_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start bitfold {what}: {e}"))?;
        let prefix = format!("{what} listening on ");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        let printed = Arc::new(Mutex::new(String::new()));
        let out = Arc::clone(&printed);
        thread::spawn(move || {
            // Keep draining the pipe for the life of the process so it never blocks.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix(&prefix) {
                    let _ = tx.send(addr.trim().to_string());
                }
                let mut out = out.lock().unwrap();
                out.push_str(&line);
                out.push('\n');
            }
        });
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let (closed_tx, closed) = mpsc::channel::<()>();
        let sink = Arc::clone(&log);
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
            drop(closed_tx);
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(addr) => Ok(Server {
                child,
                addr,
                log,
                printed,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = closed.recv_timeout(Duration::from_secs(5));
                let log = log.lock().unwrap().clone();
                Err(format!("bitfold {what} did not become ready: {log}"))
            }
        }
    }

    /// What the process has written on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// What the process has written on stderr, once `wanted` holds of it
    /// or after [`LOG_TIMEOUT`]: a server logs a refusal after the peer has
    /// already seen it, so a test that reads the log at once races the line.
    pub fn log_once(&self, wanted: impl Fn(&str) -> bool) -> String {
        once(&self.log, wanted)
    }

    /// What the process has written on stdout, once `wanted` holds of it
    /// or after [`LOG_TIMEOUT`] (it may print more after its ready line).
    pub fn printed_once(&self, wanted: impl Fn(&str) -> bool) -> String {
        once(&self.printed, wanted)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we spawned and have not reaped; no memory is involved.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("the process can be waited for")
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `text` holds once `wanted` holds of it, or after [`LOG_TIMEOUT`].
fn once(text: &Mutex<String>, wanted: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + LOG_TIMEOUT;
    loop {
        let now = text.lock().unwrap().clone();
        if wanted(&now) || Instant::now() >= deadline {
            return now;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGKILL ends a stopped (SIGSTOP) process too: kill and reap.
        self.kill();
    }
}

/// A cluster of real processes: slaves and a master (or several masters,
/// one of which leads: [`Cluster::start_replicated`]), in a temporary
/// directory.
pub struct Cluster {
    dir: tempfile::TempDir,
    /// Slave processes (None while killed); index i is slave `s{i}`.
    pub slaves: Vec<Option<Server>>,
    /// Slave addresses, fixed for the life of the cluster.
    pub slave_addrs: Vec<String>,
    /// The master process (None while killed), when there is one master.
    pub master: Option<Server>,
    /// With several masters (the cluster file's `[[masters]]`), their
    /// processes (None while killed); index i is master `m{i}`.
    pub masters: Vec<Option<Server>>,
    /// Their addresses, fixed for the life of the cluster (empty with one master).
    pub master_addrs: Vec<String>,
    extra_master_args: Vec<String>,
    /// The cluster file's lines that place vectors (`group = 1` unless
    /// started by [`Cluster::start_laid_out`]).
    layout: String,
}

impl Cluster {
    /// Starts `slaves` slaves and a master with `replicas` copies per vector.
    pub fn start(slaves: usize, replicas: usize) -> Cluster {
        Self::start_with(slaves, replicas, &[])
    }

    /// Like [`Cluster::start`], with extra flags for the master.
    pub fn start_with(slaves: usize, replicas: usize, master_args: &[&str]) -> Cluster {
        Self::start_laid_out(slaves, replicas, master_args, "group = 1\n")
    }

    /// Like [`Cluster::start_with`], the cluster file placing vectors by
    /// `layout` (its `group` and `piece` lines) instead of `group = 1`.
    pub fn start_laid_out(
        slaves: usize,
        replicas: usize,
        master_args: &[&str],
        layout: &str,
    ) -> Cluster {
        let mut cluster = Cluster::with_slaves(slaves, replicas, master_args, layout, Vec::new());
        cluster.start_master("127.0.0.1:0");
        cluster
    }

    /// Like [`Cluster::start_laid_out`], with `masters` masters whose
    /// records Raft replicates: the cluster file lists them as
    /// `[[masters]]` `m0`, `m1`, ... on free loopback ports, and each runs
    /// as its own `bitfold master --cluster FILE --name mI` process (its
    /// data in the default `master-data/mI` beside the file). They are
    /// started, not waited on to elect a leader.
    pub fn start_replicated(
        slaves: usize,
        replicas: usize,
        masters: usize,
        master_args: &[&str],
        layout: &str,
    ) -> Cluster {
        let addrs = free_ports(masters)
            .into_iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let mut cluster = Cluster::with_slaves(slaves, replicas, master_args, layout, addrs);
        for i in 0..masters {
            let server = cluster.spawn_master(i).expect("a master starts");
            cluster.masters.push(Some(server));
        }
        cluster.wait_masters_voting(Duration::from_secs(60));
        cluster
    }

    /// Waits (`patience` at most) until every master of the cluster file
    /// votes (`leader` or `follower`: none `down`, none a `learner` still
    /// joining) and one leads, so that the next fault leaves a majority;
    /// fails if they do not.
    pub fn wait_masters_voting(&self, patience: Duration) {
        let mut client = Client::connect(&self.master_addr()).expect("a client of the masters");
        client.set_timeout(Duration::from_secs(2));
        if let Err(e) = self.masters_voting(&client, patience) {
            panic!("{e}");
        }
    }

    /// [`Cluster::wait_masters_voting`] through `client`: why not, if the
    /// masters do not all vote within `patience`. With one master, `Ok` at
    /// once.
    pub fn masters_voting(&self, client: &Client, patience: Duration) -> Result<(), String> {
        let count = self.master_addrs.len();
        if count == 0 {
            return Ok(());
        }
        let deadline = Instant::now() + patience;
        let mut last = String::new();
        while Instant::now() < deadline {
            match client.full_status() {
                Ok(status) => {
                    let states: Vec<&str> =
                        status.masters.iter().map(|m| m.state.as_str()).collect();
                    let voting = states
                        .iter()
                        .filter(|s| matches!(**s, "leader" | "follower"))
                        .count();
                    let leaders = states.iter().filter(|s| **s == "leader").count();
                    if states.len() == count && voting == count && leaders == 1 {
                        return Ok(());
                    }
                    last = status
                        .masters
                        .iter()
                        .map(|m| format!("{} {}", m.name, m.state))
                        .collect::<Vec<_>>()
                        .join(", ");
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the masters did not all vote within {} s: {last}",
            patience.as_secs()
        ))
    }

    /// A cluster whose `slaves` slaves run, its cluster file written
    /// (listing `master_addrs` as `[[masters]]`), no master started yet.
    fn with_slaves(
        slaves: usize,
        replicas: usize,
        master_args: &[&str],
        layout: &str,
        master_addrs: Vec<String>,
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut cluster = Cluster {
            dir,
            slaves: Vec::new(),
            slave_addrs: Vec::new(),
            master: None,
            masters: Vec::new(),
            master_addrs,
            extra_master_args: master_args.iter().map(|s| s.to_string()).collect(),
            layout: layout.to_owned(),
        };
        for i in 0..slaves {
            let server = cluster
                .spawn_slave(i, "127.0.0.1:0")
                .expect("a slave starts");
            cluster.slave_addrs.push(server.addr.clone());
            cluster.slaves.push(Some(server));
        }
        cluster.write_cluster_file(slaves, replicas);
        cluster
    }

    /// Writes the cluster file: the first `slaves` slaves, `replicas` copies.
    /// The scenarios reason about which slave holds which of a few dozen
    /// vids: placed one by one (`group = 1`, unless the cluster was started
    /// with another layout), they spread over every slave.
    pub fn write_cluster_file(&self, slaves: usize, replicas: usize) {
        let mut toml = format!("replicas = {replicas}\n{}", self.layout);
        for (i, addr) in self.master_addrs.iter().enumerate() {
            toml.push_str(&format!(
                "[[masters]]\nname = \"m{i}\"\naddr = \"{addr}\"\n"
            ));
        }
        for (i, addr) in self.slave_addrs.iter().take(slaves).enumerate() {
            toml.push_str(&format!("[[slaves]]\nname = \"s{i}\"\naddr = \"{addr}\"\n"));
        }
        std::fs::write(self.cluster_file(), toml).expect("the cluster file is written");
    }

    /// Starts one more slave (not yet in the cluster file); returns its index.
    pub fn add_slave(&mut self) -> usize {
        let i = self.slaves.len();
        let server = self.spawn_slave(i, "127.0.0.1:0").expect("a slave starts");
        self.slave_addrs.push(server.addr.clone());
        self.slaves.push(Some(server));
        i
    }

    /// Replaces slave `i` by a new machine: a new address, an empty data directory.
    pub fn replace_slave(&mut self, i: usize) {
        self.kill_slave(i);
        std::fs::remove_dir_all(self.slave_dir(i)).expect("the old data directory is removed");
        let server = self
            .spawn_slave(i, "127.0.0.1:0")
            .expect("the new slave starts");
        self.slave_addrs[i] = server.addr.clone();
        self.slaves[i] = Some(server);
    }

    /// The temporary directory everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn cluster_file(&self) -> PathBuf {
        self.dir().join("cluster.toml")
    }

    /// The data directory of slave `i`.
    pub fn slave_dir(&self, i: usize) -> PathBuf {
        self.dir().join(format!("s{i}"))
    }

    fn spawn_slave(&self, i: usize, listen: &str) -> Result<Server, String> {
        let args = vec![
            "slave".to_string(),
            "--listen".into(),
            listen.into(),
            "--data-dir".into(),
            self.slave_dir(i).display().to_string(),
        ];
        Server::start("slave", &args)
    }

    fn start_master(&mut self, listen: &str) {
        let mut args = vec![
            "master".to_string(),
            "--listen".into(),
            listen.into(),
            "--cluster".into(),
            self.cluster_file().display().to_string(),
            "--data-dir".into(),
            self.dir().join("master-data").display().to_string(),
        ];
        args.extend(self.extra_master_args.iter().cloned());
        self.master = Some(Server::start("master", &args).expect("the master starts"));
    }

    /// The data directory of master `m{i}`, one of several: the default,
    /// `master-data/m{i}` beside the cluster file.
    pub fn master_dir(&self, i: usize) -> PathBuf {
        self.dir().join("master-data").join(format!("m{i}"))
    }

    /// Starts master `m{i}` of the cluster file's `[[masters]]`, at its
    /// address, with its data directory (whatever is left of it).
    pub fn spawn_master(&self, i: usize) -> Result<Server, String> {
        let mut args = vec![
            "master".to_string(),
            "--cluster".into(),
            self.cluster_file().display().to_string(),
            "--name".into(),
            format!("m{i}"),
        ];
        args.extend(self.extra_master_args.iter().cloned());
        Server::start("master", &args)
    }

    /// The master's address; with several masters, all of them as a
    /// client takes them (`a,b,c`).
    pub fn master_addr(&self) -> String {
        if !self.master_addrs.is_empty() {
            return self.master_addrs.join(",");
        }
        self.master
            .as_ref()
            .expect("the master is running")
            .addr
            .clone()
    }

    /// SIGKILLs master `m{i}` of several.
    pub fn kill_master_at(&mut self, i: usize) {
        if let Some(mut server) = self.masters[i].take() {
            server.kill();
        }
    }

    /// Starts master `m{i}` of several again, on its address and data directory.
    pub fn restart_master_at(&mut self, i: usize) {
        self.kill_master_at(i);
        self.masters[i] = Some(self.spawn_master(i).expect("the master starts again"));
    }

    /// Which of several masters leads and serves, as the one that answers
    /// `status` says; waits for one for up to `patience`.
    pub fn leader(&self, patience: Duration) -> Result<usize, String> {
        let mut client = Client::connect(&self.master_addr()).map_err(|e| e.to_string())?;
        // A paused master takes connections but never answers: move on.
        client.set_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + patience;
        loop {
            let status = client.full_status().map_err(|e| e.to_string());
            let leading = status.as_ref().ok().and_then(|s| {
                let name = &s.masters.iter().find(|m| m.state == "leader")?.name;
                name.strip_prefix('m')?.parse().ok()
            });
            match leading {
                Some(i) => return Ok(i),
                None if Instant::now() >= deadline => {
                    return Err(format!(
                        "no master led within {} s: {status:?}",
                        patience.as_secs()
                    ));
                }
                None => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A client connected to the master.
    pub fn client(&self) -> Client {
        Client::connect(&self.master_addr()).expect("the master accepts a client")
    }

    /// Runs `bitfold ARGS... --master ADDR` (the flag is added after the subcommand).
    pub fn cli(&self, args: &[&str]) -> Output {
        let master = self.master_addr();
        let mut full: Vec<&str> = vec![args[0], "--master", &master];
        full.extend(&args[1..]);
        bitfold(&full)
    }

    /// SIGKILLs slave `i`.
    pub fn kill_slave(&mut self, i: usize) {
        if let Some(mut server) = self.slaves[i].take() {
            server.kill();
        }
    }

    /// Starts slave `i` again on its old address and data directory.
    pub fn restart_slave(&mut self, i: usize) -> Result<(), String> {
        self.kill_slave(i);
        let addr = self.slave_addrs[i].clone();
        self.slaves[i] = Some(self.spawn_slave(i, &addr)?);
        Ok(())
    }

    /// SIGKILLs the master and starts it again on its old address.
    pub fn restart_master(&mut self) {
        let addr = self.master_addr();
        if let Some(mut master) = self.master.take() {
            master.kill();
        }
        self.start_master(&addr);
    }
}

/// What only the process-level tests need of the oracle: query text and input files.
impl Oracle {
    /// Vectors `0..vectors` with `bits` random bits each below `width`,
    /// imported into `cluster` through `bitfold import`.
    pub fn load(cluster: &Cluster, seed: u64, vectors: u64, bits: usize, width: u64) -> Oracle {
        let mut rng = Rng(seed);
        let mut oracle = Oracle::default();
        for vid in 0..vectors {
            let set: Vec<u32> = (0..bits).map(|_| (rng.next_u64() % width) as u32).collect();
            oracle.add(vid, set);
        }
        let path = cluster.dir().join("vectors.pairs");
        oracle.write_pairs(&path);
        let run = cluster.cli(&["import", path.to_str().expect("a UTF-8 path")]);
        assert!(run.status.success(), "{}", stderr(&run));
        oracle
    }

    /// The text of `R:` with the given terms.
    pub fn range_query(terms: &[(u64, u64)]) -> String {
        let terms: Vec<String> = terms.iter().copied().map(span_text).collect();
        format!("R:{}", terms.join("&"))
    }

    /// Writes every vector as a `pairs` file.
    pub fn write_pairs(&self, path: &Path) {
        let mut text = String::from("# vid,bit\n");
        for (vid, bits) in &self.vectors {
            for bit in bits {
                text.push_str(&format!("{vid},{bit}\n"));
            }
        }
        std::fs::write(path, text).expect("the pairs file is written");
    }

    /// Writes every vector as `<vid>.roaring` in `dir`.
    pub fn write_roaring(&self, dir: &Path) {
        std::fs::create_dir_all(dir).expect("the directory is created");
        for (vid, bits) in &self.vectors {
            let bitmap: roaring::RoaringBitmap = bits.iter().copied().collect();
            let mut bytes = Vec::new();
            bitmap
                .serialize_into(&mut bytes)
                .expect("serialising to memory works");
            std::fs::write(dir.join(format!("{vid}.roaring")), bytes).expect("the file is written");
        }
    }
}

/// Decodes the `words` form: little-endian u64 words, bit b = bit b%64 of word b/64.
pub fn words_to_bits(bytes: &[u8]) -> BTreeSet<u32> {
    assert_eq!(bytes.len() % 8, 0, "the words form is whole words");
    let mut bits = BTreeSet::new();
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        for b in 0..64 {
            if word >> b & 1 == 1 {
                bits.insert((i * 64 + b) as u32);
            }
        }
    }
    if let Some(last) = bytes.chunks_exact(8).last() {
        assert_ne!(
            last, [0u8; 8],
            "the words form is trimmed of trailing zero words"
        );
    }
    bits
}

/// Waits until the master reports every slave up.
pub fn wait_until_all_up(client: &Client) {
    for _ in 0..600 {
        if client.status().unwrap().iter().all(|s| s.up) {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("the slaves did not all come up: {:?}", client.status());
}

/// Asks `query` in all three forms and checks each against `expected`.
pub fn assert_answer(client: &Client, query: &str, expected: &BTreeSet<u32>) {
    match client.query(query, Format::Count) {
        Ok(Answer::Count(n)) => assert_eq!(n, expected.len() as u64, "count of {query}"),
        other => panic!("{query} as count: {other:?}"),
    }
    match client.query(query, Format::Roaring) {
        Ok(Answer::Roaring(bytes)) => {
            let bitmap = roaring::RoaringBitmap::deserialize_from(&bytes[..])
                .unwrap_or_else(|e| panic!("{query}: roaring answer does not decode: {e}"));
            let got: BTreeSet<u32> = bitmap.iter().collect();
            assert_eq!(&got, expected, "roaring answer of {query}");
        }
        other => panic!("{query} as roaring: {other:?}"),
    }
    let fits_words = expected.last().is_none_or(|&b| b < u32::MAX - 63);
    match client.query(query, Format::Words) {
        Ok(Answer::Words(bytes)) if fits_words => {
            assert_eq!(&words_to_bits(&bytes), expected, "words answer of {query}");
        }
        Err(bitfold_client::Error::Query { kind, .. }) if !fits_words => {
            assert_eq!(
                kind,
                bitfold_client::ErrorKind::TooLarge,
                "{query} as words"
            );
        }
        other => panic!("{query} as words: {other:?}"),
    }
}

/// The deterministic generator of test data: the same seed gives the same
/// data on every run and machine.
pub use bitfold_engine::mix::SplitMix64 as Rng;

/// Imports vectors `0..count` through `client`, vector `v` holding the one
/// bit `v % bits`: many small vectors, so a test reaches a bound on how
/// many one message carries.
pub fn import_one_bit_each(client: &Client, count: u64, bits: u32) {
    let vectors: Vec<(u64, bitfold_engine::VectorBuf)> = (0..count)
        .map(|vid| {
            (
                vid,
                bitfold_engine::VectorBuf::from_bits(vec![vid as u32 % bits]),
            )
        })
        .collect();
    let parts: Vec<_> = vectors.iter().map(|(vid, v)| (*vid, v.as_part())).collect();
    client.import(&parts).expect("the vectors import");
}
