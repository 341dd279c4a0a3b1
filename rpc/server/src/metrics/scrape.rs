//! The scrape endpoint: a minimal HTTP/1.0 responder for `GET /metrics`,
//! over TLS when the process runs TLS.
//!
//! One task accepts; each connection is its own task on the process's
//! event loop, reads at most [`MAX_REQUEST`] bytes of request head within
//! [`TIMEOUT`], answers once and closes. Rendering the page is a walk over
//! a few dozen counters, short next to any query. With TLS, a connection is
//! answered only once its client presented a certificate of the cluster's
//! CA (any role), as on every listener of the process (docs/protocol.md
//! §11); a refused one is logged at debug, so that a scanner (or a scraper
//! still on plain HTTP) does not flood the log.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::CONTENT_TYPE;
use crate::net;
use crate::tls::Tls;

/// The most bytes of request head read; a longer one is refused.
const MAX_REQUEST: usize = 8 << 10;

/// How long one scrape may take, reading the request and writing the page
/// (after the TLS handshake, which has a bound of its own).
const TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `listen` and answers `GET /metrics` there with `render()` from a
/// task on the current `LocalSet`, for as long as the process serves, over
/// TLS with `tls`; returns the bound address (`listen` may say port 0).
pub(crate) async fn serve(
    listen: &str,
    tls: Option<Tls>,
    render: impl Fn() -> String + 'static,
) -> Result<SocketAddr, crate::Error> {
    let bind_error = |cause| crate::Error::MetricsBind {
        addr: listen.to_owned(),
        cause,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    match &tls {
        None => tracing::info!("metrics served at http://{addr}/metrics"),
        Some(tls) => tracing::info!(
            "metrics served at https://{addr}/metrics to clients with a certificate of the CA \
             in {}",
            tls.ca().display()
        ),
    }
    tokio::task::spawn_local(accept(listener, tls, Rc::new(render)));
    Ok(addr)
}

async fn accept(listener: TcpListener, tls: Option<Tls>, render: Rc<dyn Fn() -> String>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let render = render.clone();
                let tls = tls.clone();
                tokio::task::spawn_local(async move {
                    match tls {
                        None => answer(stream, &*render).await,
                        Some(tls) => answer_tls(&tls, stream, peer, &*render).await,
                    }
                });
            }
            Err(err) => {
                tracing::warn!("the metrics endpoint could not accept a connection: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers `stream` once its TLS client is accepted.
async fn answer_tls(tls: &Tls, stream: TcpStream, peer: SocketAddr, render: &dyn Fn() -> String) {
    match net::accept_tls(tls, stream).await {
        Ok((stream, identity)) => {
            tracing::debug!(%peer, "a metrics scrape by {identity}");
            answer(stream, render).await;
        }
        Err(err) => tracing::debug!("refused a metrics scrape from {peer}: {err}"),
    }
}

/// Reads one request head and writes one response, within [`TIMEOUT`].
async fn answer(stream: impl AsyncRead + AsyncWrite + Unpin, render: &dyn Fn() -> String) {
    if tokio::time::timeout(TIMEOUT, answer_once(stream, render))
        .await
        .is_err()
    {
        tracing::debug!("a metrics scrape took longer than {TIMEOUT:?}; closed");
    }
}

async fn answer_once(mut stream: impl AsyncRead + AsyncWrite + Unpin, render: &dyn Fn() -> String) {
    let response = match read_head(&mut stream).await {
        Ok(head) => respond(&head, render),
        Err(Refused::TooLong) => response(
            "431 Request Header Fields Too Large",
            "the request head is longer than 8 KiB\n",
        ),
        Err(Refused::Closed) => return,
    };
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Why no request head was read.
enum Refused {
    /// It ran past [`MAX_REQUEST`].
    TooLong,
    /// The peer closed or the socket failed first.
    Closed,
}

async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> Result<String, Refused> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|_| Refused::Closed)?;
        if n == 0 {
            return Err(Refused::Closed);
        }
        head.extend_from_slice(&buf[..n]);
        let ended = |end: &[u8]| head.windows(end.len()).any(|w| w == end);
        if ended(b"\r\n\r\n") || ended(b"\n\n") {
            return Ok(String::from_utf8_lossy(&head).into_owned());
        }
        if head.len() > MAX_REQUEST {
            return Err(Refused::TooLong);
        }
    }
}

/// The response to the request whose head is `head`.
fn respond(head: &str, render: &dyn Fn() -> String) -> String {
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => response("200 OK", &render()),
        ("GET", _) => response("404 Not Found", "the metrics are at /metrics\n"),
        _ => response(
            "405 Method Not Allowed",
            "only GET /metrics is served here\n",
        ),
    }
}

fn response(status: &str, body: &str) -> String {
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `request` to a fresh endpoint serving `page` and returns the whole response.
    fn exchange(request: Vec<u8>) -> String {
        crate::net::block_on_local(async move {
            let addr = serve("127.0.0.1:0", None, || "page\n".to_owned())
                .await
                .unwrap();
            let mut stream = TcpStream::connect(addr).await.unwrap();
            // The peer may answer and close before all of a long request is written.
            let _ = stream.write_all(&request).await;
            let mut response = Vec::new();
            let _ = stream.read_to_end(&mut response).await;
            String::from_utf8(response).unwrap()
        })
        .unwrap()
    }

    #[test]
    fn get_metrics_is_the_page_and_other_requests_are_refused_plainly() {
        let ok = exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec());
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
        assert!(ok.ends_with("\r\n\r\npage\n"), "{ok}");
        let elsewhere = exchange(b"GET / HTTP/1.0\r\n\r\n".to_vec());
        assert!(elsewhere.starts_with("HTTP/1.0 404"), "{elsewhere}");
        let post = exchange(b"POST /metrics HTTP/1.0\r\n\r\n".to_vec());
        assert!(post.starts_with("HTTP/1.0 405"), "{post}");
    }

    #[test]
    fn a_request_head_without_end_is_refused_after_8_kib() {
        // One byte over: the endpoint has read all of it when it refuses.
        let refused = exchange(vec![b'a'; MAX_REQUEST + 1]);
        assert!(refused.starts_with("HTTP/1.0 431"), "{refused}");
    }

    #[test]
    fn a_taken_address_is_an_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = crate::net::block_on_local(serve(&addr, None, String::new))
            .unwrap()
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&addr) && message.contains("metrics"),
            "{message}"
        );
    }
}
