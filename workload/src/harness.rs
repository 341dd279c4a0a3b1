//! Runs a list of queries against one system from several client threads
//! and measures it: the same loop for every system compared, so that the
//! figures differ only by the system.
//!
//! Each thread opens its own connection, runs its share of the warm-up,
//! waits for the others, and then takes queries one by one from a shared
//! counter (query `n` of the run is `list[n % list.len()]`) until the run's
//! [`Limit`] is reached. Every answer is kept by list index, so that two
//! systems can be checked to agree on every query.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// After this many queries.
    Queries(u64),
    /// Once this much time has passed (queries in flight finish).
    Time(Duration),
}

/// How a run is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchSettings {
    /// Queries in flight at once: one thread and one connection each.
    pub concurrency: usize,
    /// Unmeasured queries first (shared between the threads).
    pub warmup: u64,
    /// When the measured part stops.
    pub limit: Limit,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Queries answered in the measured part.
    pub queries: u64,
    /// From the start of the measured part to its last answer.
    pub elapsed: Duration,
    /// Every measured query's latency, ascending.
    pub latencies: Vec<Duration>,
    /// The answer to each query of the list that ran (warm-up included);
    /// the first one where a query ran more than once.
    pub answers: Vec<Option<u64>>,
    /// List indexes of queries that ran more than once and were answered
    /// differently: a system that does this is broken.
    pub inconsistent: Vec<usize>,
    /// Bytes the measured queries had to read (as the caller weighs them).
    pub bytes: u64,
    /// Bytes of the measured queries' answers.
    pub answer_bytes: u64,
    /// CPU time the client threads used, from connecting to their last
    /// answer (warm-up included): the caller's side of every query.
    pub client_cpu: Duration,
}

impl Measured {
    /// Queries per second.
    pub fn rate(&self) -> f64 {
        self.queries as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes per second of what the queries had to read.
    pub fn byte_rate(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes per second of answers.
    pub fn answer_rate(&self) -> f64 {
        self.answer_bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The latency below which `percent`% of the queries answered (nearest rank).
    pub fn percentile(&self, percent: f64) -> Duration {
        percentile(&self.latencies, percent)
    }
}

/// The nearest-rank percentile of ascending `sorted` values (zero for none).
pub fn percentile(sorted: &[Duration], percent: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (percent / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One answer: a number that must be the same every time the same query
/// is asked (a count), and the bytes the answer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The count (or another number fixed by the query).
    pub answer: u64,
    /// Bytes of the answer as it arrived (0 for a count).
    pub bytes: u64,
}

/// Runs a benchmark made as `settings` says over a list of `list` queries. `connect` opens one thread's
/// connection; `ask(connection, i)` answers list query `i`; `weigh(i)` is
/// the bytes query `i` must read; `progress(n)` is told how many measured
/// queries have finished. The first error stops every thread and is returned.
pub fn run<C, E>(
    list: usize,
    settings: BenchSettings,
    connect: impl Fn() -> Result<C, E> + Sync,
    ask: impl Fn(&mut C, usize) -> Result<Reply, E> + Sync,
    weigh: impl Fn(usize) -> u64 + Sync,
    progress: impl Fn(u64) + Sync,
) -> Result<Measured, E>
where
    E: Send,
{
    assert!(list > 0, "a run needs at least one query");
    let threads = settings.concurrency.max(1);
    let next = AtomicU64::new(settings.warmup);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let start_line = Barrier::new(threads);
    let started = Mutex::new(None::<Instant>);
    let outcomes: Vec<Result<Thread, E>> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (next, done, failed) = (&next, &done, &failed);
                let (start_line, started) = (&start_line, &started);
                let (connect, ask, weigh, progress) = (&connect, &ask, &weigh, &progress);
                scope.spawn(move || {
                    let cpu_at_start = thread_cpu();
                    let mut seen = Thread::default();
                    let outcome = (|| {
                        let mut connection = connect()?;
                        // Warm-up query n goes to thread n % threads.
                        for n in (t as u64..settings.warmup).step_by(threads) {
                            let i = (n % list as u64) as usize;
                            seen.answers.push((i, ask(&mut connection, i)?.answer));
                        }
                        Ok(connection)
                    })();
                    if outcome.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    // Every thread reaches the line, even one that failed, so none waits forever.
                    start_line.wait();
                    let mut connection = outcome?;
                    let start = *started
                        .lock()
                        .expect("no thread panics holding the clock")
                        .get_or_insert_with(Instant::now);
                    let mut finished = start;
                    while !failed.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let within = match settings.limit {
                            Limit::Queries(count) => n < settings.warmup + count,
                            Limit::Time(time) => start.elapsed() < time,
                        };
                        if !within {
                            break;
                        }
                        let i = (n % list as u64) as usize;
                        let asked = Instant::now();
                        let reply = match ask(&mut connection, i) {
                            Ok(reply) => reply,
                            Err(err) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(err);
                            }
                        };
                        finished = Instant::now();
                        seen.latencies.push(finished - asked);
                        seen.answers.push((i, reply.answer));
                        seen.bytes += weigh(i);
                        seen.answer_bytes += reply.bytes;
                        progress(done.fetch_add(1, Ordering::Relaxed) + 1);
                    }
                    seen.elapsed = finished - start;
                    seen.cpu = thread_cpu().saturating_sub(cpu_at_start);
                    Ok(seen)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a benchmark thread panicked"))
            .collect()
    });
    let mut measured = Measured {
        queries: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
        answers: vec![None; list],
        inconsistent: Vec::new(),
        bytes: 0,
        answer_bytes: 0,
        client_cpu: Duration::ZERO,
    };
    for outcome in outcomes {
        let seen = outcome?;
        measured.queries += seen.latencies.len() as u64;
        measured.elapsed = measured.elapsed.max(seen.elapsed);
        measured.latencies.extend(seen.latencies);
        measured.bytes += seen.bytes;
        measured.answer_bytes += seen.answer_bytes;
        measured.client_cpu += seen.cpu;
        for (i, answer) in seen.answers {
            match measured.answers[i] {
                None => measured.answers[i] = Some(answer),
                Some(first) if first != answer => measured.inconsistent.push(i),
                Some(_) => {}
            }
        }
    }
    measured.latencies.sort_unstable();
    measured.inconsistent.sort_unstable();
    measured.inconsistent.dedup();
    Ok(measured)
}

/// CPU time this process has used so far, all threads, user and system:
/// for a system running in this process, a measure of its work that the
/// machine's other load disturbs far less than queries/s.
pub fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` where it is pointed, and
    // RUSAGE_SELF is always a valid target.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return Duration::ZERO;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time the calling thread has used so far, user and system.
pub fn thread_cpu() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `timespec` where it is pointed;
    // CLOCK_THREAD_CPUTIME_ID is always a valid clock for the caller.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// What one thread saw.
#[derive(Default)]
struct Thread {
    latencies: Vec<Duration>,
    answers: Vec<(usize, u64)>,
    bytes: u64,
    answer_bytes: u64,
    elapsed: Duration,
    cpu: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(answer: u64) -> Reply {
        Reply { answer, bytes: 0 }
    }

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(process_cpu() > before);
    }

    /// Spins until this thread has used `cpu` more CPU time.
    fn burn(cpu: Duration) {
        let until = thread_cpu() + cpu;
        let mut x = 0u64;
        while thread_cpu() < until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }

    #[test]
    fn client_cpu_is_the_client_threads_own() {
        let settings = BenchSettings {
            concurrency: 2,
            warmup: 1,
            limit: Limit::Queries(3),
        };
        let measured = run(
            2,
            settings,
            || Ok::<_, String>(()),
            |_, _| {
                burn(Duration::from_millis(5));
                // Work another thread does for the client is not the client's.
                thread::spawn(|| burn(Duration::from_millis(60)))
                    .join()
                    .expect("the helper does not panic");
                Ok(reply(1))
            },
            |_| 0,
            |_| {},
        )
        .unwrap();
        assert_eq!(measured.queries, 3);
        assert!(
            measured.client_cpu >= Duration::from_millis(20),
            "{measured:?}"
        );
        assert!(
            measured.client_cpu < Duration::from_millis(60),
            "{measured:?}"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 95.0), Duration::from_millis(95));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sorted, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&sorted, 0.0), Duration::from_millis(1));
        let few = ms(&[3, 7, 20]);
        assert_eq!(percentile(&few, 50.0), Duration::from_millis(7));
        assert_eq!(percentile(&few, 99.0), Duration::from_millis(20));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn a_run_asks_each_query_and_keeps_its_answer() {
        let asked = Mutex::new(Vec::new());
        let settings = BenchSettings {
            concurrency: 3,
            warmup: 4,
            limit: Limit::Queries(25),
        };
        let measured = run(
            10,
            settings,
            || Ok::<_, String>(()),
            |_, i| {
                asked.lock().unwrap().push(i);
                Ok(Reply {
                    answer: i as u64 * 2,
                    bytes: 1,
                })
            },
            |i| i as u64,
            |_| {},
        )
        .unwrap();
        assert_eq!(measured.queries, 25);
        assert_eq!(measured.latencies.len(), 25);
        assert!(measured.latencies.windows(2).all(|w| w[0] <= w[1]));
        let mut asked = asked.into_inner().unwrap();
        asked.sort_unstable();
        // 29 queries in all, list index n % 10: 0..=8 three times, 9 twice.
        let expected: Vec<usize> = {
            let mut v: Vec<usize> = (0..29).map(|n| n % 10).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(asked, expected);
        assert_eq!(
            measured.answers,
            (0..10).map(|i| Some(i as u64 * 2)).collect::<Vec<_>>()
        );
        assert!(measured.inconsistent.is_empty());
        // Measured queries are n = 4..29: list indexes 4..=9, 0..=9, 0..=8.
        let weighed: u64 = (4..29).map(|n| n % 10).sum();
        assert_eq!(measured.bytes, weighed);
        assert_eq!(
            measured.answer_bytes, 25,
            "the warm-up's answers are not counted"
        );
    }

    #[test]
    fn a_timed_run_stops() {
        let settings = BenchSettings {
            concurrency: 2,
            warmup: 0,
            limit: Limit::Time(Duration::from_millis(30)),
        };
        let measured = run(
            3,
            settings,
            || Ok::<_, String>(()),
            |_, _| {
                thread::sleep(Duration::from_millis(1));
                Ok(reply(1))
            },
            |_| 0,
            |_| {},
        )
        .unwrap();
        assert!(measured.queries >= 2, "{} queries", measured.queries);
        assert!(measured.elapsed >= Duration::from_millis(25));
    }

    #[test]
    fn different_answers_to_the_same_query_are_caught() {
        let calls = AtomicU64::new(0);
        let settings = BenchSettings {
            concurrency: 1,
            warmup: 0,
            limit: Limit::Queries(4),
        };
        let measured = run(
            2,
            settings,
            || Ok::<_, String>(()),
            |_, i| {
                Ok(reply(if i == 1 {
                    calls.fetch_add(1, Ordering::Relaxed)
                } else {
                    9
                }))
            },
            |_| 0,
            |_| {},
        )
        .unwrap();
        assert_eq!(measured.answers, vec![Some(9), Some(0)]);
        assert_eq!(measured.inconsistent, vec![1]);
    }

    #[test]
    fn the_first_error_stops_the_run() {
        let settings = BenchSettings {
            concurrency: 2,
            warmup: 0,
            limit: Limit::Queries(1_000_000),
        };
        let asked = AtomicU64::new(0);
        let outcome = run(
            5,
            settings,
            || Ok(()),
            |_, i| {
                asked.fetch_add(1, Ordering::Relaxed);
                if i == 3 {
                    Err(format!("query {i} failed"))
                } else {
                    Ok(reply(0))
                }
            },
            |_| 0,
            |_| {},
        );
        assert_eq!(outcome.unwrap_err(), "query 3 failed");
        assert!(asked.load(Ordering::Relaxed) < 100);
        let refused = run(
            5,
            settings,
            || Err::<(), _>("cannot connect".to_string()),
            |_, _| Ok(reply(0)),
            |_| 0,
            |_| {},
        );
        assert_eq!(refused.unwrap_err(), "cannot connect");
    }
}
