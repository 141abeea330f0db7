//! daemon-config.json: parsing and validation (`Config::from_json`). No
//! input may panic; an accepted file must give values the daemon can use.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use plexus::api;
use plexus::config::Config;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("/etc/plexus/daemon-config.json");
    match Config::from_json(path, data) {
        Ok(config) => {
            assert!(config.server.body_budget_bytes >= api::MAX_BODY_BYTES);
            assert!(!config.server.read_timeout.is_zero());
            assert!(!config.cni.plugin_timeout.is_zero());
            assert!(config.lifecycle.idle_timeout.is_none_or(|d| !d.is_zero()));
            // A call that sets nothing gets the file's selection, or says
            // what it lacks; it never panics.
            if let Ok(selection) = config.selection.effective(&serde_json::Map::new()) {
                assert!(!selection.cluster_network.is_empty() || !selection.delegates.is_empty());
            }
            assert!(!config.kubernetes.request_timeout.is_zero());
            // Every reported unknown key is in the file.
            let raw: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(data).unwrap_or_default();
            assert!(config.unknown_keys.iter().all(|k| raw.contains_key(k)));
        }
        Err(e) => {
            // Always says what is wrong.
            assert!(!e.problems.is_empty());
            let _ = e.to_string();
        }
    }
});
