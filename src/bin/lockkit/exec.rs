//! `lockkit exec`: hold a lock while a command runs.

use std::io::ErrorKind;
use std::process::ExitStatus;
use std::sync::Arc;

use futures_util::StreamExt;
use lockkit::{DistributedLock, LockGuard, LockOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use signal_hook::iterator::exfiltrator::origin::WithOrigin;
use signal_hook::low_level::siginfo::Cause;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep_until};

use crate::args::{ExecArgs, OnAtRisk, OnLost, RunArgs, WaitFor, default_identity};
use crate::exit::{Exit, report};

/// The signals passed on to the command.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// What `exec` and `elect` need before they start: the forwarded signals
/// (installed first, so that none is missed) and a client of `url`.
pub(crate) async fn prepare(url: &str) -> Result<(Signals, Arc<dyn DistributedLock>), Exit> {
    let signals = Signals::new().map_err(|error| {
        eprintln!("lockkit: cannot install signal handlers: {error}");
        Exit::Software
    })?;
    let locks = lockkit::connect(url)
        .await
        .map_err(|error| report("connect", &error))?;
    Ok((signals, locks))
}

pub(crate) async fn run(url: &str, args: ExecArgs) -> Exit {
    let (mut signals, locks) = match prepare(url).await {
        Ok(prepared) => prepared,
        Err(exit) => return exit,
    };
    let mut opts = args
        .run
        .bounded(LockOptions::new().ttl(args.ttl).auto_renew(true));
    if let Some(holder) = holder(locks.as_ref(), args.holder.clone()) {
        opts = opts.holder(holder);
    }
    if args.shared {
        opts = opts.shared();
    }
    if let Some(permits) = args.permits {
        opts = opts.semaphore(permits);
    }
    opts = match (args.no_wait, args.wait) {
        (true, _) => opts.no_wait(),
        (false, WaitFor::Forever) => opts.wait_forever(),
        (false, WaitFor::For(wait)) => opts.wait_for(wait),
    };

    // A signal while waiting ends the wait; dropping the acquire frees
    // whatever it may have been granted.
    let guard = tokio::select! {
        acquired = locks.acquire(&args.name, &opts) => match acquired {
            Ok(guard) => guard,
            Err(error) => return report("could not acquire the lock", &error),
        },
        Received { signal, .. } = signals.next() => {
            eprintln!("lockkit: {signal} while waiting for lock {:?}; not running the command", args.name);
            return Exit::Child(128 + signal as u8);
        }
    };
    tracing::info!(lock.name = %args.name, fencing_token = ?guard.fencing_token(), "lock acquired; running the command");

    let child = match spawn(&args.name, &args.run, &guard, &[]) {
        Ok(child) => child,
        Err((exit, message)) => {
            eprintln!("lockkit: {message}");
            release(guard, &args.name).await;
            return exit;
        }
    };
    let outcome = supervise(child, &guard, &args.name, &args.run, &mut signals).await;
    match outcome {
        Supervised::Exited(status, _) => match release(guard, &args.name).await {
            Released::Ok => Exit::Child(status_code(status)),
            Released::Lost => Exit::Software,
        },
        Supervised::LostWhileRunning => {
            drop(guard);
            Exit::Software
        }
        Supervised::WaitFailed(error) => {
            eprintln!("lockkit: waiting for the command failed: {error}");
            release(guard, &args.name).await;
            Exit::Software
        }
    }
}

/// The holder identity to record: the one given, else `<hostname>:<pid>`
/// where the backend records identities (an identity given to a backend
/// that cannot record one fails the acquire with `Unsupported`).
pub(crate) fn holder(locks: &dyn DistributedLock, given: Option<String>) -> Option<String> {
    given.or_else(|| locks.capabilities().holder.then(default_identity))
}

/// Starts the command with the lock's name, fencing token and `env` in its
/// environment.
pub(crate) fn spawn(
    name: &str,
    args: &RunArgs,
    guard: &LockGuard,
    env: &[(&str, String)],
) -> Result<Child, (Exit, String)> {
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    command.args(rest).env("LOCKKIT_LOCK_NAME", name);
    command.envs(env.iter().map(|(k, v)| (k, v)));
    // A token inherited from an outer `lockkit exec` must not pass for ours.
    match guard.fencing_token() {
        Some(token) => command.env("LOCKKIT_FENCING_TOKEN", token.to_string()),
        None => command.env_remove("LOCKKIT_FENCING_TOKEN"),
    };
    command.spawn().map_err(|error| {
        let shown = program.to_string_lossy();
        match error.kind() {
            ErrorKind::NotFound => (Exit::NotFound, format!("{shown}: command not found")),
            ErrorKind::PermissionDenied => (Exit::CannotRun, format!("{shown}: permission denied")),
            _ => (Exit::CannotRun, format!("{shown}: cannot run: {error}")),
        }
    })
}

pub(crate) enum Supervised {
    /// The command ended on its own; `true` if a signal was passed on to it.
    Exited(ExitStatus, bool),
    LostWhileRunning,
    WaitFailed(std::io::Error),
}

/// Waits for the command, passing signals on and acting on a lost lock.
pub(crate) async fn supervise(
    mut child: Child,
    guard: &LockGuard,
    name: &str,
    args: &RunArgs,
    signals: &mut Signals,
) -> Supervised {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut warning = Box::pin(next_warning(guard, false));
    let mut lost_at: Option<Instant> = None;
    let mut sigkill_sent = false;
    let mut signalled = false;
    let status = loop {
        let kill_at = lost_at
            .filter(|_| args.on_lost == OnLost::Kill && !sigkill_sent)
            .map(|at| at + args.grace);
        tokio::select! {
            status = child.wait() => break status,
            received = signals.next() => {
                signalled = true;
                received.pass_on(pid);
            }
            reason = &mut lost, if lost_at.is_none() => {
                lost_at = Some(Instant::now());
                match args.on_lost {
                    OnLost::Kill => {
                        eprintln!(
                            "lockkit: lock {name:?} lost while the command ran ({reason}); sending it SIGTERM"
                        );
                        send(pid, Signal::SIGTERM);
                    }
                    OnLost::Ignore => eprintln!(
                        "lockkit: lock {name:?} lost while the command ran ({reason}); letting it finish"
                    ),
                }
            }
            () = &mut warning, if lost_at.is_none() && args.on_at_risk != OnAtRisk::Ignore => {
                warning = Box::pin(next_warning(guard, true));
                match args.on_at_risk {
                    OnAtRisk::Stop => {
                        eprintln!("lockkit: lock {name:?} at risk while the command ran; stopping it (SIGTERM)");
                        lost_at = Some(Instant::now());
                        send(pid, Signal::SIGTERM);
                    }
                    OnAtRisk::Signal(signal) => {
                        eprintln!("lockkit: lock {name:?} at risk while the command ran; sending it {signal}");
                        send(pid, signal);
                    }
                    OnAtRisk::Ignore => {}
                }
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                eprintln!("lockkit: the command outlived the grace period of {:?}; sending it SIGKILL", args.grace);
                send(pid, Signal::SIGKILL);
                sigkill_sent = true;
            }
        }
    };
    match status {
        Ok(_) if lost_at.is_some() => Supervised::LostWhileRunning,
        Ok(status) => Supervised::Exited(status, signalled),
        Err(error) => Supervised::WaitFailed(error),
    }
}

/// Resolves when the holding becomes at risk (after the previous warning
/// cleared, when `after_clear`); never once it is lost (the lost signal
/// speaks for that).
async fn next_warning(guard: &LockGuard, after_clear: bool) {
    if after_clear {
        while guard.is_at_risk() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    guard.at_risk().await;
    if guard.is_lost() {
        std::future::pending::<()>().await;
    }
}

fn send(pid: Option<Pid>, signal: Signal) {
    if let Some(pid) = pid
        && let Err(error) = kill(pid, signal)
    {
        // ESRCH: it has just exited; the wait will say so.
        tracing::debug!(%error, %signal, "could not signal the command");
    }
}

pub(crate) enum Released {
    Ok,
    Lost,
}

/// Releases the lock. A lease found gone means it was lost at the end of the
/// run (exit 70); any other failure is only reported, as the lease ends with
/// its TTL anyway and the command's status matters more.
pub(crate) async fn release(guard: LockGuard, name: &str) -> Released {
    match guard.release().await {
        Ok(()) => Released::Ok,
        Err(error @ lockkit::LockError::Lost { .. }) => {
            eprintln!("lockkit: {error}");
            Released::Lost
        }
        Err(error) => {
            eprintln!("lockkit: could not release lock {name:?} ({error}); it ends with its TTL");
            Released::Ok
        }
    }
}

/// The command's exit status as ours: its code, or 128 + N when signal N
/// killed it.
pub(crate) fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

/// A signal received, and whether the kernel sent it. The kernel sends
/// the terminal's signals (Ctrl-C, Ctrl-\\, a hang-up) to the whole
/// foreground process group, which includes the command (it stays in
/// lockkit's group): it got that signal itself, and passing it on would
/// deliver it twice. A signal a process sent (`kill`) reached lockkit alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) signal: Signal,
    pub(crate) from_kernel: bool,
}

impl Received {
    /// Passes the signal on to the command, unless it got it too.
    fn pass_on(self, pid: Option<Pid>) {
        if self.from_kernel {
            tracing::info!(signal = %self.signal, "the terminal sent the signal to the command too; not passing it on");
        } else {
            tracing::info!(signal = %self.signal, "passing the signal on to the command");
            send(pid, self.signal);
        }
    }
}

/// The forwarded signals, as one stream.
pub(crate) struct Signals {
    stream: signal_hook_tokio::SignalsInfo<WithOrigin>,
}

impl Signals {
    pub(crate) fn new() -> std::io::Result<Signals> {
        let numbers: Vec<i32> = FORWARDED.iter().map(|&sig| sig as i32).collect();
        Ok(Signals {
            stream: signal_hook_tokio::SignalsInfo::with_exfiltrator(
                &numbers,
                WithOrigin::default(),
            )?,
        })
    }

    /// The next signal received.
    pub(crate) async fn next(&mut self) -> Received {
        loop {
            let Some(origin) = self.stream.next().await else {
                // The stream ends only when closed: never while we wait.
                return std::future::pending().await;
            };
            if let Ok(signal) = Signal::try_from(origin.signal) {
                return Received {
                    signal,
                    from_kernel: origin.cause == Cause::Kernel,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn exit_statuses() {
        assert_eq!(status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        // Killed by SIGKILL (9).
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
    }
}
