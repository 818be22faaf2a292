//! `lockkit elect`: run a command while this process leads an election, and
//! `lockkit leader`: who leads.

use std::sync::Arc;

use lockkit::{Election, LockOptions};

use crate::args::{ElectArgs, LeaderArgs, default_identity};
use crate::exec::{
    Received, Released, Supervised, prepare, release, spawn, status_code, supervise,
};
use crate::exit::{Exit, report};

pub(crate) async fn run(url: &str, args: ElectArgs) -> Exit {
    let (mut signals, locks) = match prepare(url).await {
        Ok(prepared) => prepared,
        Err(exit) => return exit,
    };
    let identity = args.id.clone().unwrap_or_else(default_identity);
    let election = Election::new(Arc::clone(&locks), args.name.clone(), identity.clone());
    let opts = args.run.bounded(
        LockOptions::new()
            .ttl(args.ttl)
            .auto_renew(true)
            .wait_forever(),
    );
    let mut terms = 0;
    loop {
        let leadership = tokio::select! {
            elected = election.campaign(&opts) => match elected {
                Ok(leadership) => leadership,
                Err(error) => return report("could not campaign", &error),
            },
            Received { signal, .. } = signals.next() => {
                eprintln!("lockkit: {signal} while campaigning for {:?}; stopping", args.name);
                return Exit::Child(128 + signal as u8);
            }
        };
        terms += 1;
        let term = leadership.term();
        tracing::info!(election = %args.name, %identity, ?term, "leading; running the command");
        let mut env = vec![("LOCKKIT_LEADER", identity.clone())];
        if let Some(term) = term {
            env.push(("LOCKKIT_TERM", term.to_string()));
        }
        let guard = leadership.guard();
        let child = match spawn(&args.name, &args.run, guard, &env) {
            Ok(child) => child,
            Err((exit, message)) => {
                eprintln!("lockkit: {message}");
                if let Err(error) = leadership.resign().await {
                    eprintln!(
                        "lockkit: could not resign ({error}); the leadership ends with its TTL"
                    );
                }
                return exit;
            }
        };
        let last = match supervise(child, guard, &args.name, &args.run, &mut signals).await {
            Supervised::Exited(status, signalled) => {
                let exit = match release(leadership.into_guard(), &args.name).await {
                    Released::Ok => Exit::Child(status_code(status)),
                    Released::Lost => Exit::Software,
                };
                if signalled {
                    return exit;
                }
                exit
            }
            Supervised::LostWhileRunning => {
                eprintln!(
                    "lockkit: leadership of {:?} lost; campaigning again",
                    args.name
                );
                Exit::Software
            }
            Supervised::WaitFailed(error) => {
                eprintln!("lockkit: waiting for the command failed: {error}");
                return Exit::Software;
            }
        };
        if args.terms.is_some_and(|most| terms >= most) {
            return last;
        }
    }
}

/// Prints the leader's identity; exit status 1 when nobody leads.
pub(crate) async fn leader(url: &str, args: LeaderArgs) -> Exit {
    let locks = match lockkit::connect(url).await {
        Ok(locks) => locks,
        Err(error) => return report("connect", &error),
    };
    match Election::new(locks, args.name.clone(), "").leader().await {
        Ok(Some(leader)) => {
            println!("{leader}");
            Exit::Child(0)
        }
        Ok(None) => {
            eprintln!("lockkit: nobody leads {:?}", args.name);
            Exit::Child(1)
        }
        Err(error) => report(&format!("leader of {:?}", args.name), &error),
    }
}
