//! The shim's reading of the daemon's HTTP answer (status line, headers,
//! Content-Length / chunked / until-close bodies, interim 1xx answers),
//! through `shim::parse_raw_response`, which feeds the bytes to the same
//! socket reader the shim uses.
//!
//! Two modes, picked by the first byte:
//! - raw: the rest is the whole answer. No panic, no hang, and a body no
//!   larger than the input.
//! - framed: the rest describes an answer (status, framing, chunk sizes,
//!   body) that is then written as a well-formed HTTP/1.1 response; it
//!   must parse back to exactly that status and body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus::shim::parse_raw_response;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        if let Ok((status, body)) = parse_raw_response(rest) {
            assert!((100..=599).contains(&status));
            assert!(body.len() <= rest.len());
        }
        return;
    }
    framed(mode, rest);
});

fn framed(mode: u8, data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    // 200..=599: a final answer (1xx are skipped by design).
    let status = 200 + u16::from_le_bytes([data[0], data[1]]) % 400;
    let (sizes, body) = data[2..].split_at(data[2..].len().min(usize::from(data[2] % 8)));
    let mut raw = format!("HTTP/1.1 {status} Whatever It Says\r\nX-Other: a:b\r\n").into_bytes();
    match (mode >> 1) % 3 {
        0 => {
            raw.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            raw.extend_from_slice(body);
        }
        1 => {
            raw.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            // Chunk sizes from the size bytes (cycled); never 0 mid-body.
            let mut left = body;
            let mut i = 0;
            while !left.is_empty() {
                let want = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255);
                let n = usize::from(want).clamp(1, left.len());
                let ext = if want % 5 == 0 { ";name=value" } else { "" };
                raw.extend_from_slice(format!("{n:x}{ext}\r\n").as_bytes());
                raw.extend_from_slice(&left[..n]);
                raw.extend_from_slice(b"\r\n");
                left = &left[n..];
                i += 1;
            }
            raw.extend_from_slice(b"0\r\n");
            if mode & 0x80 != 0 {
                raw.extend_from_slice(b"Trailer-Name: x\r\n");
            }
            raw.extend_from_slice(b"\r\n");
        }
        _ => {
            // Ends when the connection does.
            raw.extend_from_slice(b"Connection: close\r\n\r\n");
            raw.extend_from_slice(body);
        }
    }
    if mode & 0x40 != 0 {
        // An interim answer first.
        let mut with_interim = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        with_interim.extend_from_slice(&raw);
        raw = with_interim;
    }
    match parse_raw_response(&raw) {
        Ok((s, b)) => {
            assert_eq!(s, status);
            assert_eq!(b, body, "{}", String::from_utf8_lossy(&raw));
        }
        Err(e) => panic!(
            "a well-formed answer is refused: {e}\n{}",
            String::from_utf8_lossy(&raw)
        ),
    }
}
