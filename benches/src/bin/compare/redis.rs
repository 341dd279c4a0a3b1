//! Redis as the comparison uses it: a `redis-server` started on a free
//! loopback port (and killed with the comparison, even when it fails or is
//! interrupted), and a minimal RESP client that pipelines.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bitfold_workload::dataset::Query;
use bitfold_workload::harness::Reply;

/// A `redis-server` child process, killed when dropped.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// What `redis-server --version` says.
    pub version: String,
}

impl Server {
    /// Starts `program` on a free loopback port with persistence off, and
    /// waits until it answers `PING`.
    pub fn start(program: &str) -> anyhow::Result<Server> {
        let version = Command::new(program)
            .arg("--version")
            .output()
            .with_context(|| {
                format!("cannot run {program}: install Redis (scripts/setup does) or pass --redis-server")
            })?;
        let version = String::from_utf8_lossy(&version.stdout)
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("?")
            .to_owned();
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new(program);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl only asks the kernel to SIGKILL the child when this
        // process's main thread ends; it touches no memory of this process.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        let mut server = Server {
            child,
            addr: format!("127.0.0.1:{port}"),
            version,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server exited at start ({status}): is port {} taken?",
                    self.addr
                );
            }
            if let Ok(mut redis) = Redis::connect(&self.addr) {
                redis.send(&[b"PING"])?;
                redis.flush()?;
                if redis.read()? == Value::Simple("PONG".into()) {
                    return Ok(());
                }
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("redis-server on {} did not answer within 10 s", self.addr);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU time the server has used so far (`INFO cpu`: user + system).
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        let mut redis = Redis::connect(&self.addr)?;
        redis.send(&[b"INFO", b"cpu"])?;
        redis.flush()?;
        let Value::Bulk(info) = redis.read()? else {
            bail!("INFO cpu answered something else than a bulk string");
        };
        let text = String::from_utf8_lossy(&info);
        let field = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Ok(Duration::from_secs_f64(
            field("used_cpu_user") + field("used_cpu_sys"),
        ))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One RESP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK`.
    Simple(String),
    /// `:42`.
    Integer(i64),
    /// `$n` followed by n bytes (a nil bulk string reads as empty).
    Bulk(Vec<u8>),
    /// `-ERR ...`.
    Error(String),
}

/// A connection that writes commands into a buffer (`send`), sends them all
/// at once (`flush`) and reads the replies in order (`read`): pipelining.
pub struct Redis {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Redis {
    /// Connects with `TCP_NODELAY`.
    pub fn connect(addr: &str) -> io::Result<Redis> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Redis {
            reader: BufReader::with_capacity(1 << 16, stream.try_clone()?),
            writer: BufWriter::with_capacity(1 << 16, stream),
        })
    }

    /// Buffers one command.
    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        write!(self.writer, "*{}\r\n", args.len())?;
        for arg in args {
            write!(self.writer, "${}\r\n", arg.len())?;
            self.writer.write_all(arg)?;
            self.writer.write_all(b"\r\n")?;
        }
        Ok(())
    }

    /// Sends every buffered command.
    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Reads the next reply.
    pub fn read(&mut self) -> io::Result<Value> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        let malformed =
            |what: &str| io::Error::other(format!("malformed reply from Redis: {what}"));
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "Redis closed the connection",
            ));
        }
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        Ok(match line[0] {
            b'+' => Value::Simple(text),
            b'-' => Value::Error(text),
            b':' => Value::Integer(text.parse().map_err(|_| malformed(&text))?),
            b'$' => {
                let len: i64 = text.parse().map_err(|_| malformed(&text))?;
                let Ok(len) = usize::try_from(len) else {
                    return Ok(Value::Bulk(Vec::new()));
                };
                let mut bytes = vec![0; len + 2];
                self.reader.read_exact(&mut bytes)?;
                bytes.truncate(len);
                Value::Bulk(bytes)
            }
            _ => return Err(malformed(&text)),
        })
    }

    /// Reads `n` replies and returns the last; an error reply fails.
    pub fn read_replies(&mut self, n: usize) -> anyhow::Result<Value> {
        let mut last = Value::Simple(String::new());
        for _ in 0..n {
            last = self.read()?;
            if let Value::Error(message) = &last {
                bail!("Redis answered an error: {message}");
            }
        }
        Ok(last)
    }
}

/// The Redis key of vector `vid`.
pub fn key(vid: u64) -> String {
    format!("v{vid}")
}

/// Redis's most keys per `BITOP` on its fast path.
const REDIS_FAST_KEYS: usize = 16;

/// One query in Redis, pipelined: per term, `BITOP OR` of at most 16 keys
/// at a time, then of the groups (again by 16); `BITOP AND` of the terms;
/// `BITCOUNT`. Scratch keys are the connection's own.
pub fn count(
    connection: &mut Redis,
    prefix: &str,
    vids: &[u64],
    query: &Query,
) -> anyhow::Result<Reply> {
    let mut commands = 0;
    let mut terms = Vec::with_capacity(query.terms.len());
    for (t, term) in query.terms.iter().enumerate() {
        let mut keys: Vec<String> = term.clone().map(|i| key(vids[i])).collect();
        let mut level = 0;
        while keys.len() > 1 {
            let mut next = Vec::new();
            for (g, group) in keys.chunks(REDIS_FAST_KEYS).enumerate() {
                let dest = format!("{prefix}:{t}:{level}:{g}");
                let mut command: Vec<&[u8]> = vec![b"BITOP", b"OR", dest.as_bytes()];
                command.extend(group.iter().map(|k| k.as_bytes()));
                connection.send(&command)?;
                commands += 1;
                next.push(dest);
            }
            keys = next;
            level += 1;
        }
        terms.push(keys.pop().expect("a term names at least one vid"));
    }
    let result = format!("{prefix}:and");
    let mut command: Vec<&[u8]> = vec![b"BITOP", b"AND", result.as_bytes()];
    command.extend(terms.iter().map(|k| k.as_bytes()));
    connection.send(&command)?;
    connection.send(&[b"BITCOUNT", result.as_bytes()])?;
    connection.flush()?;
    match connection.read_replies(commands + 2)? {
        Value::Integer(count) => Ok(Reply {
            answer: u64::try_from(count)?,
            bytes: 0,
        }),
        other => bail!("BITCOUNT answered {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_written_in_resp() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let peer = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut got = vec![0; 28];
            stream.read_exact(&mut got).unwrap();
            stream
                .write_all(b"+OK\r\n:42\r\n$3\r\nab\n\r\n$-1\r\n-ERR no\r\n")
                .unwrap();
            got
        });
        let mut redis = Redis::connect(&addr).unwrap();
        redis.send(&[b"SET", b"k", b"v\r"]).unwrap();
        redis.flush().unwrap();
        assert_eq!(redis.read().unwrap(), Value::Simple("OK".into()));
        assert_eq!(redis.read().unwrap(), Value::Integer(42));
        assert_eq!(redis.read().unwrap(), Value::Bulk(b"ab\n".to_vec()));
        assert_eq!(redis.read().unwrap(), Value::Bulk(Vec::new()));
        assert_eq!(redis.read().unwrap(), Value::Error("ERR no".into()));
        assert_eq!(
            peer.join().unwrap(),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv\r\r\n".to_vec()
        );
    }
}
