//! The scrape endpoint: a minimal HTTP/1.0 responder for `GET /metrics`.
//!
//! One task accepts; each connection is its own task on the process's
//! event loop, reads at most [`MAX_REQUEST`] bytes of request head within
//! [`TIMEOUT`], answers once and closes. Rendering the page is a walk over
//! a few dozen counters, short next to any query.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::CONTENT_TYPE;

/// The most bytes of request head read; a longer one is refused.
const MAX_REQUEST: usize = 8 << 10;

/// How long one scrape may take, reading the request and writing the page.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `listen` and answers `GET /metrics` there with `render()` from a
/// task on the current `LocalSet`, for as long as the process serves;
/// returns the bound address (`listen` may say port 0).
pub(crate) async fn serve(
    listen: &str,
    render: impl Fn() -> String + 'static,
) -> Result<SocketAddr, crate::Error> {
    let bind_error = |cause| crate::Error::MetricsBind {
        addr: listen.to_owned(),
        cause,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    tracing::info!("metrics served at http://{addr}/metrics");
    tokio::task::spawn_local(accept(listener, Rc::new(render)));
    Ok(addr)
}

async fn accept(listener: TcpListener, render: Rc<dyn Fn() -> String>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let render = render.clone();
                tokio::task::spawn_local(async move {
                    if tokio::time::timeout(TIMEOUT, answer(stream, &*render))
                        .await
                        .is_err()
                    {
                        tracing::debug!("a metrics scrape took longer than {TIMEOUT:?}; closed");
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

/// Reads one request head and writes one response.
async fn answer(mut stream: TcpStream, render: &dyn Fn() -> String) {
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

async fn read_head(stream: &mut TcpStream) -> Result<String, Refused> {
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
            let addr = serve("127.0.0.1:0", || "page\n".to_owned()).await.unwrap();
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
        let err = crate::net::block_on_local(serve(&addr, String::new))
            .unwrap()
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&addr) && message.contains("metrics"),
            "{message}"
        );
    }
}
