//! The shim's own network config on stdin (`shim::Config::from_stdin`):
//! what every runtime call hands the shim before anything is sent. No
//! input may panic; an accepted config names a supported version, a
//! socket and a non-zero timeout.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus::result;
use plexus::shim::Config;

fuzz_target!(|data: &[u8]| {
    match Config::from_stdin(data) {
        Ok(config) => {
            assert!(result::is_supported(&config.cni_version));
            assert!(!config.socket.as_os_str().is_empty());
            assert!(!config.timeout.is_zero());
        }
        Err(e) => assert_ne!(e.code, 0),
    }
});
