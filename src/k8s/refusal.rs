//! Requests the Kubernetes API refused to this identity (403 Forbidden):
//! logged once per kind of request, with the rule that would allow it.

/// What has been refused so far.
#[derive(Debug, Default)]
pub struct Refusals {}

impl Refusals {
    /// Notes one answer of the API server to a request (`method`,
    /// `path_and_query` as sent); `body` is the answer's body, read only
    /// for a 403. `credentials` says whose credentials were used (the
    /// kubeconfig's user and file, or the in-cluster service account).
    pub fn observe(
        &self,
        method: &str,
        path_and_query: &str,
        status: u16,
        body: &[u8],
        credentials: &str,
    ) {
        let _ = (method, path_and_query, status, body, credentials);
    }
}
