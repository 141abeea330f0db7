//! The CNI spec's rules for names: container ids, network names and
//! interface names.
//!
//! A leaf module: network selection checks the names a caller asks for
//! before the engine runs, and the engine checks the runtime's call and
//! the record files' names; both take the rules from here.

use std::fmt;

/// Longest interface name the kernel accepts, in bytes (IFNAMSIZ - 1).
pub const MAX_IFNAME_BYTES: usize = 15;

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the spec's rule for container ids and
/// network names. It also keeps ids safe as file names.
pub fn is_valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Why an interface name is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadIfname {
    /// What is wrong, without the name.
    pub why: &'static str,
    /// The offending name, quoted, where it helps (empty otherwise).
    pub details: String,
}

impl fmt::Display for BadIfname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.why)
    }
}

impl std::error::Error for BadIfname {}

/// Interface names: non-empty, at most [`MAX_IFNAME_BYTES`], not `.`/`..`,
/// no `/`, `:` or whitespace (the kernel's and libcni's rules), and no
/// control characters (the kernel takes them, but nothing can name such a
/// link).
pub fn check_ifname(name: &str) -> Result<(), BadIfname> {
    let bad = |why: &'static str, details: String| Err(BadIfname { why, details });
    if name.is_empty() {
        return bad("interface name is empty", String::new());
    }
    if name.len() > MAX_IFNAME_BYTES {
        return bad(
            "interface name is too long",
            format!("interface name should be less than 16 characters: {name:?}"),
        );
    }
    if name == "." || name == ".." {
        return bad("interface name is . or ..", String::new());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return bad(
            "interface name contains / or : or whitespace characters",
            format!("{name:?}"),
        );
    }
    if name.chars().any(char::is_control) {
        return bad(
            "interface name contains control characters",
            format!("{name:?}"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_should_follow_the_spec_pattern() {
        for good in ["a", "0", "abc-1.2_x", "A"] {
            assert!(is_valid_name(good), "{good:?}");
        }
        for bad in ["", "-a", ".a", "_a", "a/b", "a b", "a\0", "é"] {
            assert!(!is_valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn bad_ifnames_should_be_refused_and_15_bytes_accepted() {
        for (name, why) in [
            ("", "empty"),
            ("abcdefghijklmnop", "too long"),
            ("a/b", "whitespace"),
            ("a:b", "whitespace"),
            ("a b", "whitespace"),
            (".", ". or .."),
            ("..", ". or .."),
            ("a\x01", "control"),
        ] {
            let e = check_ifname(name).unwrap_err();
            assert!(e.why.contains(why), "{name:?}: {e}");
        }
        check_ifname("abcdefghijklmno").unwrap();
        assert_eq!("abcdefghijklmno".len(), MAX_IFNAME_BYTES);
    }
}
