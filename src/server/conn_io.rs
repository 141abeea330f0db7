//! A connection's byte stream, as hyper sees it and after hyper is done
//! with it: every answer a client can get carries a CNI error body, and
//! no client is reset while it is still sending.
//!
//! - hyper answers a request it cannot parse (a bad request line or
//!   header, a bad `Content-Length`, an unknown HTTP version) itself, with
//!   an empty body. [`ConnIo`] replaces that answer, the only thing hyper
//!   writes before a request head has reached the service, by the same
//!   status with a CNI error.
//! - Closing a unix socket with unread bytes in it resets the peer: a
//!   client still sending its body (refused early) or its request (its
//!   connection evicted) would get `ECONNRESET`/`EPIPE` and never read
//!   the answer waiting for it. [`linger`] shuts the write side after the
//!   answer and reads and discards what the client still sends, for a
//!   bounded time and size, before closing.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;

use super::idle::Ticket;
use crate::api::{code, CniError};

/// Longest a closing connection reads what its client still sends.
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// Most bytes a closing connection reads and discards.
pub const LINGER_BYTES: usize = 4 << 20;
/// The reads of a lingering client that keeps sending, at most.
const LINGER_CHUNK: usize = 16 << 10;

/// The stream hyper serves, with hyper's own error answers replaced.
pub struct ConnIo {
    stream: UnixStream,
    /// Whether a request head reached the service (from then on, what
    /// hyper writes is the service's answer).
    ticket: Arc<Ticket>,
    /// The replacement answer and how much of it is written.
    replaced: Option<(Vec<u8>, usize)>,
}

impl ConnIo {
    pub fn new(stream: UnixStream, ticket: Arc<Ticket>) -> Self {
        Self {
            stream,
            ticket,
            replaced: None,
        }
    }

    pub fn into_stream(self) -> UnixStream {
        self.stream
    }

    /// Writes what is left of the replacement answer.
    fn poll_replaced(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.replaced {
            if *done == bytes.len() {
                break;
            }
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replaced.is_some() {
            // Nothing follows hyper's error answer; it is dropped.
            ready!(this.poll_replaced(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        if !this.ticket.is_busy() {
            if let Some(answer) = with_cni_error(buf) {
                this.replaced = Some((answer, 0));
                // Taken whole; flush and shutdown write what is left.
                let _ = this.poll_replaced(cx)?;
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replaced(cx))?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replaced(cx))?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// `answer` (hyper's own, written before any request head reached the
/// service) with its status kept and a CNI error body; `None` when it is
/// not an HTTP response.
fn with_cni_error(answer: &[u8]) -> Option<Vec<u8>> {
    let end = answer.windows(2).position(|w| w == b"\r\n")?;
    let status_line = std::str::from_utf8(&answer[..end]).ok()?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().filter(|v| v.starts_with("HTTP/1."))?;
    let status: u16 = parts.next()?.parse().ok()?;
    let reason = parts.next().unwrap_or("");
    let msg = match status {
        400 => "the request is not valid HTTP/1.1: its request line, a header or its \
                Content-Length / Transfer-Encoding could not be parsed"
            .to_string(),
        431 => "the request's header is too large".to_string(),
        505 => "the request's HTTP version is not supported; use HTTP/1.1".to_string(),
        s => format!("the request could not be served: HTTP {s} {reason}"),
    };
    let body = CniError::new(code::DECODING_FAILURE, msg).to_json();
    let mut out = format!(
        "{version} {status} {reason}\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

/// Whether nothing the client sent waits unread in `stream` (closing a unix
/// socket with unread bytes resets the peer's connection).
pub fn nothing_unread(stream: &UnixStream) -> bool {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD on a socket we own writes one int into `queued`.
    let r = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut queued) };
    r == 0 && queued == 0
}

/// Closes `stream` gracefully once its answer is written: shuts the write
/// side (the client reads the answer, then end of file), then reads and
/// discards what the client still sends until it closes, for at most
/// [`LINGER_TIME`] and [`LINGER_BYTES`]; with `places`, only when one of
/// them is free. A served connection lingers in its own slot; an evicted
/// one has given its slot up and needs a place (as many as the connection
/// cap, whose descriptors are reserved for it). A client that has read
/// its answer and closed costs one read.
pub async fn linger(mut stream: UnixStream, places: Option<&Arc<Semaphore>>) {
    let _ = stream.shutdown().await;
    let _place = match places.map(|p| p.clone().try_acquire_owned()) {
        None => None,
        Some(Ok(place)) => Some(place),
        Some(Err(_)) => return,
    };
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    // On the heap, and small until the client sends more than its end of
    // file: an array here would sit in every connection's task from its
    // accept on, idle or queued ones included.
    let mut scratch = vec![0u8; 64];
    let mut discarded = 0usize;
    while discarded <= LINGER_BYTES {
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
        match stream.try_read(&mut scratch) {
            Ok(0) => return,
            Ok(n) => {
                discarded += n;
                if n == scratch.len() && scratch.len() < LINGER_CHUNK {
                    scratch.resize(LINGER_CHUNK, 0);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_400_should_get_a_cni_error() {
        let hyper = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let out = String::from_utf8(with_cni_error(hyper).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], code::DECODING_FAILURE);
        assert!(v["msg"].as_str().unwrap().contains("not valid HTTP"));
        // HTTP/1.0 and other statuses keep theirs.
        let out = with_cni_error(b"HTTP/1.0 505 HTTP Version Not Supported\r\n\r\n").unwrap();
        assert!(out.starts_with(b"HTTP/1.0 505 HTTP Version Not Supported\r\n"));
        assert!(with_cni_error(b"garbage").is_none());
        assert!(with_cni_error(b"SPDY/3 400 x\r\n").is_none());
    }

    /// Every connection's task holds this future from its accept on
    /// (inlined in the task's state): no buffer may sit in it.
    #[tokio::test]
    async fn lingering_should_hold_no_buffer_in_the_connection_task() {
        let (a, b) = UnixStream::pair().unwrap();
        let waiting = linger(a, None);
        let size = std::mem::size_of_val(&waiting);
        assert!(size < 1024, "the linger future is {size} bytes");
        // And it still reads a client that keeps sending, up to its end.
        let sender = tokio::spawn(async move {
            let mut b = b;
            let chunk = vec![7u8; 100 << 10];
            let _ = tokio::io::AsyncWriteExt::write_all(&mut b, &chunk).await;
        });
        waiting.await;
        sender.await.unwrap();
    }
}
