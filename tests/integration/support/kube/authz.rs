//! What a caller of the fake API server may do: the authorizers' rules.

use super::authn::Identity;

/// The authorizers' settings. Default: everything is allowed.
#[derive(Debug, Default)]
pub(super) struct Authz {}

impl Authz {
    /// Whether `identity` may make this request (`method`, `path`,
    /// `query` as sent). `Err(message)`: 403 Forbidden with the API
    /// server's message.
    pub(super) fn authorize(
        &self,
        identity: Option<&Identity>,
        method: &str,
        path: &str,
        query: &str,
    ) -> Result<(), String> {
        let _ = (identity, method, path, query);
        Ok(())
    }
}
