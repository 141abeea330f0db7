//! multus's on-disk caches, read so that plexusd can DEL, CHECK and GC the
//! containers multus attached before the node switched to plexusd.
//!
//! Both live in multus's `cniDir` (default `/var/lib/cni/multus`):
//!
//! - the delegate cache `<cniDir>/<containerID>`: a JSON array, one object
//!   per network in multus's order (the first is the primary), whose
//!   `Bytes` is the base64 of the exact configuration multus ran, with the
//!   interface name and capability requests of the selection element;
//! - libcni's result cache `<cniDir>/results/<network>-<containerID>-<ifname>`
//!   (`kind` `cniCacheV1`): per network that was added, the final result
//!   (DEL's and CHECK's `prevResult`), `CNI_ARGS`, capability arguments and
//!   namespace of its ADD.
//!
//! Nothing here follows a symbolic link, waits on a FIFO or reads more than
//! [`MAX_CACHE_BYTES`]; a file that cannot be used is [`Error::Damaged`],
//! which the engine moves aside, never deletes, and `show` reports
//! ([`Caches::seen`] only reads). [`Caches`] only reads and removes files,
//! blocking. The engine's DEL, CHECK and GC of such containers are
//! [`crate::cni::engine`]'s (`engine/multus.rs`); docs/records.md says what
//! they do with the caches.

use std::path::{Path, PathBuf};
use std::{fs, io};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cni::state::{read_regular, Unreadable};
use crate::names::{check_ifname, is_valid_name};
use crate::netconf::{self, ConfigError, NetworkList};

/// multus's default `cniDir`.
pub const DEFAULT_CNI_DIR: &str = "/var/lib/cni/multus";
/// Longest cache file read; multus's and libcni's are a few KiB.
pub const MAX_CACHE_BYTES: u64 = 4 << 20;
/// The `kind` of libcni's result cache files.
pub const RESULT_KIND: &str = "cniCacheV1";
/// The directory of libcni's result cache, inside `cniDir`.
const RESULTS: &str = "results";

/// Why a cache could not be used: the state's own error, whose
/// [`Error::Damaged`] names the file a [`MULTUS_CACHE`].
pub use crate::cni::state::Error;

/// What a damaged file of multus's is, in messages.
pub const MULTUS_CACHE: &str = "multus cache";

/// One network of multus's delegate cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedDelegate {
    /// multus's name for it (`<namespace>/<nad>`, or the network's name).
    pub name: String,
    /// The network's (CNI) name, which libcni's cache file names carry.
    pub network: String,
    /// The configuration multus ran (`Bytes`), as a JSON object.
    config: Map<String, Value>,
    /// Whether `config` is a list (`ConfList.plugins` not empty), else a
    /// single plugin's configuration.
    conflist: bool,
    /// The selection element's `interface`.
    ifname_request: Option<String>,
    /// The selection element's capability requests (ips, mac, ...).
    requests: Map<String, Value>,
}

impl CachedDelegate {
    /// multus's interface name for the delegate at `index`: the requested
    /// one, else the runtime's `CNI_IFNAME` (`primary_ifname`) for the
    /// primary (index 0), else `net<index>`.
    pub fn ifname(&self, index: usize, primary_ifname: &str) -> String {
        match &self.ifname_request {
            Some(name) => name.clone(),
            None if index == 0 => primary_ifname.to_string(),
            None => format!("net{index}"),
        }
    }

    /// Whether its interface name is the runtime's `CNI_IFNAME`.
    pub fn takes_call_ifname(&self, index: usize) -> bool {
        index == 0 && self.ifname_request.is_none()
    }

    /// The configuration as a network list. A list without `cniVersion`
    /// gets `version` (multus gives it its own; libcni's cached config
    /// holds what was used), else "1.0.0".
    pub fn list(&self, version: Option<&str>) -> Result<NetworkList, ConfigError> {
        let mut config = self.config.clone();
        if !config.contains_key("cniVersion") {
            config.insert(
                "cniVersion".into(),
                Value::String(version.unwrap_or("1.0.0").to_string()),
            );
        }
        NetworkList::from_value(
            Path::new(&format!("<multus cache of network {}>", self.network)),
            Value::Object(config),
            !self.conflist,
        )
    }

    /// The device ID the selection element asked for (`deviceID`).
    pub fn device_id(&self) -> Option<&str> {
        self.requests.get("deviceID").and_then(Value::as_str)
    }

    /// The capability arguments multus would give it: the call's, with
    /// the selection element's requests in their place.
    pub fn capability_args(&self, call: &Map<String, Value>) -> Map<String, Value> {
        let mut out = call.clone();
        out.extend(self.requests.clone());
        out
    }
}

/// libcni's cached ADD of one network.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedResult {
    pub path: PathBuf,
    pub container_id: String,
    pub network: String,
    pub ifname: String,
    /// `CNI_NETNS` of the ADD (empty when not recorded).
    pub netns: String,
    /// `CNI_ARGS` of the ADD, joined as a runtime passes them.
    pub cni_args: Option<String>,
    pub capability_args: Option<Map<String, Value>>,
    /// The final result: DEL's and CHECK's `prevResult`.
    pub result: Option<Value>,
    /// `cniVersion` of the configuration cached with it.
    pub config_version: Option<String>,
}

/// One network of a container multus attached, as `show` reports it.
#[derive(Debug)]
pub struct SeenNetwork {
    pub delegate: CachedDelegate,
    /// The interface multus gave it; `None` for a primary on the runtime's
    /// `CNI_IFNAME` when no result cache tells which that was.
    pub ifname: Option<String>,
    /// libcni's cached ADD of it; a file that is damaged or cannot be
    /// read is its error.
    pub result: Result<Option<CachedResult>, Error>,
}

/// multus's caches in one `cniDir`.
#[derive(Debug, Clone)]
pub struct Caches {
    dir: PathBuf,
}

/// One delegate cache entry as multus writes it (Go field names).
#[derive(Deserialize)]
struct RawDelegate {
    #[serde(rename = "Name", default)]
    name: Option<String>,
    #[serde(rename = "ConfList", default)]
    conf_list: Option<Value>,
    #[serde(rename = "Bytes", default)]
    bytes: Option<String>,
    #[serde(rename = "ifnameRequest", default)]
    ifname_request: Option<String>,
    #[serde(rename = "macRequest", default)]
    mac_request: Option<String>,
    #[serde(rename = "infinibandGUIDRequest", default)]
    guid_request: Option<String>,
    #[serde(rename = "ipRequest", default)]
    ip_request: Option<Vec<String>>,
    #[serde(rename = "deviceID", default)]
    device_id: Option<String>,
}

/// A libcni result cache file as libcni writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawResult {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    container_id: String,
    #[serde(default)]
    config: Option<String>,
    #[serde(default)]
    if_name: String,
    #[serde(default)]
    network_name: String,
    #[serde(default)]
    netns: Option<String>,
    #[serde(default)]
    cni_args: Option<Vec<(String, String)>>,
    #[serde(default)]
    capability_args: Option<Map<String, Value>>,
    #[serde(default)]
    result: Option<Value>,
}

impl Caches {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<cniDir>/<containerID>`; `container_id` must be a valid one.
    pub fn delegates_path(&self, container_id: &str) -> PathBuf {
        self.dir.join(container_id)
    }

    /// `<cniDir>/results/<network>-<containerID>-<ifname>`; every part
    /// must have passed its name check.
    pub fn result_path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.dir
            .join(RESULTS)
            .join(format!("{network}-{container_id}-{ifname}"))
    }

    /// multus's delegates for `container_id`, in multus's order; `None`
    /// when it left no delegate cache for it.
    pub fn load(&self, container_id: &str) -> Result<Option<Vec<CachedDelegate>>, Error> {
        if !netconf::is_valid_container_id(container_id) || container_id == RESULTS {
            return Ok(None);
        }
        let path = self.delegates_path(container_id);
        let Some(text) = read(&path)? else {
            return Ok(None);
        };
        parse_delegates(&text)
            .map(Some)
            .map_err(|why| Error::Damaged {
                what: MULTUS_CACHE,
                path,
                why,
            })
    }

    /// libcni's cached ADD of `network` on `ifname` for `container_id`.
    pub fn load_result(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CachedResult>, Error> {
        let path = self.result_path(network, container_id, ifname);
        let Some(text) = read(&path)? else {
            return Ok(None);
        };
        let r = parse_result(&path, &text)?;
        let expected = (container_id, network, ifname);
        if (
            r.container_id.as_str(),
            r.network.as_str(),
            r.ifname.as_str(),
        ) != expected
        {
            return Err(Error::Damaged {
                what: MULTUS_CACHE,
                path,
                why: format!(
                    "it holds network {:?} of container {:?} on {:?}, not network {network:?} of container {container_id:?} on {ifname:?}",
                    r.network, r.container_id, r.ifname
                ),
            });
        }
        Ok(Some(r))
    }

    /// The ids of the containers with a delegate cache file (readable or
    /// not), sorted; none when `cniDir` does not exist.
    pub fn containers(&self) -> Result<Vec<String>, Error> {
        let mut ids: Vec<String> = list_names(&self.dir)?
            .into_iter()
            .filter(|n| n != RESULTS && netconf::is_valid_container_id(n))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Every readable entry of libcni's result cache, sorted by file
    /// name; files that do not parse are skipped (as libcni does).
    pub fn results(&self) -> Result<Vec<CachedResult>, Error> {
        let dir = self.dir.join(RESULTS);
        let mut names = list_names(&dir)?;
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            match read(&path) {
                Ok(Some(text)) => {
                    if let Ok(r) = parse_result(&path, &text) {
                        out.push(r);
                    }
                }
                Ok(None) | Err(Error::Damaged { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// What multus left for `container_id`, for `show`: its networks in
    /// multus's order, each with the interface name multus gave it and
    /// libcni's cached ADD. Reads only: nothing is moved, removed or
    /// followed. A damaged delegate cache is the error; a damaged result
    /// cache is its network's. The primary's interface, when it is the
    /// runtime's `CNI_IFNAME` (which multus does not cache), is the one
    /// in the name of the primary network's result cache for the
    /// container (its content naming the same); `names` is
    /// [`Caches::result_names`] when already listed. Blocking.
    pub fn seen(
        &self,
        container_id: &str,
        names: Option<&[String]>,
    ) -> Result<Option<Vec<SeenNetwork>>, Error> {
        let Some(delegates) = self.load(container_id)? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(delegates.len());
        for (i, d) in delegates.iter().enumerate() {
            let (ifname, result) = if d.takes_call_ifname(i) {
                self.seen_primary(container_id, &delegates, names)
            } else {
                let ifname = d.ifname(i, "");
                let result = self.load_result(&d.network, container_id, &ifname);
                (Some(ifname), result)
            };
            out.push(SeenNetwork {
                delegate: d.clone(),
                ifname,
                result,
            });
        }
        Ok(Some(out))
    }

    /// The interface and cached ADD of primary `delegates[0]`, which took
    /// the runtime's `CNI_IFNAME`: from the first file named
    /// `<network>-<containerID>-<ifname>` whose content says so (an
    /// interface another delegate of the same network has is not it). A
    /// damaged file stands for it only when no readable one does and its
    /// name can be no other container's.
    fn seen_primary(
        &self,
        container_id: &str,
        delegates: &[CachedDelegate],
        names: Option<&[String]>,
    ) -> (Option<String>, Result<Option<CachedResult>, Error>) {
        let listed;
        let names = match names {
            Some(n) => n,
            None => match self.result_names() {
                Ok(n) => {
                    listed = n;
                    &listed
                }
                Err(e) => return (None, Err(e)),
            },
        };
        let Some(primary) = delegates.first() else {
            return (None, Ok(None));
        };
        let taken: Vec<String> = delegates
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, d)| d.network == primary.network)
            .map(|(i, d)| d.ifname(i, ""))
            .collect();
        let prefix = format!("{}-{container_id}-", primary.network);
        let mut damaged = None;
        for name in names {
            let Some(ifname) = name.strip_prefix(&prefix) else {
                continue;
            };
            if check_ifname(ifname).is_err() || taken.iter().any(|t| t == ifname) {
                continue;
            }
            match self.read_result(name) {
                Ok(Some(r)) if is_own(&r, name, container_id) => {
                    return (Some(ifname.to_string()), Ok(Some(r)))
                }
                Ok(_) => {}
                Err(e) => {
                    if damaged.is_none()
                        && only_reading_is(name, container_id, Some(&primary.network))
                    {
                        damaged = Some((ifname.to_string(), e));
                    }
                }
            }
        }
        match damaged {
            Some((ifname, e)) => (Some(ifname), Err(e)),
            None => (None, Ok(None)),
        }
    }

    /// The names in libcni's result cache directory, sorted; none when it
    /// does not exist.
    pub fn result_names(&self) -> Result<Vec<String>, Error> {
        let mut names = list_names(&self.dir.join(RESULTS))?;
        names.sort();
        Ok(names)
    }

    /// libcni's result cache files of `container_id`, once the container
    /// is gone (for their removal): every readable file that names the
    /// container and bears the name libcni gives it
    /// (`<networkName>-<containerId>-<ifName>` of its content), and every
    /// damaged file ([`Error::Damaged`]) whose name is the container's
    /// for one of `known`'s `(network, ifname)` pairs, or cannot be any
    /// other container's (no way of reading it as
    /// `<network>-<containerID>-<ifname>` gives another id). A file that
    /// cannot be read is its [`Error::Io`]. Nothing else is taken: a file
    /// of a container whose id merely starts or ends like this one's is
    /// left out, and so is a damaged file whose name another id could have
    /// written. Only reads; blocking.
    pub fn results_of(
        &self,
        container_id: &str,
        known: &[(String, String)],
    ) -> Result<Vec<Result<CachedResult, Error>>, Error> {
        let needle = format!("-{container_id}-");
        let mut out = Vec::new();
        for name in self.result_names()? {
            if !name.contains(&needle) {
                continue;
            }
            match self.read_result(&name) {
                Ok(Some(r)) if is_own(&r, &name, container_id) => out.push(Ok(r)),
                Ok(_) => {}
                Err(e @ Error::Damaged { .. }) => {
                    let exact = known
                        .iter()
                        .any(|(net, ifname)| name == format!("{net}-{container_id}-{ifname}"));
                    if exact || only_reading_is(&name, container_id, None) {
                        out.push(Err(e));
                    }
                }
                Err(e) => out.push(Err(e)),
            }
        }
        Ok(out)
    }

    /// Result cache file `name`, read and parsed but its names not
    /// compared; `None` when it is gone.
    fn read_result(&self, name: &str) -> Result<Option<CachedResult>, Error> {
        let path = self.dir.join(RESULTS).join(name);
        match read(&path)? {
            Some(text) => parse_result(&path, &text).map(Some),
            None => Ok(None),
        }
    }

    /// Removes a cache file (no error when it is gone already).
    pub fn remove(&self, path: &Path) -> Result<(), Error> {
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                path: path.to_path_buf(),
                what: "cannot remove the multus cache file",
                source,
            }),
        }
    }
}

/// Whether result `r`, read from the file called `name`, is
/// `container_id`'s: it names the container, and the file bears the name
/// libcni gives it.
fn is_own(r: &CachedResult, name: &str, container_id: &str) -> bool {
    r.container_id == container_id && name == format!("{}-{container_id}-{}", r.network, r.ifname)
}

/// Whether result cache file name `name` can only be `container_id`'s:
/// of every way to read it as `<network>-<containerID>-<ifname>` (each a
/// valid name; the network `network` when given), at least one reads
/// `container_id` and none another id. Names and ids may hold `-`, so
/// `n-a-b-eth0` is container `a`'s on `b-eth0` as well as `a-b`'s on
/// `eth0`, and belongs to neither by its name alone.
fn only_reading_is(name: &str, container_id: &str, network: Option<&str>) -> bool {
    let dashes: Vec<usize> = name.match_indices('-').map(|(i, _)| i).collect();
    let mut ours = false;
    for (k, &a) in dashes.iter().enumerate() {
        let net = &name[..a];
        if network.is_some_and(|n| n != net) || !is_valid_name(net) {
            continue;
        }
        for &b in &dashes[k + 1..] {
            let (id, ifname) = (&name[a + 1..b], &name[b + 1..]);
            if !netconf::is_valid_container_id(id) || check_ifname(ifname).is_err() {
                continue;
            }
            if id != container_id {
                return false;
            }
            ours = true;
        }
    }
    ours
}

/// [`read_regular`] of a cache file.
fn read(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    read_regular(path, MAX_CACHE_BYTES).map_err(|e| match e {
        Unreadable::Damaged(why) => Error::Damaged {
            what: MULTUS_CACHE,
            path: path.to_path_buf(),
            why,
        },
        Unreadable::Io(what, source) => Error::Io {
            path: path.to_path_buf(),
            what,
            source,
        },
    })
}

/// The names in `dir`; none when it does not exist.
fn list_names(dir: &Path) -> Result<Vec<String>, Error> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                path: dir.to_path_buf(),
                what: "cannot list the multus cache directory",
                source,
            })
        }
    };
    Ok(entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect())
}

/// A delegate cache's content; why not, when it cannot be used.
fn parse_delegates(text: &[u8]) -> Result<Vec<CachedDelegate>, String> {
    let raw: Vec<RawDelegate> =
        serde_json::from_slice(text).map_err(|e| format!("it does not parse: {e}"))?;
    raw.into_iter()
        .enumerate()
        .map(|(i, r)| parse_delegate(r).map_err(|why| format!("delegate {i}: {why}")))
        .collect()
}

fn parse_delegate(r: RawDelegate) -> Result<CachedDelegate, String> {
    let bytes = r
        .bytes
        .ok_or("it has no Bytes (the configuration multus ran)")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(bytes.as_bytes())
        .map_err(|e| format!("Bytes is not base64: {e}"))?;
    let config = match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err("Bytes does not hold a JSON object".into()),
        Err(e) => return Err(format!("Bytes does not hold JSON: {e}")),
    };
    let conflist = r
        .conf_list
        .as_ref()
        .and_then(|l| l.get("plugins"))
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    // multus leaves it out when empty, and treats "" as not requested.
    let ifname_request = r.ifname_request.filter(|n| !n.is_empty());
    if let Some(name) = &ifname_request {
        check_ifname(name).map_err(|e| format!("ifnameRequest {name:?}: {e}"))?;
    }
    let mut requests = Map::new();
    if let Some(mac) = r.mac_request.filter(|s| !s.is_empty()) {
        requests.insert("mac".into(), Value::String(mac));
    }
    if let Some(guid) = r.guid_request.filter(|s| !s.is_empty()) {
        requests.insert("infinibandGUID".into(), Value::String(guid));
    }
    if let Some(ips) = r.ip_request.filter(|v| !v.is_empty()) {
        requests.insert(
            "ips".into(),
            Value::Array(ips.into_iter().map(Value::String).collect()),
        );
    }
    if let Some(id) = r.device_id.filter(|s| !s.is_empty()) {
        requests.insert("deviceID".into(), Value::String(id));
    }
    let mut d = CachedDelegate {
        name: r.name.unwrap_or_default(),
        network: String::new(),
        config,
        conflist,
        ifname_request,
        requests,
    };
    // Refused here, not at DEL: a name that is not a file name, a plugin
    // type that is a path, a shim that would call the daemon.
    let list = d.list(None).map_err(|e| e.to_string())?;
    d.network = list.name;
    Ok(d)
}

/// A result cache file's content, its names not yet compared.
fn parse_result(path: &Path, text: &[u8]) -> Result<CachedResult, Error> {
    let damaged = |why: String| Error::Damaged {
        what: MULTUS_CACHE,
        path: path.to_path_buf(),
        why,
    };
    let raw: RawResult =
        serde_json::from_slice(text).map_err(|e| damaged(format!("it does not parse: {e}")))?;
    if raw.kind.as_deref() != Some(RESULT_KIND) {
        return Err(damaged(format!(
            "kind {:?} is not {RESULT_KIND:?}",
            raw.kind.unwrap_or_default()
        )));
    }
    if !netconf::is_valid_container_id(&raw.container_id) {
        return Err(damaged(format!(
            "containerId {:?} is not a container id",
            raw.container_id
        )));
    }
    let cni_args = match raw.cni_args {
        Some(pairs) if !pairs.is_empty() => {
            let joined = pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(";");
            netconf::validate_env_value("CNI_ARGS", &joined)
                .map_err(|e| damaged(format!("cniArgs: {}", e.msg)))?;
            Some(joined)
        }
        _ => None,
    };
    let netns = raw.netns.unwrap_or_default();
    netconf::validate_env_value("CNI_NETNS", &netns)
        .map_err(|e| damaged(format!("netns: {}", e.msg)))?;
    if raw.result.as_ref().is_some_and(|r| !r.is_object()) {
        return Err(damaged("result is not a JSON object".into()));
    }
    let config_version = raw
        .config
        .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    Ok(CachedResult {
        path: path.to_path_buf(),
        container_id: raw.container_id,
        network: raw.network_name,
        ifname: raw.if_name,
        netns,
        cni_args,
        capability_args: raw.capability_args,
        result: raw.result,
        config_version,
    })
}

#[cfg(test)]
#[path = "multus_cache_tests.rs"]
mod tests;
