//! The command line of `plexusd`, shared by the binary and by the
//! generator of its man page and shell completions.

use std::path::PathBuf;

use clap::Parser;

use crate::config;

/// The Plexus daemon: runs CNI plugin chains for the plexus-shim.
#[derive(Debug, Parser)]
#[command(name = "plexusd", version, about)]
pub struct Args {
    /// Daemon configuration file (multus daemon-config.json schema).
    #[arg(long, short = 'c', value_name = "FILE", default_value = config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Validate the configuration, report every problem, and exit.
    #[arg(long)]
    pub check_config: bool,
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
    #[test]
    fn the_command_line_should_be_consistent() {
        super::command().debug_assert();
    }
}
