//! Who is calling the fake API server: the identity a client certificate
//! or a bearer token stands for, as the real API server's authenticators
//! find it.

/// A user and their groups, as the API server's authenticators report
/// them (`system:node:<name>` in `system:nodes`, a service account...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The authenticators' settings.
#[derive(Debug, Default)]
pub(super) struct Authn {
    /// Some(token): requests without `Authorization: Bearer <token>` get
    /// 401 Unauthorized.
    pub(super) required_token: Option<String>,
    /// Bearer tokens and whom they stand for. When there are any, a
    /// request must carry one of them or a known client certificate.
    pub(super) tokens: std::collections::BTreeMap<String, Identity>,
    /// Set once a token was accepted: from then on, callers must be
    /// known (even when every token has been revoked since).
    pub(super) identify: bool,
}

impl Authn {
    /// The caller of one request: `peer` is the identity of the
    /// connection's client certificate, if any; `authorization` the
    /// request's header. `Err(())`: 401 Unauthorized. `Ok(None)`: no
    /// authentication is configured and nothing identified the caller.
    pub(super) fn authenticate(
        &self,
        peer: Option<&Identity>,
        authorization: Option<&str>,
    ) -> Result<Option<Identity>, ()> {
        if let Some(t) = &self.required_token {
            if authorization != Some(format!("Bearer {t}").as_str()) {
                return Err(());
            }
        }
        if !self.identify {
            return Ok(peer.cloned());
        }
        let bearer = authorization.and_then(|a| a.strip_prefix("Bearer "));
        match bearer.and_then(|t| self.tokens.get(t)) {
            Some(identity) => Ok(Some(identity.clone())),
            None => peer.cloned().map(Some).ok_or(()),
        }
    }
}
