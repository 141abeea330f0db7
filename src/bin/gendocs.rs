//! `plexus-gendocs <dir>`: writes `plexusd`'s man page (`<dir>/man/plexusd.8`)
//! and shell completions (`<dir>/completions/`) from its command line, for
//! the distribution packages.

use std::path::PathBuf;
use std::process::ExitCode;

use clap_complete::Shell;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: plexus-gendocs <output dir>");
        return ExitCode::from(2);
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-gendocs: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &std::path::Path) -> std::io::Result<()> {
    let man_dir = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man_dir)?;
    std::fs::create_dir_all(&completions)?;
    let cmd = plexus::cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("System Administration")
        .render(&mut page)?;
    std::fs::write(man_dir.join("plexusd.8"), page)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "plexusd", &completions)?;
    }
    Ok(())
}
