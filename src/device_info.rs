//! Device-info files of the network plumbing specification: where a
//! device plugin (`dp/`) and a network's CNI plugin (`cni/`) keep them, how
//! a network's file is prepared before its plugin runs, and how its content
//! is read, as multus reads it, for the pod's network-status.
//!
//! Shared by selection (the `CNIDeviceInfoFile` a network is given), the
//! engine (which removes a network's file with its DEL) and the Kubernetes
//! side (which copies and reads them); it depends on none of them.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Where device plugins (`dp/`) and CNI plugins (`cni/`) keep device-info
/// files.
pub const DEFAULT_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo";
/// The largest device-info file read or copied.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The device a network uses (the NAD client's `DeviceInfo`), as found in
/// the CNI device-info file. Only these keys survive, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciDevice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vdpa: Option<VdpaDevice>,
    #[serde(rename = "vhost-user", skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<VhostDevice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memif: Option<MemifDevice>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PciDevice {
    #[serde(rename = "pci-address", skip_serializing_if = "String::is_empty")]
    pub pci_address: String,
    #[serde(rename = "vhost-net", skip_serializing_if = "String::is_empty")]
    pub vhost_net: String,
    #[serde(rename = "rdma-device", skip_serializing_if = "String::is_empty")]
    pub rdma_device: String,
    #[serde(rename = "pf-pci-address", skip_serializing_if = "String::is_empty")]
    pub pf_pci_address: String,
    #[serde(
        rename = "representor-device",
        skip_serializing_if = "String::is_empty"
    )]
    pub representor_device: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VdpaDevice {
    #[serde(rename = "parent-device", skip_serializing_if = "String::is_empty")]
    pub parent_device: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub driver: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(rename = "pci-address", skip_serializing_if = "String::is_empty")]
    pub pci_address: String,
    #[serde(rename = "pf-pci-address", skip_serializing_if = "String::is_empty")]
    pub pf_pci_address: String,
    #[serde(
        rename = "representor-device",
        skip_serializing_if = "String::is_empty"
    )]
    pub representor_device: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VhostDevice {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemifDevice {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub role: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

impl DeviceInfo {
    /// Reads a CNI device-info file's content as multus does; `None` when
    /// Go's decoder would fail (not JSON, trailing data, a key of the known
    /// ones with a value of the wrong type). `null` is an empty device info.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let mut info = DeviceInfo::default();
        let mut de = serde_json::Deserializer::from_slice(bytes);
        Merge(&mut info).deserialize(&mut de).ok()?;
        de.end().ok()?;
        Some(info)
    }

    /// [`DeviceInfo::parse`] for an already parsed value.
    pub fn from_value(value: &Value) -> Option<Self> {
        let mut info = DeviceInfo::default();
        Merge(&mut info).deserialize(value).ok()?;
        Some(info)
    }
}

/// A struct of the device info as Go's decoder fills it: known keys by
/// exact or case-folded name, later keys overwriting earlier ones, `null`
/// leaving a string alone, nested objects merged into what is there.
trait GoStruct: Default {
    const KEYS: &'static [&'static str];
    /// Sets field `index` from the map's next value.
    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error>;
}

/// Reads a JSON object (or `null`, a no-op) into an existing struct.
struct Merge<'a, T>(&'a mut T);

impl<'de, T: GoStruct> DeserializeSeed<'de> for Merge<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: GoStruct> Visitor<'de> for Merge<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object or null")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match field_index(T::KEYS, &key) {
                Some(i) => self.0.set(i, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Go's field matching: the exact name, else the name under Go's case
/// folding.
fn field_index(keys: &[&str], key: &str) -> Option<usize> {
    keys.iter()
        .position(|k| *k == key)
        .or_else(|| keys.iter().position(|k| go_fold_eq(k, key)))
}

/// Whether `key` folds to the ASCII name `name` as Go's `foldName`
/// (`ToUpper(ToLower(r))` per rune) folds it. The non-ASCII runes that fold
/// to ASCII are the Kelvin sign, long s and the dotted and dotless i.
fn go_fold_eq(name: &str, key: &str) -> bool {
    let fold = |c: char| match c {
        '\u{212A}' => 'K',
        '\u{017F}' => 'S',
        '\u{0130}' | '\u{0131}' => 'I',
        c => c.to_ascii_uppercase(),
    };
    name.chars()
        .map(|c| c.to_ascii_uppercase())
        .eq(key.chars().map(fold))
}

/// A string field: `null` keeps the old value, as in Go.
fn set_string<'de, A: MapAccess<'de>>(field: &mut String, map: &mut A) -> Result<(), A::Error> {
    if let Some(s) = map.next_value::<Option<String>>()? {
        *field = s;
    }
    Ok(())
}

/// A pointer-to-struct field: `null` clears it, an object merges into it.
fn set_nested<'de, A: MapAccess<'de>, T: GoStruct>(
    field: &mut Option<T>,
    map: &mut A,
) -> Result<(), A::Error> {
    let mut seed = NestedSeed(field.take().unwrap_or_default(), false);
    map.next_value_seed(&mut seed)?;
    *field = seed.1.then_some(seed.0);
    Ok(())
}

/// The value of a nested field and whether it was other than `null`.
struct NestedSeed<T>(T, bool);

impl<'de, T: GoStruct> DeserializeSeed<'de> for &mut NestedSeed<T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T: GoStruct> Visitor<'de> for &mut NestedSeed<T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.1 = false;
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.1 = false;
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.1 = true;
        d.deserialize_map(Merge(&mut self.0))
    }
}

impl GoStruct for DeviceInfo {
    const KEYS: &'static [&'static str] =
        &["type", "version", "pci", "vdpa", "vhost-user", "memif"];

    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error> {
        match index {
            0 => set_string(&mut self.kind, map),
            1 => set_string(&mut self.version, map),
            2 => set_nested(&mut self.pci, map),
            3 => set_nested(&mut self.vdpa, map),
            4 => set_nested(&mut self.vhost_user, map),
            _ => set_nested(&mut self.memif, map),
        }
    }
}

impl GoStruct for PciDevice {
    const KEYS: &'static [&'static str] = &[
        "pci-address",
        "vhost-net",
        "rdma-device",
        "pf-pci-address",
        "representor-device",
    ];

    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error> {
        let field = match index {
            0 => &mut self.pci_address,
            1 => &mut self.vhost_net,
            2 => &mut self.rdma_device,
            3 => &mut self.pf_pci_address,
            _ => &mut self.representor_device,
        };
        set_string(field, map)
    }
}

impl GoStruct for VdpaDevice {
    const KEYS: &'static [&'static str] = &[
        "parent-device",
        "driver",
        "path",
        "pci-address",
        "pf-pci-address",
        "representor-device",
    ];

    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error> {
        let field = match index {
            0 => &mut self.parent_device,
            1 => &mut self.driver,
            2 => &mut self.path,
            3 => &mut self.pci_address,
            4 => &mut self.pf_pci_address,
            _ => &mut self.representor_device,
        };
        set_string(field, map)
    }
}

impl GoStruct for VhostDevice {
    const KEYS: &'static [&'static str] = &["mode", "path"];

    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error> {
        let field = match index {
            0 => &mut self.mode,
            _ => &mut self.path,
        };
        set_string(field, map)
    }
}

impl GoStruct for MemifDevice {
    const KEYS: &'static [&'static str] = &["role", "path", "mode"];

    fn set<'de, A: MapAccess<'de>>(&mut self, index: usize, map: &mut A) -> Result<(), A::Error> {
        let field = match index {
            0 => &mut self.role,
            1 => &mut self.path,
            _ => &mut self.mode,
        };
        set_string(field, map)
    }
}

/// Reading a `NetworkStatus` back (e.g. from an annotation) keeps the
/// device info's known keys.
impl<'de> Deserialize<'de> for DeviceInfo {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut info = DeviceInfo::default();
        Merge(&mut info).deserialize(d)?;
        Ok(info)
    }
}

/// Reads at most `max` bytes of a regular file (not through a symlink).
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// A file name as multus builds it: every `/` turned into `-`.
fn file_name(name: String) -> String {
    name.replace('/', "-")
}

/// The device-info file a network's plugin may write (the
/// `CNIDeviceInfoFile` capability argument):
/// `<dir>/cni/<network>-<containerID>_<ifname>`.
pub fn cni_file(dir: &Path, network: &str, container_id: &str, ifname: &str) -> PathBuf {
    dir.join("cni")
        .join(file_name(format!("{network}-{container_id}_{ifname}")))
}

/// The device-info file a device plugin wrote for a device:
/// `<dir>/dp/<resourceName>-<deviceID>-device.json`.
pub fn dp_file(dir: &Path, resource: &str, device_id: &str) -> PathBuf {
    dir.join("dp")
        .join(file_name(format!("{resource}-{device_id}-device.json")))
}

/// Whether `path` is a file directly in `<dir>/cni/` (the only files
/// Plexus writes or removes there).
pub fn is_cni_file(dir: &Path, path: &Path) -> bool {
    let cni = dir.join("cni");
    path.parent() == Some(cni.as_path())
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.is_empty() && n != "." && n != "..")
}

/// What [`remove_cni_file`] did with a network's device-info file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// It was removed.
    Removed,
    /// There was none.
    Missing,
    /// It is not a regular file directly in the directory's `cni/` (a
    /// symbolic link, never followed, a directory, a path elsewhere):
    /// left as it is, for the reason given.
    LeftAlone(&'static str),
}

/// After a network's DEL: removes its device-info file `path`, as
/// multus's DEL does, but only a regular file directly in `<dir>/cni/`.
/// Neither `cni/` nor the file is followed if it is a symbolic link: the
/// directory is opened without following one, and the file is looked up
/// and unlinked relative to it. A missing file is no error. Blocking.
pub fn remove_cni_file(dir: &Path, path: &Path) -> io::Result<Removed> {
    use nix::errno::Errno;
    use nix::fcntl::AtFlags;
    use nix::sys::stat::{fstatat, SFlag};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    use std::os::unix::fs::OpenOptionsExt;

    let name = match path.file_name() {
        Some(n) if is_cni_file(dir, path) => n,
        _ => return Ok(Removed::LeftAlone("it is not directly in cni/")),
    };
    let cni = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir.join("cni"));
    let cni = match cni {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removed::Missing),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return Ok(Removed::LeftAlone("cni/ is not a directory"))
        }
        Err(e) => return Err(e),
    };
    let stat = match fstatat(&cni, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(Errno::ENOENT) => return Ok(Removed::Missing),
        Err(e) => return Err(e.into()),
    };
    match SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => {}
        SFlag::S_IFLNK => return Ok(Removed::LeftAlone("it is a symbolic link")),
        SFlag::S_IFDIR => return Ok(Removed::LeftAlone("it is a directory")),
        _ => return Ok(Removed::LeftAlone("it is not a regular file")),
    }
    match unlinkat(&cni, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(Removed::Removed),
        Err(Errno::ENOENT) => Ok(Removed::Missing),
        Err(e) => Err(e.into()),
    }
}

/// Before a network's plugin runs: copies the device plugin's file for
/// the device, if there is one, to the network's device-info file (as
/// multus). `Ok(false)`: there was none. Blocking.
pub fn copy_from_dp(dp: &Path, cni: &Path) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let bytes = match read_bounded(dp, MAX_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if let Some(parent) = cni.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Written beside and renamed over: a reader never sees half a file,
    // and a link planted at the name is replaced, never followed.
    let tmp = cni.with_file_name(format!(
        ".{}.tmp",
        cni.file_name().and_then(|n| n.to_str()).unwrap_or("device")
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, &bytes)?;
    drop(f);
    std::fs::rename(&tmp, cni)?;
    Ok(true)
}

/// After a network's plugin ran: the device-info file's content, if it
/// has one that reads as device information. Blocking.
pub fn load(cni: &Path) -> Option<DeviceInfo> {
    let bytes = match read_bounded(cni, MAX_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %cni.display(), cause = %e, "cannot read a device-info file");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(info) => Some(info),
        Err(e) => {
            tracing::warn!(file = %cni.display(), cause = %e, "a device-info file is not device information");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn file_names_should_be_multus_names() {
        let dir = Path::new("/var/run/k8s.cni.cncf.io/devinfo");
        assert_eq!(
            cni_file(dir, "default/sriov-net", "3f8a", "net1"),
            Path::new("/var/run/k8s.cni.cncf.io/devinfo/cni/default-sriov-net-3f8a_net1")
        );
        assert_eq!(
            dp_file(dir, "intel.com/sriov_a", "0000:03:00.1"),
            Path::new(
                "/var/run/k8s.cni.cncf.io/devinfo/dp/intel.com-sriov_a-0000:03:00.1-device.json"
            )
        );
        assert!(is_cni_file(dir, &cni_file(dir, "a/b", "c", "d")));
        assert!(!is_cni_file(dir, Path::new("/etc/passwd")));
        assert!(!is_cni_file(
            dir,
            Path::new("/var/run/k8s.cni.cncf.io/devinfo/cni/../x")
        ));
        assert!(!is_cni_file(
            dir,
            Path::new("/var/run/k8s.cni.cncf.io/devinfo/cni")
        ));
    }

    #[test]
    fn removal_should_take_only_regular_files_directly_in_cni() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("devinfo");
        let cni = dir.join("cni");
        // No cni/ yet: nothing to remove.
        let file = cni_file(&dir, "default/net", "c1", "net1");
        assert_eq!(remove_cni_file(&dir, &file).unwrap(), Removed::Missing);
        std::fs::create_dir_all(&cni).unwrap();
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(remove_cni_file(&dir, &file).unwrap(), Removed::Removed);
        assert!(!file.exists());
        assert_eq!(remove_cni_file(&dir, &file).unwrap(), Removed::Missing);
        // A link is neither followed nor removed; nor is a directory.
        let target = tmp.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        symlink(&target, &file).unwrap();
        assert!(matches!(
            remove_cni_file(&dir, &file).unwrap(),
            Removed::LeftAlone(_)
        ));
        assert!(file.symlink_metadata().is_ok());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let sub = cni.join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(
            remove_cni_file(&dir, &sub).unwrap(),
            Removed::LeftAlone(_)
        ));
        assert!(sub.is_dir());
        // Nothing outside cni/, and nothing through a cni/ that is a link.
        assert!(matches!(
            remove_cni_file(&dir, &target).unwrap(),
            Removed::LeftAlone(_)
        ));
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("f"), b"keep").unwrap();
        let linked = tmp.path().join("linked");
        std::fs::create_dir(&linked).unwrap();
        symlink(&elsewhere, linked.join("cni")).unwrap();
        assert!(matches!(
            remove_cni_file(&linked, &linked.join("cni/f")).unwrap(),
            Removed::LeftAlone(_)
        ));
        assert_eq!(std::fs::read(elsewhere.join("f")).unwrap(), b"keep");
    }

    #[test]
    fn device_info_should_be_read_as_go_reads_it() {
        // Unknown keys dropped, keys case-folded, nested objects merged,
        // later keys win, null leaves a string alone.
        let d = DeviceInfo::parse(
            br#"{"extra": [1, {"x": 2}], "Type": "vdpa", "type": "pci", "VERSION": "1.0.0",
                "vdpa": {"driver": "vhost", "path": "/dev/vhost-vdpa-0"},
                "vdpa": {"PARENT-DEVICE": "vdpa:0000:65:00.2", "path": null},
                "memif": null, "vhost-user": {"mode": "client"}, "vhost-user": null,
                "pc\u0131": {"pci-address": "0000:65:00.2"}}"#,
        )
        .unwrap();
        assert_eq!(d.kind, "pci");
        assert_eq!(d.version, "1.0.0");
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"type":"pci","version":"1.0.0","pci":{"pci-address":"0000:65:00.2"},"vdpa":{"parent-device":"vdpa:0000:65:00.2","driver":"vhost","path":"/dev/vhost-vdpa-0"}}"#
        );
        // An empty nested object stays, as an empty Go struct does.
        let d = DeviceInfo::parse(br#"{"memif": {}}"#).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), r#"{"memif":{}}"#);
        // null is an empty device info.
        assert_eq!(DeviceInfo::parse(b" null "), Some(DeviceInfo::default()));
        // What Go's decoder refuses is no device info.
        for bad in [
            &b""[..],
            b"{",
            b"[]",
            b"\"pci\"",
            br#"{"type": 1}"#,
            br#"{"pci": "0000:65:00.2"}"#,
            br#"{"pci": {"pci-address": ["x"]}}"#,
            br#"{} {}"#,
        ] {
            assert_eq!(
                DeviceInfo::parse(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let v = json!({"type": "memif", "memif": {"role": "master", "mode": "ethernet", "path": "/run/memif.sock"}});
        assert_eq!(
            serde_json::to_string(&DeviceInfo::from_value(&v).unwrap()).unwrap(),
            r#"{"type":"memif","memif":{"role":"master","path":"/run/memif.sock","mode":"ethernet"}}"#
        );
    }
}
