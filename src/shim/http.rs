//! The minimal HTTP/1.1 response reader: one answer from the daemon, read
//! from a blocking [`UnixStream`] within a deadline. The head and chunk
//! sizes are parsed by `httparse`; the body is framed by Content-Length,
//! chunked encoding, or the end of the connection.
//!
//! It reads answers only: the request is written by the client, and what
//! an answer means for the CNI call is the front end's business.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Longest response head read before the answer counts as garbage.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest response body read before the answer counts as garbage.
const MAX_RESPONSE_BODY_BYTES: usize = 4 << 20;

/// The time left until `deadline`; `None` once it has passed.
pub(super) fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// A parsed HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) reason: String,
    pub(super) body: Vec<u8>,
}

/// Why no response could be read.
#[derive(Debug)]
pub(super) enum Error {
    /// The deadline passed.
    TimedOut,
    /// The daemon closed the connection before a complete response.
    Closed(String),
    /// The connection failed (e.g. reset).
    Io(io::Error),
    /// What arrived is not an HTTP response we can use.
    Garbage(String),
}

/// How the body of a response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Headers a daemon answer may carry; more is garbage.
const MAX_HEADERS: usize = 32;

/// Reads one response: the head, then a body framed by Content-Length,
/// chunked encoding, or the end of the connection. The head and chunk
/// sizes are parsed by `httparse`.
pub(super) fn read_response(stream: &mut UnixStream, deadline: Instant) -> Result<Response, Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        // The head.
        let (head_end, status, reason, framing) = loop {
            if let Some(head) = parse_head(&buf)? {
                break head;
            }
            if buf.len() > MAX_HEAD_BYTES {
                return Err(Error::Garbage(format!(
                    "the response head is longer than {MAX_HEAD_BYTES} bytes"
                )));
            }
            if fill(stream, &mut buf, deadline)? == 0 {
                return Err(Error::Closed(if buf.is_empty() {
                    "it closed the connection without answering".into()
                } else {
                    "it closed the connection in the middle of the response head".into()
                }));
            }
        };
        buf.drain(..head_end);
        // 1xx answers are interim; the real one follows.
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let body = read_body(stream, buf, framing, deadline)?;
        return Ok(Response {
            status,
            reason,
            body,
        });
    }
}

fn read_body(
    stream: &mut UnixStream,
    mut buf: Vec<u8>,
    framing: Framing,
    deadline: Instant,
) -> Result<Vec<u8>, Error> {
    let mut chunks = Dechunker::default();
    loop {
        let complete = match framing {
            Framing::Length(n) => buf.len() >= n,
            // Decodes only what arrived since the last read.
            Framing::Chunked => chunks.feed(&mut buf).map_err(Error::Garbage)?,
            Framing::UntilClose => false,
        };
        if complete {
            if let Framing::Length(n) = framing {
                buf.truncate(n);
                return Ok(buf);
            }
            return Ok(chunks.body);
        }
        if buf.len() > MAX_RESPONSE_BODY_BYTES {
            return Err(Error::Garbage(body_too_long()));
        }
        if fill(stream, &mut buf, deadline)? == 0 {
            return match framing {
                Framing::UntilClose => Ok(buf),
                Framing::Length(n) => Err(Error::Closed(format!(
                    "it closed the connection after {} of {n} body bytes",
                    buf.len()
                ))),
                Framing::Chunked => Err(Error::Closed(
                    "it closed the connection in the middle of a chunked body".into(),
                )),
            };
        }
    }
}

/// Reads more bytes into `buf`; 0 means the peer closed.
fn fill(stream: &mut UnixStream, buf: &mut Vec<u8>, deadline: Instant) -> Result<usize, Error> {
    let mut chunk = [0u8; 8192];
    loop {
        let left = remaining(deadline).ok_or(Error::TimedOut)?;
        stream.set_read_timeout(Some(left)).map_err(Error::Io)?;
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::TimedOut)
            }
            Err(e) => return Err(Error::Io(e)),
        }
    }
}

/// Parses the response head at the start of `buf`: `None` while it is
/// incomplete, else its length, status, reason and body framing.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, u16, String, Framing)>, Error> {
    let garbage = |why: String| Error::Garbage(why);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_end = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(garbage(format!(
                "the response has more than {MAX_HEADERS} headers"
            )))
        }
        Err(e) => {
            return Err(garbage(format!(
                "it is not an HTTP/1 response ({e}): {:?}",
                snippet(buf)
            )))
        }
    };
    let status = response.code.unwrap_or_default();
    // RFC 9110: every valid status code is within 100 ... 599.
    if !(100..=599).contains(&status) {
        return Err(garbage(format!(
            "bad status code {status}: {:?}",
            snippet(buf)
        )));
    }
    let reason = response.reason.unwrap_or_default().to_string();
    let mut length: Option<usize> = None;
    let mut chunked = false;
    for h in response.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        let value = value.trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .ok()
                .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| garbage(format!("bad Content-Length {value:?}")))?;
            if length.is_some_and(|m| m != n) {
                return Err(garbage("conflicting Content-Length headers".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(',').next().unwrap_or_default().trim();
            if !last.eq_ignore_ascii_case("chunked") {
                return Err(garbage(format!("unsupported Transfer-Encoding {value:?}")));
            }
            chunked = true;
        }
    }
    let framing = match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(n)) if n > MAX_RESPONSE_BODY_BYTES => return Err(garbage(body_too_long())),
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::UntilClose,
    };
    Ok(Some((head_end, status, reason, framing)))
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Default)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(usize),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailers up to an empty line.
    Trailers,
}

/// Decodes a chunked body as it arrives: every call consumes what it can
/// from the front of the buffer, so each byte is decoded once.
#[derive(Debug, Default)]
struct Dechunker {
    state: ChunkState,
    body: Vec<u8>,
}

impl Dechunker {
    /// Consumes decoded bytes from the front of `buf`; true once the body
    /// (with its trailers) is complete. Chunk extensions and trailers are
    /// skipped.
    fn feed(&mut self, buf: &mut Vec<u8>) -> Result<bool, String> {
        let mut at = 0;
        let done = loop {
            let data = &buf[at..];
            match self.state {
                ChunkState::Size => match httparse::parse_chunk_size(data) {
                    Ok(httparse::Status::Complete((n, 0))) => {
                        at += n;
                        self.state = ChunkState::Trailers;
                    }
                    Ok(httparse::Status::Complete((n, size))) => {
                        let size = usize::try_from(size)
                            .ok()
                            .filter(|s| {
                                self.body.len().saturating_add(*s) <= MAX_RESPONSE_BODY_BYTES
                            })
                            .ok_or_else(body_too_long)?;
                        at += n;
                        self.state = ChunkState::Data(size);
                    }
                    Ok(httparse::Status::Partial) => break false,
                    Err(_) => {
                        return Err(format!("bad chunk size line {:?}", snippet(data)));
                    }
                },
                ChunkState::Data(left) => {
                    let take = left.min(data.len());
                    self.body.extend_from_slice(&data[..take]);
                    at += take;
                    if take < left {
                        self.state = ChunkState::Data(left - take);
                        break false;
                    }
                    self.state = ChunkState::DataEnd;
                }
                ChunkState::DataEnd => {
                    if data.len() < 2 {
                        break false;
                    }
                    if &data[..2] != b"\r\n" {
                        return Err("a chunk does not end with CRLF".into());
                    }
                    at += 2;
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    match httparse::parse_headers(data, &mut trailers) {
                        Ok(httparse::Status::Complete((n, _))) => {
                            at += n;
                            break true;
                        }
                        Ok(httparse::Status::Partial) => break false,
                        Err(e) => return Err(format!("bad chunked-body trailers ({e})")),
                    }
                }
            }
        };
        buf.drain(..at);
        Ok(done)
    }
}

/// Why a body over [`MAX_RESPONSE_BODY_BYTES`] is refused.
fn body_too_long() -> String {
    format!("the response body is longer than {MAX_RESPONSE_BODY_BYTES} bytes")
}

/// The start of some bytes, for messages.
fn snippet(bytes: &[u8]) -> String {
    let end = bytes.len().min(80);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Parses `raw` as the daemon's complete answer (the connection closes
/// after its last byte), through the same reader the shim uses on the
/// socket: `(status, body)`, or why it is not a usable answer. For the
/// fuzz targets and tests.
#[doc(hidden)]
pub fn parse_raw_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    // MSG_NOSIGNAL: the reader may stop (and close) before all is sent.
    fn send(fd: &UnixStream, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: `buf` is a live slice and the descriptor is open.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                flags | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }
    /// Sends from the front of `rest` until it is empty or a send stops
    /// short (EAGAIN under MSG_DONTWAIT, or the reader has closed).
    fn send_all(fd: &UnixStream, rest: &mut &[u8], flags: libc::c_int) {
        while !rest.is_empty() {
            match send(fd, rest, flags) {
                Ok(0) => break,
                Ok(n) => *rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    let (mut ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    // What fits in the socket buffer goes now; a writer thread sends the
    // rest while the reader reads.
    let mut rest = raw;
    send_all(&theirs, &mut rest, libc::MSG_DONTWAIT);
    std::thread::scope(|scope| {
        if rest.is_empty() {
            drop(theirs);
        } else {
            scope.spawn(move || send_all(&theirs, &mut rest, 0));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let read = read_response(&mut ours, deadline);
        drop(ours);
        read.map(|r| (r.status, r.body)).map_err(|e| match e {
            Error::TimedOut => "timed out".to_string(),
            Error::Closed(why) | Error::Garbage(why) => why,
            Error::Io(e) => e.to_string(),
        })
    })
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
