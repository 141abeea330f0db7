//! `POST /cni` bodies: the JSON the daemon decodes into an `api::Request`,
//! then every check the handler makes before the engine runs (environment,
//! CNI_ARGS, PLEXUS_NETWORKS, the network configuration, GC's valid
//! attachments, network selection). None of it may panic, whatever the
//! body; a decoded request must survive the shim's encoding unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus::api::Request;
use plexus::api::Command;
use plexus::netconf::{self, Invocation};
use plexus::{handler, selection};

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<Request>(data) else {
        return;
    };

    // The shim encodes what the daemon decodes: env and config survive.
    let wire = serde_json::to_vec(&request).expect("a Request always encodes");
    let again: Request = serde_json::from_slice(&wire).expect("an encoded Request decodes");
    assert_eq!(again.env, request.env);
    assert_eq!(again.config, request.config);

    // The handler's checks, in its order.
    if netconf::validate_env(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))).is_err() {
        return;
    }
    let Ok(inv) = Invocation::from_env(|k| request.env.get(k).cloned()) else {
        return;
    };
    if inv.command.has_attachment() {
        assert!(netconf::is_valid_container_id(&inv.container_id));
        assert!(netconf::validate_ifname(&inv.ifname).is_ok());
    }
    let Ok((requested, rest)) = selection::take_from_args(&inv.arg_pairs) else {
        return;
    };
    assert!(requested.len() <= selection::MAX_NETWORKS);
    assert!(rest.iter().all(|(k, _)| k != selection::ARGS_KEY));
    let Ok(config) = handler::parse_config(&request.config) else {
        return;
    };
    match inv.command {
        Command::Add | Command::Del => {
            let static_config = selection::Config::new("cluster", vec!["extra".into()]);
            if let Ok(selected) = selection::select(&static_config, &inv.ifname, &requested) {
                assert!(selected.len() <= selection::MAX_NETWORKS);
                assert!(selected[0].is_primary() && selected[0].ifname == inv.ifname);
                let mut names: Vec<_> = selected.iter().map(|s| s.ifname.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                assert_eq!(names.len(), selected.len(), "duplicate interface names");
            }
        }
        Command::Gc => {
            let _ = handler::valid_attachments(&config);
        }
        Command::Check | Command::Status | Command::Version => {}
    }
});
