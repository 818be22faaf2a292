//! `lockkit fence`: install a store's fence, admit a token from a shell.

use lockkit::FencingToken;
use lockkit::fence::{FenceError, Installed, Store};

use crate::args::FenceCommand;
use crate::exit::{Exit, print_error};

pub(crate) async fn run(url: &str, command: FenceCommand) -> Exit {
    match command {
        FenceCommand::Install(args) if args.print => match lockkit::fence::install_sql(url) {
            Some(sql) => {
                print!("{sql}");
                Exit::Child(0)
            }
            None => {
                eprintln!("lockkit: fence install --print: no SQL to install for this URL's store");
                Exit::Usage
            }
        },
        FenceCommand::Install(args) => {
            let store = match Store::open(url, args.timeout).await {
                Ok(store) => store,
                Err(error) => return failed("fence install", &error),
            };
            match store.install().await {
                Ok(Installed::NothingNeeded) => {
                    eprintln!(
                        "lockkit: fence install: {} needs nothing installed",
                        store.name()
                    );
                    Exit::Child(0)
                }
                Ok(_) => {
                    eprintln!(
                        "lockkit: fence install: lockkit_fences is ready on {}",
                        store.name()
                    );
                    Exit::Child(0)
                }
                Err(error) => failed("fence install", &error),
            }
        }
        FenceCommand::Check(args) => {
            if let Err(error) = lockkit::fence::check_resource(&args.resource) {
                return failed("fence check", &error);
            }
            let store = match Store::open(url, args.timeout).await {
                Ok(store) => store,
                Err(error) => return failed("fence check", &error),
            };
            match store
                .check(&args.resource, FencingToken::new(args.token))
                .await
            {
                Ok(()) => Exit::Child(0),
                Err(error) => failed("fence check", &error),
            }
        }
    }
}

fn failed(what: &str, error: &FenceError) -> Exit {
    print_error(what, error);
    match error {
        FenceError::Stale { .. } => Exit::DataErr,
        FenceError::InvalidResource { .. } | FenceError::TokenOutOfRange { .. } => Exit::Usage,
        _ => Exit::Unavailable,
    }
}
