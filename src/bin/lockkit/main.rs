//! `lockkit`: run a command under a distributed lock, or ask who holds one.
//!
//! ```text
//! lockkit [--url URL] exec NAME [--ttl DUR] [--wait DUR|forever] [--no-wait] [--holder ID]
//!                               [--on-lost kill|ignore] [--grace DUR] -- CMD [ARGS…]
//! lockkit [--url URL] status NAME [--json]
//! lockkit [--url URL] elect NAME [--id ID] [--ttl DUR] [--terms N] -- CMD [ARGS…]
//! lockkit [--url URL] leader NAME
//! lockkit [--url URL] fence install [--print]
//! lockkit [--url URL] fence check RESOURCE TOKEN
//! ```
//!
//! The URL comes from `--url`, else `LOCKKIT_URL`, else the embedded default
//! `sqlite://lockkit.db` (a file in the working directory). Diagnostics go to
//! stderr; stdout belongs to the command. See `lockkit help exec` for the exit
//! statuses.

// A command-line tool talks to its user on stdout and stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod elect;
mod exec;
mod exit;
mod fence;
mod status;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return exit::usage_error(&error),
    };
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lockkit: cannot start the async runtime: {error}");
            return Exit::Software.into();
        }
    };
    let exit = runtime.block_on(async {
        match cli.command {
            Command::Exec(args) => exec::run(&cli.url, args).await,
            Command::Status(args) => status::run(&cli.url, args).await,
            Command::Elect(args) => elect::run(&cli.url, args).await,
            Command::Leader(args) => elect::leader(&cli.url, args).await,
            Command::Fence(command) => fence::run(&cli.url, command).await,
        }
    });
    // Background releases and the like get a moment to finish; nothing
    // waits for a task that hangs.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    exit.into()
}

/// Diagnostics on stderr: warnings by default, more with `-v`/`-vv`, or as
/// `LOCKKIT_LOG` says (`tracing` filter syntax, e.g. `lockkit=debug`).
fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info,lockkit=debug",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_env("LOCKKIT_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
