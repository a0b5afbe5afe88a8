//! The gateway's listener: TCP connections with `TCP_NODELAY`, on which hyper's own refusals of a request it
//! cannot parse (a URL or a head too large for it, a malformed request line or header) are given OpenAI's error
//! shape instead of an empty body.
//!
//! hyper answers those requests itself, before any service sees them: `414` for a URL longer than 65,534 bytes
//! (the `http` crate's `Uri` cannot hold more), `431` for a head over its buffer (about 400 KiB) or with more
//! than [`crate::api::MAX_HEADERS`] headers, `400` for what is not HTTP/1.1. It writes only a head
//! (`connection: close`, `content-length: 0`), then closes, and has no hook for a body. The connection's writer
//! recognises exactly that head (no answer of the router is bodiless and closing) and sends, in its place, the
//! same head with a JSON body. Every smaller URL or head reaches the router, whose limits answer in the same
//! shape.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::api::error::ApiError;

/// The header hyper writes for an answer without a body; the shaped answer replaces it.
const EMPTY_BODY: &[u8] = b"content-length: 0\r\n";

/// The header of an answer after which hyper closes the connection, as it does after a refusal.
const CLOSING: &[u8] = b"connection: close\r\n";

/// Accepts the gateway's connections.
pub struct GatewayListener {
    inner: TcpListener,
}

impl GatewayListener {
    pub fn new(inner: TcpListener) -> GatewayListener {
        GatewayListener { inner }
    }
}

impl axum::serve::Listener for GatewayListener {
    type Io = ShapedRefusals<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, address) = axum::serve::Listener::accept(&mut self.inner).await;
        // Streams write small frames: without TCP_NODELAY the first event after the head waits for a delayed
        // ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        (ShapedRefusals::new(tcp), address)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection whose bare `414` and `431` heads from hyper go out with an OpenAI-shaped body.
pub struct ShapedRefusals<T> {
    inner: T,
    /// The shaped answer, and how much of it is written, once hyper wrote a refusal.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> ShapedRefusals<T> {
    pub fn new(inner: T) -> ShapedRefusals<T> {
        ShapedRefusals {
            inner,
            pending: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> ShapedRefusals<T> {
    /// Writes what is left of a shaped answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, written)) = &mut self.pending {
            if *written == answer.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `head` in place of the shaped answer when it is one of hyper's refusals.
    fn shape(&mut self, cx: &mut Context<'_>, head: &[u8]) -> Option<Poll<io::Result<usize>>> {
        let answer = shaped(head)?;
        self.pending = Some((answer, 0));
        // Written now as far as the socket takes it; the rest on the flush hyper makes next.
        Some(match self.poll_pending(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(head.len())),
        })
    }
}

/// Where `header` is in `head`.
fn find(head: &[u8], header: &[u8]) -> Option<usize> {
    head.windows(header.len())
        .position(|window| window == header)
}

/// The shaped answer in place of `head`, when `head` is a whole bodiless, closing `400`, `414` or `431`, as
/// hyper writes its refusals.
fn shaped(head: &[u8]) -> Option<Vec<u8>> {
    let error = if head.starts_with(b"HTTP/1.1 414 ") {
        ApiError::url_too_long(None)
    } else if head.starts_with(b"HTTP/1.1 431 ") {
        ApiError::headers_too_large(None)
    } else if head.starts_with(b"HTTP/1.1 400 ") {
        ApiError::invalid(
            "The request is not valid HTTP/1.1: its request line or a header could not be parsed.",
            None,
            Some("invalid_http_request"),
        )
    } else {
        return None;
    };
    if !head.ends_with(b"\r\n\r\n") || find(head, CLOSING).is_none() {
        return None;
    }
    let at = find(head, EMPTY_BODY)?;
    tracing::info!(
        status = error.status.as_u16(),
        code = error.code.as_deref().unwrap_or(""),
        "request refused before it was read"
    );
    let body = error.body().to_string();
    let mut answer = Vec::with_capacity(head.len() + body.len() + 64);
    answer.extend_from_slice(&head[..at]);
    answer.extend_from_slice(b"content-type: application/json\r\n");
    answer.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    answer.extend_from_slice(b"x-should-retry: false\r\n");
    answer.extend_from_slice(&head[at + EMPTY_BODY.len()..]);
    answer.extend_from_slice(body.as_bytes());
    Some(answer)
}

impl<T: AsyncRead + Unpin> AsyncRead for ShapedRefusals<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ShapedRefusals<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(shaped) = self.shape(cx, buf) {
            return shaped;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        // hyper writes a head in a buffer of its own, first; a refusal has nothing after it.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if let Some(shaped) = self.shape(cx, first) {
                return shaped;
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::shaped;
    use serde_json::Value;

    fn split(answer: &[u8]) -> (String, Value) {
        let text = String::from_utf8(answer.to_vec()).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        (
            head.to_owned(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }

    #[test]
    fn hyper_refusals_get_a_json_body_of_the_length_they_announce() {
        let cases = [
            ("HTTP/1.1 414 URI Too Long", "url_too_long"),
            (
                "HTTP/1.1 431 Request Header Fields Too Large",
                "headers_too_large",
            ),
            ("HTTP/1.1 400 Bad Request", "invalid_http_request"),
        ];
        for (status, code) in cases {
            let head = format!("{status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 25 Nov 2026 00:16:37 GMT\r\n\r\n");
            let answer = shaped(head.as_bytes()).unwrap_or_default();
            let (head, body) = split(&answer);

            assert!(head.starts_with(status), "{head}");
            assert!(head.contains("connection: close"), "{head}");
            assert!(head.contains("content-type: application/json"), "{head}");
            let length = body.to_string().len();
            assert!(
                head.contains(&format!("content-length: {length}\r\n")),
                "{head}"
            );
            assert_eq!(body["error"]["code"], code);
            assert_eq!(body["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn other_writes_pass_unchanged() {
        let cases: [&[u8]; 6] = [
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            // A 414 with a body of its own: the router's, already shaped.
            b"HTTP/1.1 414 URI Too Long\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n",
            // Bodiless but keeping the connection: not a refusal of hyper's.
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            // Part of a head only.
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n",
            b"data: {\"type\":\"response.created\"}\n\n",
        ];
        for case in cases {
            assert!(shaped(case).is_none(), "{}", String::from_utf8_lossy(case));
        }
    }
}
