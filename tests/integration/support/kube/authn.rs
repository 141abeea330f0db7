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
    /// Client certificates issued (by DER) and whom they stand for.
    pub(super) certs: std::collections::BTreeMap<Vec<u8>, Identity>,
    /// Client certificates refused from now on (as after their expiry).
    pub(super) revoked_certs: std::collections::BTreeSet<Vec<u8>>,
}

impl Authn {
    /// Whom the client certificate `der` (checked at the TLS layer) stands
    /// for. Asked for each request, as the API server checks a
    /// certificate's validity per request: `Err(())`, 401 Unauthorized,
    /// for a revoked one, also on a connection opened before.
    pub(super) fn peer(&self, der: &[u8]) -> Result<Option<Identity>, ()> {
        if self.revoked_certs.contains(der) {
            return Err(());
        }
        Ok(self.certs.get(der).cloned())
    }

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
