//! What a caller of the fake API server may do: the authorizers' rules.
//!
//! By default everything is allowed. [`Authorization`] turns on the API
//! server's authorizers as `--authorization-mode=Node,RBAC` runs them
//! (each asked in turn, the first that allows wins; a request none allows
//! is 403 `Forbidden`):
//!
//! - Node (plugin/pkg/auth/authorizer/node/node_authorizer.go in
//!   kubernetes/kubernetes, with `AuthorizeNodeWithSelectors`): a caller
//!   is a node when its user is `system:node:<name>` and it is in group
//!   `system:nodes`. Pods: `get` of a pod bound to the node, `list` and
//!   `watch` only with the field selector `spec.nodeName=<node>`, `create`
//!   and `delete`; `pods/status`: `update` and `patch` (the NodeRestriction
//!   admission plugin then refuses pods bound elsewhere). ResourceClaims:
//!   `get` of a claim a pod bound to the node references, nothing else.
//!   ResourceSlices: `list`, `watch` with `spec.nodeName=<node>`, `get` and
//!   writes of the node's own. Everything else by the static rules of the
//!   `system:node` ClusterRole (bootstrappolicy `NodeRules`), of which
//!   events (`create`, `update`, `patch`, core and `events.k8s.io`) are the
//!   ones Plexus meets; NetworkAttachmentDefinitions are not among them.
//! - RBAC: ClusterRoles bound by ClusterRoleBindings to users, groups and
//!   service accounts.
//!
//! The 403 is the API server's (staging/src/k8s.io/apiserver/pkg/endpoints/
//! handlers/responsewriters/errors.go `forbiddenMessage`, and
//! apimachinery's `NewForbidden`): `<resource>.<group> "<name>" is
//! forbidden: User "<user>" cannot <verb> resource "<resource>[/<sub>]" in
//! API group "<group>" in the namespace "<ns>"` (or `at the cluster
//! scope`), the authorizers' reasons after `: `, and `details` `{name,
//! group, kind}` (kind being the resource).

use serde_json::{json, Value};

use super::authn::Identity;
use super::wire::{decode, query_param, reply, status_object, Reply};
use super::{State, PODS, RESOURCE_SLICES};

/// The authorizers' settings. Default: everything is allowed.
#[derive(Debug, Default)]
pub(super) struct Authz {
    /// Some: only what these authorizers allow.
    pub(super) enforced: Option<Authorization>,
}

/// The authorizers the API server runs, as a test sets them up.
#[derive(Debug, Clone, Default)]
pub struct Authorization {
    node: bool,
    bindings: Vec<(ClusterRole, Subject)>,
}

impl Authorization {
    /// `--authorization-mode=Node,RBAC` with no binding yet.
    pub fn node_and_rbac() -> Self {
        Self {
            node: true,
            bindings: Vec::new(),
        }
    }

    /// A ClusterRoleBinding of `role` to `subject`.
    pub fn bind(mut self, role: &ClusterRole, subject: Subject) -> Self {
        self.bindings.push((role.clone(), subject));
        self
    }
}

/// Whom a ClusterRoleBinding names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
    ServiceAccount { namespace: String, name: String },
}

impl Subject {
    fn matches(&self, who: &Identity) -> bool {
        match self {
            Subject::User(u) => who.user == *u,
            Subject::Group(g) => who.groups.iter().any(|x| x == g),
            Subject::ServiceAccount { namespace, name } => {
                who.user == format!("system:serviceaccount:{namespace}:{name}")
            }
        }
    }
}

/// A ClusterRole: its name and rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRole {
    pub name: String,
    pub rules: Vec<Rule>,
}

/// One PolicyRule of a role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Rule {
    fn of(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Self {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Rule {
            api_groups: v(groups),
            resources: v(resources),
            verbs: v(verbs),
            resource_names: Vec::new(),
        }
    }

    /// rbac's `RuleAllows`: verb, group, resource (`<r>/<sub>` for a
    /// subresource) and, when the rule names any, the object's name.
    fn allows(&self, a: &Attributes) -> bool {
        let has = |list: &[String], x: &str| list.iter().any(|i| i == "*" || i == x);
        let combined = match &a.subresource {
            Some(sub) => format!("{}/{sub}", a.resource),
            None => a.resource.clone(),
        };
        let resource = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || a.subresource
                    .as_ref()
                    .is_some_and(|sub| *r == format!("*/{sub}"))
        });
        has(&self.verbs, a.verb)
            && has(&self.api_groups, &a.group)
            && resource
            && (self.resource_names.is_empty()
                || a.name
                    .as_ref()
                    .is_some_and(|n| self.resource_names.contains(n)))
    }
}

/// The `system:node` ClusterRole's static rules (bootstrappolicy
/// `NodeRules`), which the Node authorizer applies to every resource it
/// does not decide itself.
fn node_rules() -> Vec<Rule> {
    const READ: &[&str] = &["get", "list", "watch"];
    vec![
        Rule::of(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        Rule::of(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        Rule::of(READ, &[""], &["services"]),
        Rule::of(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        Rule::of(&["update", "patch"], &[""], &["nodes/status", "nodes"]),
        Rule::of(
            &["create", "update", "patch"],
            &["", "events.k8s.io"],
            &["events"],
        ),
        Rule::of(&["create"], &[""], &["pods/eviction"]),
        Rule::of(&["get"], &[""], &["endpoints"]),
        Rule::of(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        Rule::of(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        Rule::of(&["create"], &[""], &["serviceaccounts/token"]),
        Rule::of(READ, &["storage.k8s.io"], &["csidrivers"]),
        Rule::of(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
}

/// What the authorizers see of a request (the apiserver's RequestInfo).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Attributes {
    pub(super) verb: &'static str,
    pub(super) group: String,
    pub(super) namespace: Option<String>,
    pub(super) resource: String,
    pub(super) subresource: Option<String>,
    pub(super) name: Option<String>,
    field_selector: Option<String>,
}

impl Attributes {
    /// None: not a resource request (`/version`, discovery).
    pub(super) fn of(method: &str, path: &str, query: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] => (String::new(), rest),
            ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
            _ => return None,
        };
        let (namespace, rest): (Option<String>, &[&str]) = match rest {
            // `namespaces/<ns>` alone is the Namespace object itself.
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            rest => (None, rest),
        };
        let (resource, mut name, subresource) = match rest {
            [r] => (r.to_string(), None, None),
            [r, n] => (r.to_string(), Some(n.to_string()), None),
            [r, n, sub] => (r.to_string(), Some(n.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        let field_selector = query_param(query, "fieldSelector").map(decode);
        let watch = query_param(query, "watch").is_some_and(|v| v == "true" || v == "1");
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
        // A list or watch selecting one object by name is about that
        // object (RequestInfo takes `metadata.name=` as the name).
        if name.is_none() && matches!(verb, "list" | "watch") {
            name = field_selector
                .as_deref()
                .and_then(|s| selector_value(s, "metadata.name"));
        }
        Some(Self {
            verb,
            group,
            namespace,
            resource,
            subresource,
            name,
            field_selector,
        })
    }

    fn selects(&self, field: &str, value: &str) -> bool {
        self.field_selector
            .as_deref()
            .and_then(|s| selector_value(s, field))
            .is_some_and(|v| v == value)
    }
}

/// The value a field selector requires of `field` (`field=v` or
/// `field==v`).
fn selector_value(selector: &str, field: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (f, v) = term.split_once("==").or_else(|| term.split_once('='))?;
        (f == field && !f.ends_with('!')).then(|| v.to_string())
    })
}

/// A 403 as the API server words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Forbidden {
    pub(super) message: String,
    group: String,
    kind: String,
    name: String,
}

impl Forbidden {
    fn new(user: &str, a: &Attributes, reasons: &[String]) -> Self {
        let resource = match &a.subresource {
            Some(sub) => format!("{}/{sub}", a.resource),
            None => a.resource.clone(),
        };
        let scope = match &a.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        let mut why = format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} {scope}",
            a.verb, a.group
        );
        let reasons: Vec<&str> = reasons
            .iter()
            .map(String::as_str)
            .filter(|r| !r.is_empty())
            .collect();
        if !reasons.is_empty() {
            why = format!("{why}: {}", reasons.join("\n"));
        }
        let qualified = if a.group.is_empty() {
            a.resource.clone()
        } else {
            format!("{}.{}", a.resource, a.group)
        };
        let message = match &a.name {
            Some(n) => format!("{qualified} {n:?} is forbidden: {why}"),
            None => format!("{qualified} is forbidden: {why}"),
        };
        Self {
            message,
            group: a.group.clone(),
            kind: a.resource.clone(),
            name: a.name.clone().unwrap_or_default(),
        }
    }

    /// The NodeRestriction admission plugin's refusal (after the
    /// authorizers allowed the request).
    fn admission(a: &Attributes, why: String) -> Self {
        let qualified = if a.group.is_empty() {
            a.resource.clone()
        } else {
            format!("{}.{}", a.resource, a.group)
        };
        let name = a.name.clone().unwrap_or_default();
        Self {
            message: format!("{qualified} {name:?} is forbidden: {why}"),
            group: a.group.clone(),
            kind: a.resource.clone(),
            name,
        }
    }

    /// The Status object answered, with its `details` (empty fields left
    /// out, as the API server's JSON omits them).
    pub(super) fn status(&self) -> Value {
        let mut status = status_object(403, "Forbidden", &self.message);
        let mut details = serde_json::Map::new();
        for (k, v) in [
            ("name", &self.name),
            ("group", &self.group),
            ("kind", &self.kind),
        ] {
            if !v.is_empty() {
                details.insert(k.into(), json!(v));
            }
        }
        status["details"] = Value::Object(details);
        status
    }

    pub(super) fn reply(&self) -> Reply {
        reply(403, &self.status())
    }
}

/// What one authorizer says.
enum Decision {
    Allow,
    /// No opinion, with a reason (maybe empty) for the 403's message.
    NoOpinion(String),
}

impl Authz {
    /// Whether `identity` may make this request (`method`, `path`,
    /// `query` as sent), given the objects `state` holds (the Node
    /// authorizer's graph). `Err`: 403 Forbidden as the API server says it.
    pub(super) fn authorize(
        &self,
        state: &State,
        identity: Option<&Identity>,
        method: &str,
        path: &str,
        query: &str,
    ) -> Result<(), Forbidden> {
        let Some(modes) = &self.enforced else {
            return Ok(());
        };
        // Discovery and other non-resource paths: system:discovery.
        let Some(a) = Attributes::of(method, path, query) else {
            return Ok(());
        };
        let anonymous = Identity {
            user: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        };
        let who = identity.unwrap_or(&anonymous);
        let mut reasons = Vec::new();
        if modes.node {
            if let Some(node) = node_name(who) {
                match node_decides(state, node, &a) {
                    Decision::Allow => return node_restriction(state, node, &a),
                    Decision::NoOpinion(r) => reasons.push(r),
                }
            }
        }
        let rbac = modes
            .bindings
            .iter()
            .any(|(role, subject)| subject.matches(who) && role.rules.iter().any(|r| r.allows(&a)));
        if rbac {
            return match node_name(who) {
                Some(node) => node_restriction(state, node, &a),
                None => Ok(()),
            };
        }
        Err(Forbidden::new(&who.user, &a, &reasons))
    }
}

/// The node a caller is, as the API server's NodeIdentifier finds it.
fn node_name(who: &Identity) -> Option<&str> {
    let name = who.user.strip_prefix("system:node:")?;
    who.groups
        .iter()
        .any(|g| g == "system:nodes")
        .then_some(name)
}

/// The Node authorizer's decision for node `node`.
fn node_decides(s: &State, node: &str, a: &Attributes) -> Decision {
    let no = |r: &str| Decision::NoOpinion(r.to_string());
    let unrelated = || {
        Decision::NoOpinion(format!(
            "no relationship found between node '{node}' and this object"
        ))
    };
    let related = |yes: bool| if yes { Decision::Allow } else { unrelated() };
    match (a.group.as_str(), a.resource.as_str()) {
        ("", "pods") => match (a.subresource.as_deref(), a.verb) {
            (None, "get") => related(pod_on(s, a, node).is_some()),
            (None, "list" | "watch") => {
                if a.selects("spec.nodeName", node) {
                    Decision::Allow
                } else if a.name.is_some() {
                    related(pod_on(s, a, node).is_some())
                } else {
                    no("can only list/watch pods with spec.nodeName field selector")
                }
            }
            (None, "create" | "delete") => Decision::Allow,
            (Some("status"), "update" | "patch") => Decision::Allow,
            (Some("eviction"), "create") => Decision::Allow,
            _ => no(""),
        },
        ("resource.k8s.io", "resourceclaims") => {
            if a.verb != "get" {
                no("can only get individual resources of this type")
            } else if a.subresource.is_some() {
                no("cannot get subresource")
            } else {
                related(claim_used_on(s, a, node))
            }
        }
        ("resource.k8s.io", "resourceslices") => {
            if a.subresource.is_some() {
                return no("cannot authorize ResourceSlice subresources");
            }
            match a.verb {
                "create" => Decision::Allow,
                "get" | "update" | "patch" | "delete" => {
                    let name = a.name.clone().unwrap_or_default();
                    let slice = s.get(RESOURCE_SLICES, "", &name);
                    related(slice.is_some_and(|o| o["spec"]["nodeName"] == node))
                }
                "list" | "watch" | "deletecollection" if a.selects("spec.nodeName", node) => {
                    Decision::Allow
                }
                "list" | "watch" | "deletecollection" => no(
                    "can only list/watch/deletecollection resourceslices with nodeName field selector",
                ),
                _ => no("only the following verbs are allowed for a ResourceSlice: get, watch, list, create, update, patch, delete, deletecollection"),
            }
        }
        _ if node_rules().iter().any(|r| r.allows(a)) => Decision::Allow,
        _ => no(""),
    }
}

/// The pod the request names, when it is bound to `node`.
fn pod_on(s: &State, a: &Attributes, node: &str) -> Option<Value> {
    let ns = a.namespace.as_deref()?;
    let pod = s.get(PODS, ns, a.name.as_deref()?)?;
    (pod["spec"]["nodeName"] == node).then_some(pod)
}

/// Whether a pod bound to `node` references the claim the request names
/// (`spec.resourceClaims[].resourceClaimName`, or the name a template's
/// claim got in `status.resourceClaimStatuses`): the graph's
/// pod -> ResourceClaim edges.
fn claim_used_on(s: &State, a: &Attributes, node: &str) -> bool {
    let (Some(ns), Some(name)) = (a.namespace.as_deref(), a.name.as_deref()) else {
        return false;
    };
    s.objects
        .range((PODS, ns.to_string(), String::new())..)
        .take_while(|((r, n, _), _)| *r == PODS && n == ns)
        .any(|(_, pod)| {
            let named = |list: &Value, key: &str| {
                list.as_array()
                    .is_some_and(|l| l.iter().any(|c| c[key] == name))
            };
            pod["spec"]["nodeName"] == node
                && (named(&pod["spec"]["resourceClaims"], "resourceClaimName")
                    || named(&pod["status"]["resourceClaimStatuses"], "resourceClaimName"))
        })
}

/// The NodeRestriction admission plugin, for what Plexus writes: a node
/// updates the status of its own pods only.
fn node_restriction(s: &State, node: &str, a: &Attributes) -> Result<(), Forbidden> {
    let pod_status = a.group.is_empty()
        && a.resource == "pods"
        && a.subresource.as_deref() == Some("status")
        && matches!(a.verb, "update" | "patch");
    if !pod_status {
        return Ok(());
    }
    let ns = a.namespace.clone().unwrap_or_default();
    let name = a.name.clone().unwrap_or_default();
    match s.get(PODS, &ns, &name) {
        // Admission lets the store answer 404.
        None => Ok(()),
        Some(pod) if pod["spec"]["nodeName"] == node => Ok(()),
        Some(_) => Err(Forbidden::admission(
            a,
            format!("node {node:?} can only update pod status for pods with spec.nodeName set to itself"),
        )),
    }
}

/// The YAML documents of a markdown text's ```yaml blocks, as lines.
fn yaml_documents(markdown: &str) -> Vec<Vec<&str>> {
    let mut docs = Vec::new();
    let mut in_yaml = false;
    let mut doc: Vec<&str> = Vec::new();
    for line in markdown.lines() {
        match (in_yaml, line.trim()) {
            (false, "```yaml") => in_yaml = true,
            (true, "```" | "---") => {
                docs.push(std::mem::take(&mut doc));
                in_yaml = line.trim() == "---";
            }
            (true, _) => doc.push(line),
            _ => {}
        }
    }
    docs
}

/// The ClusterRoles written in a markdown text's ```yaml blocks, in the
/// flow style README uses (`apiGroups: [""]`, `verbs: [get, list]`). Any
/// other shape of a rule panics: a role the tests cannot read is a role
/// they would not check.
pub fn cluster_roles_in(markdown: &str) -> Vec<ClusterRole> {
    yaml_documents(markdown)
        .iter()
        .filter_map(|d| cluster_role(d))
        .collect()
}

/// The ClusterRoleBindings written in a markdown text's ```yaml blocks,
/// in the flow style README uses (`roleRef: {.., name: r}`, subjects
/// `- {kind: Group, name: "g"}`): (role name, subject) pairs.
pub fn cluster_role_bindings_in(markdown: &str) -> Vec<(String, Subject)> {
    let mut out = Vec::new();
    for doc in yaml_documents(markdown) {
        if !doc.iter().any(|l| l.trim() == "kind: ClusterRoleBinding") {
            continue;
        }
        let role_ref = doc
            .iter()
            .find_map(|l| l.trim().strip_prefix("roleRef: "))
            .and_then(flow_map)
            .expect("a binding's roleRef as a flow map");
        let role = role_ref["name"].clone();
        for line in doc.iter().skip_while(|l| l.trim() != "subjects:").skip(1) {
            let item = line.trim().strip_prefix("- ").and_then(flow_map);
            let m = item.unwrap_or_else(|| panic!("a subject not as `- {{..}}`: {line:?}"));
            let name = m["name"].clone();
            let subject = match m["kind"].as_str() {
                "User" => Subject::User(name),
                "Group" => Subject::Group(name),
                "ServiceAccount" => Subject::ServiceAccount {
                    namespace: m["namespace"].clone(),
                    name,
                },
                k => panic!("unknown subject kind {k:?}: {line:?}"),
            };
            out.push((role.clone(), subject));
        }
    }
    out
}

/// `{a: b, c: "d"}` -> a map (quotes taken off).
fn flow_map(text: &str) -> Option<std::collections::HashMap<String, String>> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    let mut m = std::collections::HashMap::new();
    for kv in inner.split(',') {
        let (k, v) = kv.split_once(": ")?;
        m.insert(
            k.trim().to_string(),
            v.trim().trim_matches('"').trim_matches('\'').to_string(),
        );
    }
    // Absent keys read as empty.
    for k in ["name", "kind", "namespace"] {
        m.entry(k.to_string()).or_default();
    }
    Some(m)
}

/// One YAML document, if it is a ClusterRole.
fn cluster_role(doc: &[&str]) -> Option<ClusterRole> {
    if !doc.iter().any(|l| l.trim() == "kind: ClusterRole") {
        return None;
    }
    let name = doc
        .iter()
        .skip_while(|l| l.trim() != "metadata:")
        .find_map(|l| l.trim().strip_prefix("name: "))
        .expect("a ClusterRole with metadata.name")
        .trim()
        .to_string();
    let mut rules: Vec<Rule> = Vec::new();
    for line in doc.iter().skip_while(|l| l.trim() != "rules:").skip(1) {
        let item = line.trim_start();
        let (starts, field) = match item.strip_prefix("- ") {
            Some(f) => (true, f),
            None => (false, item),
        };
        if starts {
            rules.push(Rule::default());
        }
        let rule = rules
            .last_mut()
            .unwrap_or_else(|| panic!("a rule field before the first rule: {line:?}"));
        let (key, value) = field
            .split_once(": ")
            .unwrap_or_else(|| panic!("not `key: [..]`: {line:?}"));
        let list = flow_list(value).unwrap_or_else(|| panic!("not a flow list: {line:?}"));
        match key {
            "apiGroups" => rule.api_groups = list,
            "resources" => rule.resources = list,
            "verbs" => rule.verbs = list,
            "resourceNames" => rule.resource_names = list,
            _ => panic!("unknown rule field in ClusterRole {name}: {line:?}"),
        }
    }
    Some(ClusterRole { name, rules })
}

/// `[a, "b", '']` -> a, b, (empty).
fn flow_list(value: &str) -> Option<Vec<String>> {
    let inner = value.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some(
        inner
            .split(',')
            .map(|s| s.trim().trim_matches('"').trim_matches('\'').to_string())
            .filter(|s| !s.is_empty() || inner.contains("\"\"") || inner.contains("''"))
            .collect(),
    )
}
