//! Requests the Kubernetes API refused to this identity (403 Forbidden):
//! logged once per kind of request (verb, API group, resource), at warn,
//! with who was refused, the RBAC rule that would allow it and what Plexus
//! cannot do without it. What a node's own identity may do is decided by
//! the API server's Node authorizer, which grants no
//! NetworkAttachmentDefinitions and no list of ResourceClaims; README's
//! section on the identity lists the rules per identity.
//!
//! Memory is bounded: at most [`MAX_KINDS`] kinds are remembered; refusals
//! of further kinds are logged at debug only.

use std::collections::HashSet;
use std::sync::Mutex;

/// Kinds of refused requests remembered (each logged once at warn).
pub const MAX_KINDS: usize = 32;
/// Where README explains the identity and its rules.
pub const README_SECTION: &str = "README.md, \"The identity plexusd uses\"";

/// What has been refused so far.
#[derive(Debug, Default)]
pub struct Refusals {
    /// (verb, API group, resource[/subresource]) already logged.
    seen: Mutex<HashSet<(&'static str, String, String)>>,
}

/// A request as the API server's authorizers see it: the verb, API group,
/// resource (`pods/status` for a subresource), namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Request {
    /// From the method and the path (with its query) as sent; `None` for
    /// a path that names no resource.
    pub fn parse(method: &str, path_and_query: &str) -> Option<Self> {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _, rest @ ..] => (String::new(), rest),
            ["apis", group, _, rest @ ..] => (group.to_string(), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            rest => (None, rest),
        };
        let (resource, name) = match rest {
            [r] => (r.to_string(), None),
            [r, n] => (r.to_string(), Some(n.to_string())),
            [r, n, sub] => (format!("{r}/{sub}"), Some(n.to_string())),
            _ => return None,
        };
        let watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let verb = match (method, name.is_some()) {
            ("GET", true) => "get",
            ("GET", false) if watch => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return None,
        };
        Some(Self {
            verb,
            group,
            resource,
            namespace,
            name,
        })
    }

    /// The RBAC rule that allows this request, as a ClusterRole writes
    /// it.
    pub fn rule(&self) -> String {
        format!(
            "apiGroups: [\"{}\"], resources: [{}], verbs: [{}]",
            self.group, self.resource, self.verb
        )
    }

    /// What Plexus cannot do while this request is refused.
    pub fn feature(&self) -> &'static str {
        match (self.group.as_str(), self.resource.as_str()) {
            ("k8s.cni.cncf.io", _) => {
                "networks named by NetworkAttachmentDefinitions (and, while the NAD cache cannot sync, every pod's ADD)"
            }
            ("", "pods/status") => "the pods' network-status annotation",
            ("", "events") | ("events.k8s.io", _) => "pod events",
            ("resource.k8s.io", "resourceclaims") => {
                "devices from Dynamic Resource Allocation (the pod's ResourceClaims)"
            }
            ("resource.k8s.io", "resourceslices") => {
                "devices from Dynamic Resource Allocation (this node's ResourceSlices)"
            }
            ("", "pods") => "pod lookups (this node's pod cache, a pod the cache lacks)",
            _ => "a Kubernetes request Plexus makes",
        }
    }
}

/// The user a 403's message names (`... User "<user>" cannot ...`).
pub fn refused_user(message: &str) -> Option<&str> {
    let rest = &message[message.find("User \"")? + "User \"".len()..];
    Some(&rest[..rest.find('"')?])
}

/// The `message` of a Status body; empty when the body is none.
fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

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
        if status != 403 {
            return;
        }
        let Some(request) = Request::parse(method, path_and_query) else {
            tracing::debug!(
                method,
                path = path_and_query,
                "the Kubernetes API refused a request (403)"
            );
            return;
        };
        if !self.first(&request) {
            return;
        }
        let message = status_message(body);
        let identity = refused_user(&message).unwrap_or(credentials);
        tracing::warn!(
            verb = request.verb,
            resource = %request.resource,
            api_group = %request.group,
            namespace = request.namespace.as_deref().unwrap_or(""),
            identity,
            credentials,
            rule = %request.rule(),
            feature = request.feature(),
            answer = %message,
            "the Kubernetes API refused this identity a request Plexus needs; add the rule to a ClusterRole \
             bound to it (see {README_SECTION})"
        );
    }

    /// Whether this is the first refusal of its kind (remembered while
    /// fewer than [`MAX_KINDS`] are; later kinds get a debug line).
    fn first(&self, r: &Request) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let key = (r.verb, r.group.clone(), r.resource.clone());
        if seen.contains(&key) {
            return false;
        }
        if seen.len() >= MAX_KINDS {
            tracing::debug!(verb = r.verb, resource = %r.resource, api_group = %r.group, rule = %r.rule(), "the Kubernetes API refused a request (403)");
            return false;
        }
        seen.insert(key);
        true
    }

    /// How many kinds of request have been refused (up to [`MAX_KINDS`]).
    pub fn kinds(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: &str, p: &str) -> Request {
        Request::parse(method, p).unwrap()
    }

    #[test]
    fn requests_should_be_seen_as_the_authorizers_see_them() {
        let nads = parse(
            "GET",
            "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions?limit=500",
        );
        assert_eq!(
            (nads.verb, nads.group.as_str(), nads.resource.as_str()),
            ("list", "k8s.cni.cncf.io", "network-attachment-definitions")
        );
        assert_eq!((nads.namespace, nads.name), (None, None));
        let watch = parse(
            "GET",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true&resourceVersion=5",
        );
        assert_eq!((watch.verb, watch.resource.as_str()), ("watch", "pods"));
        let status = parse("PATCH", "/api/v1/namespaces/ns1/pods/p/status?");
        assert_eq!(
            (
                status.verb,
                status.group.as_str(),
                status.resource.as_str(),
                status.namespace.as_deref(),
                status.name.as_deref()
            ),
            ("patch", "", "pods/status", Some("ns1"), Some("p"))
        );
        assert_eq!(
            status.rule(),
            r#"apiGroups: [""], resources: [pods/status], verbs: [patch]"#
        );
        let event = parse("POST", "/api/v1/namespaces/ns1/events");
        assert_eq!((event.verb, event.resource.as_str()), ("create", "events"));
        assert_eq!(event.name, None);
        let claims = parse(
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims",
        );
        assert_eq!(
            claims.rule(),
            r#"apiGroups: ["resource.k8s.io"], resources: [resourceclaims], verbs: [list]"#
        );
        assert_eq!(
            parse("GET", "/api/v1/namespaces/ns1").resource,
            "namespaces"
        );
        assert_eq!(parse("PUT", "/api/v1/namespaces/a/pods/p").verb, "update");
        assert_eq!(
            parse("DELETE", "/api/v1/namespaces/a/pods").verb,
            "deletecollection"
        );
        assert_eq!(Request::parse("GET", "/version"), None);
        assert_eq!(Request::parse("GET", "/api/v1/a/b/c/d"), None);
    }

    #[test]
    fn the_refused_user_should_be_read_from_the_api_servers_message() {
        let m = r#"network-attachment-definitions.k8s.cni.cncf.io is forbidden: User "system:node:node-1" cannot list resource "network-attachment-definitions" in API group "k8s.cni.cncf.io" at the cluster scope"#;
        assert_eq!(refused_user(m), Some("system:node:node-1"));
        assert_eq!(
            refused_user(
                r#"resourceclaims.resource.k8s.io is forbidden: User "system:serviceaccount:kube-system:plexus" cannot list resource"#
            ),
            Some("system:serviceaccount:kube-system:plexus")
        );
        assert_eq!(refused_user("forbidden"), None);
        assert_eq!(refused_user(r#"User "unterminated"#), None);
        let body = serde_json::json!({"kind": "Status", "code": 403, "message": m}).to_string();
        assert_eq!(status_message(body.as_bytes()), m);
        assert_eq!(status_message(b"not json"), "");
    }

    #[test]
    fn each_kind_should_be_remembered_once_and_the_set_capped() {
        let r = Refusals::default();
        let body = br#"{"message": "pods is forbidden: User \"u\" cannot list"}"#;
        r.observe("GET", "/api/v1/pods?limit=500", 403, body, "kubeconfig");
        r.observe("GET", "/api/v1/pods?limit=500", 403, body, "kubeconfig");
        r.observe("GET", "/api/v1/pods?watch=true", 403, body, "kubeconfig");
        r.observe(
            "GET",
            "/api/v1/namespaces/a/pods/p",
            200,
            b"{}",
            "kubeconfig",
        );
        assert_eq!(r.kinds(), 2);
        for i in 0..(MAX_KINDS * 2) {
            r.observe("GET", &format!("/apis/g{i}/v1/things"), 403, b"", "c");
        }
        assert_eq!(r.kinds(), MAX_KINDS);
    }

    #[test]
    fn every_resource_plexus_uses_should_name_its_feature() {
        for (method, path, needle) in [
            (
                "GET",
                "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
                "NetworkAttachmentDefinitions",
            ),
            (
                "PATCH",
                "/api/v1/namespaces/a/pods/p/status",
                "network-status",
            ),
            ("POST", "/api/v1/namespaces/a/events", "pod events"),
            (
                "GET",
                "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims",
                "ResourceClaims",
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/resourceslices",
                "ResourceSlices",
            ),
            ("GET", "/api/v1/pods", "pod lookups"),
        ] {
            let f = parse(method, path).feature();
            assert!(f.contains(needle), "{path}: {f}");
        }
    }
}
