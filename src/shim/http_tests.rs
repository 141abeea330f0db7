//! The HTTP response reader against a socket pair: framing, interim
//! answers, truncation, garbage and the deadline.

use super::*;
use std::io::Write;

fn far() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

/// Parses `raw` as if a daemon had written it and closed.
fn parse(raw: &[u8]) -> Result<Response, Error> {
    let (mut ours, mut theirs) = UnixStream::pair().unwrap();
    theirs.write_all(raw).unwrap();
    drop(theirs);
    read_response(&mut ours, far())
}

/// Asserts that each of `raws` fails to parse with an error `expected`
/// accepts.
fn assert_each_fails(raws: &[&[u8]], expected: fn(&Error) -> bool) {
    for raw in raws {
        let got = parse(raw);
        assert!(
            matches!(&got, Err(e) if expected(e)),
            "{:?}: {got:?}",
            String::from_utf8_lossy(raw)
        );
    }
}

#[test]
fn response_with_content_length_should_stop_at_the_length() {
    let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    assert_eq!(r.reason, "OK");
}

#[test]
fn response_without_length_should_read_until_close() {
    let r = parse(b"HTTP/1.0 400 Bad Request\r\nX: y\r\n\r\nsome text\n").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (400, &b"some text\n"[..]));
}

#[test]
fn chunked_response_should_be_decoded() {
    let r = parse(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nTrailer: x\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.body, b"Wikipedia");
}

#[test]
fn interim_response_should_be_skipped() {
    let r =
        parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    assert_eq!(r.status, 204);
}

#[test]
fn truncated_responses_should_be_closed_errors() {
    assert_each_fails(
        &[
            b"",
            b"HTTP/1.1 200",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        ],
        |e| matches!(e, Error::Closed(_)),
    );
}

#[test]
fn garbage_should_be_garbage_errors() {
    assert_each_fails(
        &[
            b"garbage",
            b"\x00\x01\x02",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
        ],
        |e| matches!(e, Error::Garbage(_)),
    );
}

#[test]
fn non_utf8_header_values_should_be_accepted() {
    let r = parse(b"HTTP/1.1 200 OK\r\nX-Note: caf\xe9\r\nContent-Length: 2\r\n\r\nok").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
}

/// A daemon writing one byte at a time: every split of the head and of
/// the chunk framing must decode to the same body.
#[test]
fn responses_arriving_byte_by_byte_should_decode_the_same() {
    let raw: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nWiki\r\n5\r\npedia\r\n0\r\nT: 1\r\n\r\n";
    let (mut ours, mut theirs) = UnixStream::pair().unwrap();
    let writer = std::thread::spawn(move || {
        for b in raw {
            theirs.write_all(std::slice::from_ref(b)).unwrap();
        }
        // Kept open: the body must end by its framing, not by close.
        theirs
    });
    let r = read_response(&mut ours, far()).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"Wikipedia"[..]));
    drop(writer.join().unwrap());
}

#[test]
fn dechunker_should_consume_each_byte_once() {
    let mut d = Dechunker::default();
    let mut buf = b"3\r\nabc\r".to_vec();
    assert!(!d.feed(&mut buf).unwrap());
    // Everything but the unfinished CRLF is consumed.
    assert_eq!(buf, b"\r");
    buf.extend_from_slice(b"\n0\r\n\r\n");
    assert!(d.feed(&mut buf).unwrap());
    assert_eq!(d.body, b"abc");
    assert!(buf.is_empty());
}

#[test]
fn silent_daemon_should_time_out() {
    let (mut ours, _theirs) = UnixStream::pair().unwrap();
    let deadline = Instant::now() + Duration::from_millis(50);
    assert!(matches!(
        read_response(&mut ours, deadline),
        Err(Error::TimedOut)
    ));
}

#[test]
fn raw_response_parsing_should_match_the_socket_reader() {
    assert_eq!(
        parse_raw_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"),
        Ok((200, b"ok".to_vec()))
    );
    // Larger than a socket buffer: the writer must not deadlock.
    let body = vec![b'x'; 3 << 20];
    let mut raw =
        format!("HTTP/1.1 400 Bad\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    raw.extend_from_slice(&body);
    assert_eq!(parse_raw_response(&raw), Ok((400, body)));
    // Garbage stops the reader early, with most of the input unsent.
    let mut junk = b"SMTP ready\r\n".to_vec();
    junk.resize(2 << 20, b'y');
    assert!(parse_raw_response(&junk)
        .unwrap_err()
        .contains("it is not an HTTP/1 response"));
}

#[test]
fn status_outside_100_to_599_should_be_garbage() {
    for raw in [
        &b"HTTP/1.1 096 OK\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.1 000 X\r\n\r\n",
        b"HTTP/1.1 600 X\r\n\r\n",
        b"HTTP/1.1 999\r\n\r\n",
    ] {
        let err = parse_raw_response(raw).unwrap_err();
        assert!(err.contains("bad status"), "{err}");
    }
    assert_eq!(
        parse_raw_response(b"HTTP/1.1 599 X\r\nContent-Length: 0\r\n\r\n"),
        Ok((599, Vec::new()))
    );
}
