//! Prometheus metrics of a master ([`MasterMetrics`]) and of a slave
//! ([`SlaveMetrics`]), served over HTTP (HTTPS with TLS) at `/metrics` ([`serve`]) when the
//! process is given a metrics address (docs/protocol.md §10).
//!
//! Every name starts with `bitfold_` and ends in its unit (`_seconds`,
//! `_bytes`) or `_total` for a counter. Labels take a few fixed values (query
//! kind, outcome, method, plan kind) or a slave's name from the cluster file:
//! never a vid or a query's text.
//!
//! Totals another part of the process already keeps (the bytes a slave's
//! folds read, the bytes a process sent) are brought up to date when a
//! scrape renders the page, as are the gauges (store size, slaves up).

mod scrape;

pub(crate) use scrape::serve;

use bitfold_engine::store::{ImportStats, Snapshot};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};

use crate::bitfold_capnp::PlanKind;
use bitfold_proto::ErrorKind;

/// A label set of fixed names and values.
type Fixed<const N: usize> = [(&'static str, &'static str); N];

/// A label set naming one slave of the cluster file.
type PerSlave = [(&'static str, String); 1];

/// A label set naming one slave and a fixed value.
type PerSlaveAnd = [(&'static str, String); 2];

/// The `Content-Type` of the page: Prometheus text format 0.0.4.
const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// What a master counts.
pub(crate) struct MasterMetrics {
    registry: Registry,
    queries: Family<Fixed<2>, Counter>,
    latency: Family<Fixed<1>, Histogram, fn() -> Histogram>,
    retries: Counter,
    failed_machines: Counter,
    slave_up: Family<PerSlave, Gauge>,
    transitions: Family<PerSlaveAnd, Counter>,
    imported_vectors: Counter,
    imported_bytes: Counter,
    chain_machines: Histogram,
    plans: Family<Fixed<1>, Counter>,
    sent: Counter,
    updates: Family<Fixed<2>, Counter>,
    updated_vectors: Counter,
    /// Calls refused for the caller's role.
    pub(crate) forbidden: Forbidden,
}

impl MasterMetrics {
    /// The master's metrics, every one at zero.
    pub(crate) fn new() -> MasterMetrics {
        let mut r = Registry::with_prefix("bitfold_master");
        MasterMetrics {
            forbidden: Forbidden::new(&mut r),
            queries: add(
                &mut r,
                "queries",
                None,
                "Queries answered, by kind (point, range, unparsed) and outcome",
                Family::default(),
            ),
            latency: add(
                &mut r,
                "query_duration",
                Some(Unit::Seconds),
                "Time from a query's arrival to its answer or error, by kind",
                Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            ),
            retries: add(
                &mut r,
                "retries",
                None,
                "Attempts at a query after its first (each avoids the machines that failed)",
                Counter::default(),
            ),
            failed_machines: add(
                &mut r,
                "failed_machines",
                None,
                "Machines found failed during queries (reported by a coordinator, or the master's \
                 own call)",
                Counter::default(),
            ),
            slave_up: add(
                &mut r,
                "slave_up",
                None,
                "Whether queries may use the slave (1) or it is down (0)",
                Family::default(),
            ),
            transitions: add(
                &mut r,
                "slave_transitions",
                None,
                "Times a slave went up or down (label `to`)",
                Family::default(),
            ),
            imported_vectors: add(
                &mut r,
                "imported_vectors",
                None,
                "Vectors in import calls every owner stored",
                Counter::default(),
            ),
            imported_bytes: add(
                &mut r,
                "imported",
                Some(Unit::Bytes),
                "Bytes of vectors (their parts' data) in import calls every owner stored",
                Counter::default(),
            ),
            chain_machines: add(
                &mut r,
                "chain_machines",
                None,
                "Machines each term's chain visits, per attempt at a range query",
                Histogram::new([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0]),
            ),
            plans: add(
                &mut r,
                "plans",
                None,
                "Attempts at range queries by how the coordinator gathered the terms",
                Family::default(),
            ),
            sent: add(
                &mut r,
                "sent",
                Some(Unit::Bytes),
                "Bytes the master wrote to its connections",
                Counter::default(),
            ),
            updates: add(
                &mut r,
                "updates",
                None,
                "Updates (clear, delete) by kind and outcome (ok, or the error kind)",
                Family::default(),
            ),
            updated_vectors: add(
                &mut r,
                "updated_vectors",
                None,
                "Vectors that updates changed (lost a bit, or were deleted)",
                Counter::default(),
            ),
            registry: r,
        }
    }

    /// Counts an update of `kind` (`clear`, `delete`) that ended with
    /// `outcome`, having changed `vectors` vectors.
    pub(crate) fn updated(&self, kind: &'static str, outcome: Result<u64, ErrorKind>) {
        let label = outcome_label(outcome.map(|_| ()));
        self.updates
            .get_or_create(&[("kind", kind), ("outcome", label)])
            .inc();
        self.updated_vectors.inc_by(outcome.unwrap_or(0));
    }

    /// Counts a query of `kind` that ended with `outcome` after `seconds`.
    pub(crate) fn query(&self, kind: QueryKind, outcome: Result<(), ErrorKind>, seconds: f64) {
        let kind = kind.label();
        self.queries
            .get_or_create(&[("kind", kind), ("outcome", outcome_label(outcome))])
            .inc();
        self.latency
            .get_or_create(&[("kind", kind)])
            .observe(seconds);
    }

    /// Counts an attempt at a query after its first.
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// Counts `machines` an attempt found failed.
    pub(crate) fn failed_machines(&self, machines: usize) {
        self.failed_machines.inc_by(machines as u64);
    }

    /// Counts slave `name` going up (`up`) or down.
    pub(crate) fn transition(&self, name: &str, up: bool) {
        let to = if up { "up" } else { "down" };
        self.transitions
            .get_or_create(&[("slave", name.to_owned()), ("to", to.to_owned())])
            .inc();
    }

    /// Counts an import every owner stored: `vectors` vectors in `bytes`.
    pub(crate) fn imported(&self, vectors: u64, bytes: u64) {
        self.imported_vectors.inc_by(vectors);
        self.imported_bytes.inc_by(bytes);
    }

    /// Counts an attempt at a range query gathered by `kind`, whose chains
    /// visit the given numbers of machines.
    pub(crate) fn planned(&self, kind: PlanKind, machines_per_chain: impl Iterator<Item = usize>) {
        self.plans
            .get_or_create(&[("plan", plan_label(kind))])
            .inc();
        for machines in machines_per_chain {
            self.chain_machines.observe(machines as f64);
        }
    }

    /// The page: `slaves` is each slave's name and whether it is up, `sent`
    /// the bytes the master has sent in all.
    pub(crate) fn render<'a>(
        &self,
        slaves: impl Iterator<Item = (&'a str, bool)>,
        sent: u64,
    ) -> String {
        for (name, up) in slaves {
            self.slave_up
                .get_or_create(&[("slave", name.to_owned())])
                .set(i64::from(up));
        }
        catch_up(&self.sent, sent);
        encode(&self.registry)
    }
}

/// Calls refused because the caller's certificate does not allow them
/// (docs/protocol.md §11), by method and the caller's role.
pub(crate) struct Forbidden(Family<Fixed<2>, Counter>);

impl Forbidden {
    fn new(r: &mut Registry) -> Forbidden {
        Forbidden(add(
            r,
            "forbidden_calls",
            None,
            "Calls refused because the caller's certificate does not allow them, by method and \
             the caller's role",
            Family::default(),
        ))
    }

    /// Counts a refused call of `method` by a caller of `role`.
    pub(crate) fn count(&self, method: &'static str, role: &'static str) {
        self.0
            .get_or_create(&[("method", method), ("role", role)])
            .inc();
    }
}

/// What a slave counts.
pub(crate) struct SlaveMetrics {
    registry: Registry,
    requests: Family<Fixed<1>, Counter>,
    read: Counter,
    sent: Counter,
    imported_vectors: Counter,
    imported_bytes: Counter,
    merged_segments: Counter,
    store_bytes: Gauge,
    store_vectors: Gauge,
    store_segments: Gauge,
    /// Calls refused for the caller's role.
    pub(crate) forbidden: Forbidden,
}

impl SlaveMetrics {
    /// The slave's metrics, every one at zero.
    pub(crate) fn new() -> SlaveMetrics {
        let mut r = Registry::with_prefix("bitfold_slave");
        SlaveMetrics {
            forbidden: Forbidden::new(&mut r),
            requests: add(
                &mut r,
                "requests",
                None,
                "Calls received, by method (handle, coordinate, gather, fetch, import, health, \
                 catalog)",
                Family::default(),
            ),
            read: add(
                &mut r,
                "read",
                Some(Unit::Bytes),
                "Bytes of stored vectors the slave's folds read",
                Counter::default(),
            ),
            sent: add(
                &mut r,
                "sent",
                Some(Unit::Bytes),
                "Bytes the slave wrote to its connections (answers and chain hops)",
                Counter::default(),
            ),
            imported_vectors: add(
                &mut r,
                "imported_vectors",
                None,
                "Vectors stored by import calls",
                Counter::default(),
            ),
            imported_bytes: add(
                &mut r,
                "imported",
                Some(Unit::Bytes),
                "Bytes of segment files written by import calls",
                Counter::default(),
            ),
            merged_segments: add(
                &mut r,
                "merged_segments",
                None,
                "Segments merged into larger ones after imports (compaction)",
                Counter::default(),
            ),
            store_bytes: add(
                &mut r,
                "store",
                Some(Unit::Bytes),
                "Bytes of the store's segment files",
                Gauge::default(),
            ),
            store_vectors: add(
                &mut r,
                "store_vectors",
                None,
                "Vectors the store holds",
                Gauge::default(),
            ),
            store_segments: add(
                &mut r,
                "store_segments",
                None,
                "Segment files the store holds",
                Gauge::default(),
            ),
            registry: r,
        }
    }

    /// Counts a call of `method`.
    pub(crate) fn request(&self, method: &'static str) {
        self.requests.get_or_create(&[("method", method)]).inc();
    }

    /// Counts what an import stored.
    pub(crate) fn imported(&self, stats: &ImportStats) {
        self.imported_vectors.inc_by(stats.vectors);
        self.imported_bytes.inc_by(stats.bytes);
        self.merged_segments.inc_by(stats.merged_segments as u64);
    }

    /// The page: `read` and `sent` are the slave's totals so far, `store` its current snapshot.
    pub(crate) fn render(&self, read: u64, sent: u64, store: &Snapshot) -> String {
        catch_up(&self.read, read);
        catch_up(&self.sent, sent);
        self.store_bytes.set(gauge_value(store.byte_size()));
        self.store_vectors.set(gauge_value(store.vector_count()));
        self.store_segments
            .set(gauge_value(store.segment_count() as u64));
        encode(&self.registry)
    }
}

/// What a query asked for, as the master's metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueryKind {
    /// `P:vid`.
    Point,
    /// `R:...`.
    Range,
    /// A message that did not parse.
    Unparsed,
}

impl QueryKind {
    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            QueryKind::Point => "point",
            QueryKind::Range => "range",
            QueryKind::Unparsed => "unparsed",
        }
    }
}

/// The `plan` label: how a coordinator gathers, as the schema spells it.
pub(crate) fn plan_label(kind: PlanKind) -> &'static str {
    match kind {
        PlanKind::Chain => "chain",
        PlanKind::FanOut => "fanOut",
    }
}

/// The `outcome` label: `ok` or the error kind as the schema spells it.
pub(crate) fn outcome_label(outcome: Result<(), ErrorKind>) -> &'static str {
    match outcome {
        Ok(()) => "ok",
        Err(ErrorKind::BadQuery) => "badQuery",
        Err(ErrorKind::NotFound) => "notFound",
        Err(ErrorKind::Unavailable) => "unavailable",
        Err(ErrorKind::TooLarge) => "tooLarge",
        Err(ErrorKind::Internal) => "internal",
        Err(ErrorKind::Forbidden) => "forbidden",
        Err(ErrorKind::NotLeader) => "notLeader",
    }
}

/// Registers `metric` in `registry` as `name` (with `unit` appended) and returns it.
fn add<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    unit: Option<Unit>,
    help: &str,
    metric: M,
) -> M {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric.clone()),
        None => registry.register(name, help, metric.clone()),
    }
    metric
}

/// Query latencies: 100 µs to about 26 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// Raises `counter` to `total`, a total kept elsewhere that only grows.
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn encode(registry: &Registry) -> String {
    let mut page = String::new();
    prometheus_text::encode(&mut page, registry).expect("writing to a String cannot fail");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `line` starts with, in `page`.
    fn sample(page: &str, line: &str) -> Option<f64> {
        page.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn master_names_carry_the_prefix_and_the_unit() {
        let metrics = MasterMetrics::new();
        metrics.query(QueryKind::Range, Ok(()), 0.002);
        metrics.query(QueryKind::Range, Ok(()), 0.004);
        metrics.query(QueryKind::Point, Err(ErrorKind::NotFound), 0.001);
        metrics.retry();
        metrics.retry();
        metrics.failed_machines(2);
        metrics.imported(5, 4096);
        metrics.planned(PlanKind::Chain, [1, 3].into_iter());
        let page = metrics.render([("s0", true), ("s1", false)].into_iter(), 1234);
        let range_ok = r#"bitfold_master_queries_total{kind="range",outcome="ok"}"#;
        assert_eq!(sample(&page, range_ok), Some(2.0), "{page}");
        let not_found = r#"bitfold_master_queries_total{kind="point",outcome="notFound"}"#;
        assert_eq!(sample(&page, not_found), Some(1.0), "{page}");
        let latency = r#"bitfold_master_query_duration_seconds_count{kind="range"}"#;
        assert_eq!(sample(&page, latency), Some(2.0), "{page}");
        assert_eq!(sample(&page, "bitfold_master_retries_total"), Some(2.0));
        assert_eq!(
            sample(&page, "bitfold_master_failed_machines_total"),
            Some(2.0)
        );
        assert_eq!(
            sample(&page, "bitfold_master_imported_bytes_total"),
            Some(4096.0)
        );
        assert_eq!(
            sample(&page, r#"bitfold_master_slave_up{slave="s0"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&page, r#"bitfold_master_slave_up{slave="s1"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&page, "bitfold_master_chain_machines_count"),
            Some(2.0)
        );
        assert_eq!(
            sample(&page, r#"bitfold_master_plans_total{plan="chain"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&page, "bitfold_master_sent_bytes_total"),
            Some(1234.0)
        );
    }

    #[test]
    fn totals_kept_elsewhere_are_caught_up_not_added_twice() {
        let metrics = MasterMetrics::new();
        metrics.render(std::iter::empty(), 100);
        let page = metrics.render(std::iter::empty(), 250);
        assert_eq!(
            sample(&page, "bitfold_master_sent_bytes_total"),
            Some(250.0)
        );
    }

    #[test]
    fn slave_store_and_requests_are_on_the_page() {
        let store = bitfold_engine::store::Store::in_memory();
        let bits = bitfold_engine::VectorBuf::from_bits(vec![1, 5, 9]);
        let stats = store.import(&[(7, bits.as_part())]).unwrap();
        let metrics = SlaveMetrics::new();
        metrics.request("fetch");
        metrics.request("fetch");
        metrics.imported(&stats);
        let page = metrics.render(64, 128, &store.snapshot());
        let fetches = r#"bitfold_slave_requests_total{method="fetch"}"#;
        assert_eq!(sample(&page, fetches), Some(2.0), "{page}");
        assert_eq!(sample(&page, "bitfold_slave_read_bytes_total"), Some(64.0));
        assert_eq!(sample(&page, "bitfold_slave_sent_bytes_total"), Some(128.0));
        assert_eq!(
            sample(&page, "bitfold_slave_imported_vectors_total"),
            Some(1.0)
        );
        assert_eq!(sample(&page, "bitfold_slave_store_vectors"), Some(1.0));
        assert_eq!(sample(&page, "bitfold_slave_store_segments"), Some(1.0));
        let bytes = sample(&page, "bitfold_slave_store_bytes").unwrap();
        assert!(bytes > 0.0, "{page}");
        assert_eq!(
            sample(&page, "bitfold_slave_imported_bytes_total"),
            Some(bytes),
            "one import, no merge: the store is that one segment"
        );
    }
}
