//! The command line of `plexusd`, shared by the binary and by the
//! generator of its man page and shell completions.

use std::path::PathBuf;

use clap::Parser;

use crate::config;

/// The Plexus daemon: runs CNI plugin chains for the plexus-shim.
#[derive(Debug, Parser)]
#[command(name = "plexusd", version, about)]
pub struct Args {
    /// Daemon configuration file (multus daemon-config.json schema); also
    /// after a subcommand.
    #[arg(long, short = 'c', value_name = "FILE", default_value = config::DEFAULT_CONFIG_PATH, global = true)]
    pub config: PathBuf,
    /// Check the configuration as start-up would (keys, the directories
    /// plexusd writes, the configured networks and their plugins, the
    /// kubeconfig), report every problem and what is ignored, and exit:
    /// 0 when it is usable, 78 when not.
    #[arg(long)]
    pub check_config: bool,
    /// With --check-config: warnings (ignored or unknown keys, a missing
    /// file) fail the check too.
    #[arg(long, requires = "check_config")]
    pub strict: bool,
    #[command(subcommand)]
    pub command: Option<Sub>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    /// Print what is recorded for a container (networks, interfaces,
    /// addresses) as JSON, read from the state directory; without an id,
    /// every container. Only reads (safe while plexusd runs); a record that
    /// cannot be read is reported as damaged.
    Show {
        /// The container id (CNI_CONTAINERID).
        container_id: Option<String>,
    },
    /// Write the runtime's CNI configuration for plexus-shim
    /// (`<cniConfigDir>/00-plexus.conf`) from the primary network
    /// configuration in multusAutoconfigDir, as multus's auto configuration
    /// does, and exit. The file is replaced atomically and only when its
    /// content changes; when the primary is missing or cannot be read, the
    /// last good file stays and the exit status is non-zero.
    /// plexus-config.path runs it on every change of the directory.
    GenerateConfig,
}

/// The clap command, for generators.
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Args, Sub};

    #[test]
    fn the_command_line_should_be_consistent() {
        super::command().debug_assert();
    }

    #[test]
    fn the_config_file_should_be_taken_before_or_after_a_subcommand() {
        for argv in [
            &["plexusd", "-c", "/x.json", "show", "id1"][..],
            &["plexusd", "show", "-c", "/x.json", "id1"],
            &["plexusd", "show", "id1", "--config", "/x.json"],
        ] {
            let a = Args::try_parse_from(argv).unwrap();
            assert_eq!(a.config, std::path::Path::new("/x.json"), "{argv:?}");
            assert!(
                matches!(&a.command, Some(Sub::Show { container_id: Some(id) }) if id == "id1"),
                "{argv:?}"
            );
        }
        let a = Args::try_parse_from(["plexusd", "generate-config", "-c", "/y.json"]).unwrap();
        assert_eq!(a.config, std::path::Path::new("/y.json"));
    }

    #[test]
    fn strict_should_need_check_config() {
        assert!(Args::try_parse_from(["plexusd", "--strict"]).is_err());
        let a = Args::try_parse_from(["plexusd", "--check-config", "--strict"]).unwrap();
        assert!(a.check_config && a.strict);
    }
}
