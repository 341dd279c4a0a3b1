//! The command line: every flag of every command, with its help text.

use std::path::PathBuf;
use std::time::Duration;

use bitfold_client::Format;
use bitfold_proto::names::Named;
use bitfold_server::master::{CoordinatorPolicy, PlanChoice};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

mod certs;
pub use certs::{CertsArgs, CertsCommand};

/// The master's address when `--master` is left out.
pub const DEFAULT_MASTER: &str = "127.0.0.1:7100";

/// bitfold: a bitmap index spread over slave machines, queried through a master.
///
/// A DBMS (or you, with `bitfold query`) sends the master short text queries:
/// `P:vid` fetches one vector; `R:10-19&40-44` ORs the vectors of each vid
/// range and ANDs the ranges. Start with `bitfold demo`.
#[derive(Debug, Parser)]
#[command(name = "bitfold", version, about, long_about, after_help = EXIT_CODES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

const EXIT_CODES: &str = "\
Exit codes: 0 success; 1 failure (I/O, corrupt data, internal error); \
2 bad command line; 3 bad query; 4 vector not found; \
5 unavailable (a needed slave, or the master, cannot be reached, or no master leads); \
6 answer too large for the requested form (ask for a count); \
7 forbidden (the certificate's role does not allow the call).";

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a slave: store vectors in DIR and answer handler, coordinator and fetch calls.
    Slave(SlaveArgs),
    /// Serve the master: the DBMS interface, the catalog of vids, query planning and retries.
    Master(MasterArgs),
    /// Run a whole local cluster (a master and N slaves on loopback) until Ctrl-C or SIGTERM.
    Up(UpArgs),
    /// Start a throwaway local cluster, load the sample bitmap index, run example queries, exit.
    Demo(DemoArgs),
    /// Load vectors, in `pairs` or `roaring` format, through the master (or into a local store).
    Import(ImportArgs),
    /// Delete vectors: every existing vector in the terms (`vid` or `first-last`).
    ///
    /// A deleted vector no longer exists (`P:vid` is not found, ranges skip it) on
    /// any replica; importing bits into its vid creates it again. Deleting what
    /// does not exist is not an error. Prints how many vectors were deleted.
    Delete(DeleteArgs),
    /// Send one query to the master and print its answer.
    Query(QueryArgs),
    /// Build the bitmap index of a CSV table: a vector per value or bin, and a map (index.toml).
    ///
    /// Row i of the table (after its header row) is bit i. A column whose
    /// cells are all numbers is numeric: one vector per value when it has at
    /// most --bins distinct values, else --bins bins. Any other column is
    /// categorical: one vector per distinct value. The vectors of a column
    /// are on consecutive vids in value order, the columns one after
    /// another. Empty cells set no bit. Writes `DIR/index.toml` and
    /// `DIR/vectors/<vid>.roaring`; with --master it also imports them.
    Index(IndexArgs),
    /// Show each slave: up or down (and since when), vectors, bytes.
    Status(StatusArgs),
    /// Move every vector onto exactly its owners under the master's (edited) cluster file.
    ///
    /// The master re-reads its cluster file (allowed edits: append slaves, change a
    /// slave's addr, remove slaves from the end, change replicas) and copies each
    /// vector to the owners it gains, then reads from the new owners and removes
    /// the surplus copies. Queries answer exactly throughout, and imports and updates
    /// during the move reach both old and new owners. Shows progress; exits 0 once
    /// every vector has `replicas` copies on its owners. Interrupted, run it again:
    /// it resumes. Removed slaves may be stopped once it has returned.
    Rebalance(RebalanceArgs),
    /// Write the demo's `customers` table (deterministic) as a CSV file, for `bitfold index`.
    Sample(SampleArgs),
    /// Measure large range queries: load a data set, run a workload, report queries/s.
    ///
    /// Generates a data set from `--seed` (vector `i` is vid `FIRST_VID + i`,
    /// each bit set with probability `--density`), loads it into a local
    /// cluster started for the run (or into `--master`), then runs queries of
    /// `--terms` terms, each the range of `--vids-per-term` consecutive vids
    /// at a random place, from `--concurrency` clients, and reports queries/s,
    /// latency percentiles (over every measured query) and the bytes of
    /// vectors the queries had to read per second. The same seed gives the
    /// same vectors and queries on every run.
    Bench(BenchArgs),
    /// Make and manage a cluster's certificates: a kept CA, certificates that name a role and expire, revocation.
    ///
    /// A cluster that runs mutual TLS trusts one CA. `init` makes it and
    /// keeps it in CA_DIR; `issue` writes the TLS folder of one process or
    /// client (`--tls DIR` of every command); `revoke` takes certificates
    /// back through the CA's revocation list (crl.pem); `list` shows them.
    /// `bitfold up --tls` keeps its CA in DIR/tls/ca.
    Certs(CertsArgs),
}

/// `bitfold slave`.
#[derive(Debug, Args)]
pub struct SlaveArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: String,
    /// Directory holding this slave's vectors (created if missing).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics; with --tls at
    /// https://HOST:PORT/metrics, only to a scraper that presents a client
    /// certificate signed by the cluster's CA (any role; server name `bitfold`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Without --tls: admit connections only from the addresses the hosts
    /// of this cluster file's master (its `master = "HOST:PORT"` key) and
    /// slaves resolve to (the file the master reads), re-read every 5 s, so
    /// that a slave added to it is admitted within seconds. A simple
    /// allow-list, not a security boundary: an address can be borrowed;
    /// --tls is one. Without it (and without --tls) every address is
    /// admitted. Refused with --tls, which needs no allow-list: the
    /// certificates' roles decide who may call.
    #[arg(long, value_name = "FILE", conflicts_with = "tls")]
    pub cluster: Option<PathBuf>,
}

/// `bitfold master`.
#[derive(Debug, Args)]
pub struct MasterArgs {
    /// Address to listen on for DBMS connections [default: 127.0.0.1:7100;
    /// with --name, the `addr` of the master's `[[masters]]` entry].
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "name")]
    pub listen: Option<String>,
    /// Cluster file (TOML): `replicas` and the `[[slaves]]` with `name` and
    /// `addr`, optionally a `[tls]` table naming the master's `ca`, `cert` and `key`,
    /// and `master = "HOST:PORT"`, this master's address, which slaves
    /// started with `--cluster FILE` admit. Several masters are listed as
    /// `[[masters]]` entries with `name` and `addr` (1, 3 or 5): their
    /// records are replicated by Raft, and the leader serves.
    #[arg(long, value_name = "FILE")]
    pub cluster: PathBuf,
    /// Which `[[masters]]` entry of the cluster file this master is; it
    /// listens on the entry's `addr`. Needed when the file lists `[[masters]]`.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Where the master keeps its catalog of vids [default: `master-data` beside the cluster file].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How the coordinator slave of each range query is chosen.
    #[arg(long, value_parser = named(&CoordinatorPolicy::NAMES), default_value_t = CoordinatorPolicy::RoundRobin)]
    pub policy: CoordinatorPolicy,
    /// How the coordinator gathers each term's vector.
    #[arg(long, value_parser = named(&PlanChoice::NAMES), default_value_t = PlanChoice::Auto)]
    pub plan: PlanChoice,
    /// Longest one attempt at a query may take (the coordinator and every
    /// chain under it) before its machines are reported failed [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub rpc_timeout: Option<Duration>,
    /// Most attempts at one query; each retry avoids the machines that failed [default: 3].
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,
    /// Longest time a query may take in all, retries included [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub query_timeout: Option<Duration>,
    /// How often a slave that is down is probed, to be used again once it answers [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub probe_interval: Option<Duration>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics; with --tls at
    /// https://HOST:PORT/metrics, only to a scraper that presents a client
    /// certificate signed by the cluster's CA (any role; server name `bitfold`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Log (at warn level) every query that takes at least this long, with
    /// its plan: coordinator, each term's machines, time per attempt, and
    /// each machine's hop with the bytes it read and sent and its time.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slow: Option<Duration>,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    /// Without it, the cluster file's `[tls]` table (if any) names the files.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
}

/// `bitfold up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Number of slaves [default: 3, or what `DIR/cluster.toml` says].
    #[arg(long, value_name = "N")]
    pub slaves: Option<usize>,
    /// Copies of every vector [default: 1, or what `DIR/cluster.toml` says].
    #[arg(long, value_name = "R")]
    pub replicas: Option<usize>,
    /// Where the cluster keeps its data (a cluster.toml, one directory per slave, the master's).
    #[arg(long, value_name = "DIR", default_value = "./bitfold-data")]
    pub dir: PathBuf,
    /// The master's port; new slaves take the ports after it.
    #[arg(long, value_name = "PORT", default_value_t = 7100)]
    pub port: u16,
    /// Masters to run: 1, or 3 or 5 whose records Raft replicates, so the
    /// cluster serves while a majority of them is up [default: 1, or what
    /// `DIR/cluster.toml` says]. A new cluster's masters (`m0`, `m1`, ...)
    /// listen on PORT, PORT + 1, ...; its slaves take the ports after them.
    /// Clients pass every master: `--master HOST:PORT,HOST:PORT+1,...`.
    #[arg(long, value_name = "N")]
    pub masters: Option<usize>,
    /// Serve the master's Prometheus metrics at http://HOST:PORT/metrics,
    /// and each slave's on the ports after it (slave `i` at PORT + 1 + i;
    /// with several masters, master `i` at PORT + i and the slaves after them);
    /// with --tls over https, only to a scraper that presents a client
    /// certificate signed by the cluster's CA (DIR/tls/reader's, for one).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Log (at warn level) every query that takes at least this long, with
    /// its plan and each machine's hop (bytes read and sent, time).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slow: Option<Duration>,
    /// Run every link with mutual TLS. The first run writes under DIR/tls/ a
    /// kept cluster CA (`ca/`, for `bitfold certs --ca DIR/tls/ca`), a TLS
    /// folder per process (`master/`, one per slave) and two for clients:
    /// `--tls DIR/tls/admin` for any command, `--tls DIR/tls/reader` for
    /// queries and status; and a `[tls]` table naming the master's files in
    /// DIR/cluster.toml. Later runs reuse them, issuing a folder for any slave added.
    #[arg(long)]
    pub tls: bool,
}

/// `bitfold demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The table the demo indexes and queries [default: `data/customers.csv` of this source tree].
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
}

/// `bitfold import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The master to import through.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...", conflicts_with = "data_dir")]
    pub master: Option<String>,
    /// Write straight into the slave store in DIR instead (bulk load of one slave, no master;
    /// vectors are stored whole, as a cluster with `piece = 4294967296` stores them).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Input format [default: `roaring` when every path is a directory or a `.roaring` file, else `pairs`].
    #[arg(long, value_enum)]
    pub format: Option<InputFormat>,
    /// Clear the listed bits instead of setting them: each vector that exists keeps
    /// existing without them (possibly empty); vectors that do not exist are left alone.
    #[arg(long)]
    pub clear: bool,
    /// Files (or, for `roaring`, directories of `<vid>.roaring` files) to import.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
}

/// `bitfold rebalance`.
#[derive(Debug, Args)]
pub struct RebalanceArgs {
    /// The master whose vectors to move.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...", default_value = DEFAULT_MASTER)]
    pub master: String,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
}

/// `bitfold delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The master to delete through.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...", default_value = DEFAULT_MASTER)]
    pub master: String,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// The vectors to delete: a vid (`42`) or an inclusive range of vids (`10-19`).
    #[arg(required = true, value_name = "TERM", value_parser = parse_vid_span)]
    pub terms: Vec<(u64, u64)>,
}

/// A `vid` or `first-last` (inclusive, first <= last).
fn parse_vid_span(text: &str) -> Result<(u64, u64), String> {
    let vid = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not a vid (a whole number from 0 to 2^64 - 1)"))
    };
    match text.split_once('-') {
        None => vid(text).map(|v| (v, v)),
        Some((first, last)) => {
            let (first, last) = (vid(first)?, vid(last)?);
            if first > last {
                return Err(format!(
                    "{first}-{last}: the first vid must not exceed the last"
                ));
            }
            Ok((first, last))
        }
    }
}

/// `--format` of `bitfold import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// Text, one set bit per line: `vid,bit`.
    Pairs,
    /// Files named `<vid>.roaring`, each a portable-format Roaring bitmap.
    Roaring,
}

/// `bitfold query`.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The master to ask.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...", default_value = DEFAULT_MASTER)]
    pub master: String,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Output::Summary)]
    pub output: Output,
    /// File to write the answer to (required with `--output roaring`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The query: `P:vid` or `R:term&term...`, a term being spans `vid` or `vid-vid` joined by `,`.
    #[arg(
        value_name = "QUERY",
        allow_hyphen_values = true,
        required_unless_present = "predicate",
        conflicts_with = "predicate"
    )]
    pub query: Option<String>,
    /// The map of an index (`index.toml` written by `bitfold index`), to query with --where.
    #[arg(long, value_name = "FILE", requires = "predicate")]
    pub index: Option<PathBuf>,
    /// A predicate on the indexed table instead of QUERY, e.g.
    /// "age >= 30 AND region IN ('North', 'South')"; the R: message it
    /// becomes is shown on stderr.
    #[arg(long = "where", value_name = "PREDICATE", requires = "index")]
    pub predicate: Option<String>,
    /// With --where: a bound inside a bin takes the whole bin (the answer is then a superset).
    #[arg(long, requires = "predicate")]
    pub cover: bool,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
}

/// `--output` of `bitfold query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people: how many bits are set, the first few, and the range.
    Summary,
    /// One integer: the number of set bits (the vector itself is not shipped).
    Count,
    /// The set bit positions, ascending, one per line.
    Bits,
    /// The portable Roaring serialization, written to `--out`.
    Roaring,
}

/// `bitfold status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The master to ask.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...", default_value = DEFAULT_MASTER)]
    pub master: String,
    /// Mutual TLS: DIR holds the cluster's CA (ca.pem) and this process's
    /// certificate and key (cert.pem, key.pem), as `bitfold up --tls` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
}

/// `bitfold sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// The CSV file to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Rows to write (the defaults give `data/customers.csv`).
    #[arg(long, value_name = "N", default_value_t = 80_000)]
    pub rows: u64,
    /// Seed of the generator: the same seed gives the same table.
    #[arg(long, value_name = "SEED", default_value_t = 0x5eed_b17f_01d5_a3c1)]
    pub seed: u64,
}

/// `bitfold index`.
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The table: CSV with a header row naming the columns.
    #[arg(value_name = "TABLE.csv")]
    pub table: PathBuf,
    /// Directory to write `index.toml` and `vectors/<vid>.roaring` into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A numeric column with more distinct values than this gets this many bins.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub bins: u32,
    /// How bins are cut.
    #[arg(long, value_enum, default_value_t = BinningArg::EqualWidth)]
    pub binning: BinningArg,
    /// Most distinct values of a categorical column (one vector each); above, bin it first.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub max_values: usize,
    /// Vid of the first column's first vector.
    #[arg(long, value_name = "VID", default_value_t = 0)]
    pub first_vid: u64,
    /// A column that must be numeric (a cell that is not a number is an error); repeatable.
    #[arg(long, value_name = "COLUMN")]
    pub numeric: Vec<String>,
    /// A column that is categorical even if its cells are numbers (codes, zip codes); repeatable.
    #[arg(long, value_name = "COLUMN")]
    pub categorical: Vec<String>,
    /// Also import the vectors through this master.
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub master: Option<String>,
}

/// `--binning` of `bitfold index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BinningArg {
    /// Bins of equal width over the column's range.
    EqualWidth,
    /// Bins holding about as many rows each (cut at quantiles of a sample).
    Quantile,
}

/// `bitfold bench`.
#[derive(Debug, Args)]
#[command(after_help = BENCH_EXAMPLES)]
pub struct BenchArgs {
    /// A running master to load and query [default: start a local cluster for the run].
    /// Several, separated by commas: the masters of a replicated cluster, tried in turn until one leads.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub master: Option<String>,
    /// With `--master`: the data set is already loaded (by an earlier run with the same data flags).
    #[arg(long, requires = "master")]
    pub skip_load: bool,
    /// Slaves of the local cluster.
    #[arg(long, value_name = "N", default_value_t = 4, conflicts_with = "master")]
    pub slaves: usize,
    /// Copies of every vector in the local cluster.
    #[arg(long, value_name = "R", default_value_t = 1, conflicts_with = "master")]
    pub replicas: usize,
    /// How the local cluster's master picks each query's coordinator.
    #[arg(long, value_parser = named(&CoordinatorPolicy::NAMES), default_value_t = CoordinatorPolicy::RoundRobin, conflicts_with = "master")]
    pub policy: CoordinatorPolicy,
    /// How the local cluster's coordinators gather each term's vector.
    #[arg(long, value_parser = named(&PlanChoice::NAMES), default_value_t = PlanChoice::Auto, conflicts_with = "master")]
    pub plan: PlanChoice,
    /// Consecutive vids the local cluster places together: a power of two,
    /// or `all` to place a piece of every vector on the same slaves.
    #[arg(long, value_name = "N", value_parser = bitfold_server::cluster::parse_group, default_value = "all", conflicts_with = "master")]
    pub group: u64,
    /// Bits per column piece in the local cluster (a power of two from 2^16
    /// to 2^32; 2^32 never cuts a vector); `2^20` is accepted.
    #[arg(long, value_name = "BITS", value_parser = parse_piece, default_value = "2^20", conflicts_with = "master")]
    pub piece: u64,
    /// Take the data set from a directory of `<vid>.roaring` files instead of generating it.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["vectors", "bits", "density", "first_vid"])]
    pub data: Option<PathBuf>,
    /// Vectors to generate.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub vectors: u64,
    /// Bits per vector (positions `0..BITS`, at most 2^32); `2^20` is accepted.
    #[arg(long, value_name = "BITS", default_value = "2^20", value_parser = parse_bits)]
    pub bits: u64,
    /// Probability that a bit is set: `0.5`, `1%`, `0.0001`.
    #[arg(long, value_name = "P", default_value = "0.5", value_parser = parse_density)]
    pub density: f64,
    /// Vid of the first generated vector (the others follow it).
    #[arg(long, value_name = "VID", default_value_t = 0)]
    pub first_vid: u64,
    /// Terms ANDed by each query.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub terms: usize,
    /// Existing vids ORed by each term (a range of consecutive vids).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub vids_per_term: usize,
    /// The form answers are asked in.
    #[arg(long, value_parser = named(&Format::NAMES), default_value_t = Format::Count)]
    pub form: Format,
    /// Queries in flight at once, each from its own client connection.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub concurrency: usize,
    /// Queries to run (after the warm-up) [default: 1000 unless --duration is given].
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub queries: Option<u64>,
    /// Run for this long instead of a number of queries (`30s`, `2m`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Queries run before measuring, to warm caches and connections.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub warmup: u64,
    /// Seed of the data set and of the queries.
    #[arg(long, value_name = "SEED", default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object on one line instead of the report for people.
    #[arg(long)]
    pub json: bool,
    /// Run every link of the local cluster with mutual TLS, with a cluster
    /// CA and certificates made for the run (benches/tls.sh compares it
    /// with plain runs).
    #[arg(long, conflicts_with = "master")]
    pub tls: bool,
}

const BENCH_EXAMPLES: &str = "\
Examples:
  bitfold bench                                  # the default workload on a local cluster of 4 slaves
  bitfold bench --density 1% --duration 30s --json
  bitfold bench --vectors 16 --bits 2^26 --terms 1 --vids-per-term 4 --form words
  bitfold bench --master 127.0.0.1:7100 --first-vid 1000000   # load into and query a running cluster";

/// The parser of a flag that takes one of a library enum's values: its
/// names, each listed in `--help` with what it does, from the enum's own
/// table (`NAMES`), so that the library and the command line read the same
/// names.
fn named<T>(names: &'static [Named<T>]) -> impl TypedValueParser<Value = T>
where
    T: Copy + Send + Sync + 'static,
{
    let values = names
        .iter()
        .map(|&(_, name, help)| PossibleValue::new(name).help(help));
    PossibleValuesParser::new(values).map(move |name| {
        bitfold_proto::names::parse(names, &name, "value")
            .expect("clap accepts only the listed names")
    })
}

/// Parses a bit count: `1048576` or `2^20`.
pub fn parse_bits(text: &str) -> Result<u64, String> {
    let bits = number_of_bits(text)?;
    if bits == 0 || bits > 1 << 32 {
        return Err(format!(
            "{bits} bits per vector: it must be between 1 and 2^32 (bit positions are 32-bit)"
        ));
    }
    Ok(bits)
}

/// A `--piece`: a power of two from 2^16 to 2^32, as [`number_of_bits`] reads it.
fn parse_piece(text: &str) -> Result<u64, String> {
    let bits = number_of_bits(text)?;
    bitfold_server::pieces::Pieces::new(bits)?;
    Ok(bits)
}

/// A number of bits written like 1048576 or 2^20.
fn number_of_bits(text: &str) -> Result<u64, String> {
    let text = text.trim();
    match text.split_once('^') {
        Some(("2", exponent)) => exponent
            .parse::<u32>()
            .ok()
            .and_then(|e| 1u64.checked_shl(e)),
        Some(_) => None,
        None => text.parse().ok(),
    }
    .ok_or_else(|| format!("`{text}` is not a number of bits: write it like 1048576 or 2^20"))
}

/// Parses a density: `0.5` or `50%`, strictly between 0 and 1 (1 allowed).
pub fn parse_density(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let value = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.parse::<f64>(),
    }
    .map_err(|_| format!("`{text}` is not a density: write it like 0.5, 1% or 0.0001"))?;
    if !(value > 0.0 && value <= 1.0) {
        return Err(format!(
            "density {text} is outside (0, 1]: it is the probability that a bit is set"
        ));
    }
    Ok(value)
}

/// Parses `250ms`, `5s`, `2m` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: write it like 250ms, 5s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit `{unit}` in `{text}`: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is not a usable duration"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_in_the_units_people_write() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("5h").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn bench_sizes_parse_as_written() {
        assert_eq!(parse_bits("2^20"), Ok(1 << 20));
        assert_eq!(parse_bits("1048576"), Ok(1 << 20));
        assert_eq!(parse_bits("2^32"), Ok(1 << 32));
        assert!(parse_bits("2^33").unwrap_err().contains("2^32"));
        assert!(parse_bits("0").is_err());
        assert!(parse_bits("3^4").is_err());
        assert_eq!(parse_density("1%"), Ok(0.01));
        assert_eq!(parse_density("0.5"), Ok(0.5));
        assert!(parse_density("0").is_err());
        assert!(parse_density("150%").is_err());
        assert!(parse_density("half").is_err());
    }
}
