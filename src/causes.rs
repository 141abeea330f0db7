//! An error's text with every cause under it, for messages and logs.

/// `e` and every cause under it (`source()`), joined with `: `; a cause
/// whose text its parent already shows is left out.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Connect(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("failed to list: {0}")]
    struct List(#[source] Connect);

    #[derive(Debug, thiserror::Error)]
    #[error("refusing /run/x")]
    struct Refused(#[source] Connect);

    #[test]
    fn a_cause_should_be_named_once() {
        let e = List(Connect(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        )));
        assert_eq!(
            super::chain(&e),
            "failed to list: client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }

    #[test]
    fn every_cause_should_be_named() {
        let e = Refused(Connect(std::io::Error::other("denied")));
        assert_eq!(
            super::chain(&e),
            "refusing /run/x: client error (Connect): denied"
        );
    }
}
