//! The command line.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lockkit::LockOptions;
use nix::sys::signal::Signal;

/// The lock URL when neither `--url` nor `LOCKKIT_URL` gives one: a SQLite
/// file in the working directory, so that `lockkit exec` works on a machine
/// without any server.
pub(crate) const DEFAULT_URL: &str = "sqlite://lockkit.db";

/// The `--url` help: every scheme lockkit knows, from the backends' own list.
fn url_help() -> String {
    let schemes: Vec<String> = lockkit::known_schemes()
        .map(|scheme| format!("{scheme}://"))
        .collect();
    format!(
        "Where the locks live: {} (see the lockkit docs)",
        schemes.join(", ")
    )
}

/// Run a command under a distributed lock, or ask who holds one.
#[derive(Debug, Parser)]
#[command(name = "lockkit", version, about = "Run a command under a distributed lock, or ask who holds one.", long_about = None)]
pub(crate) struct Cli {
    /// Where the locks live (the schemes come from lockkit's backend list).
    #[arg(long, global = true, env = "LOCKKIT_URL", default_value = DEFAULT_URL, hide_env_values = true, help = url_help())]
    pub(crate) url: String,

    /// More diagnostics on stderr (-v, -vv); `LOCKKIT_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Hold NAME while CMD runs (renewing the lease), then release it.
    ///
    /// CMD gets LOCKKIT_LOCK_NAME and, where the backend has one,
    /// LOCKKIT_FENCING_TOKEN (decimal). SIGINT, SIGTERM, SIGHUP and SIGQUIT
    /// sent to lockkit by a process are passed on to CMD; a terminal's
    /// (Ctrl-C) reach CMD directly and are not passed on again.
    ///
    /// Exit status: CMD's own (128 + N if a signal N killed it); 75 when the
    /// lock was not acquired within the wait; 69 when the backend is
    /// unavailable; 70 when the lock was lost while CMD ran; 64 for a usage
    /// error; 126/127 when CMD cannot be run or is not found.
    Exec(ExecArgs),
    /// Print whether NAME is held, with its fencing token, remaining lease,
    /// holder identity, number of holders (readers, permits) and queued
    /// waiters where the backend can tell.
    Status(StatusArgs),
    /// Run CMD while this process leads the election NAME; campaign again
    /// when CMD ends or leadership is lost, until a signal (passed on to
    /// CMD) or `--terms` terms.
    ///
    /// CMD gets LOCKKIT_LOCK_NAME, LOCKKIT_LEADER (this candidate's
    /// identity) and, where the backend fences, LOCKKIT_TERM (the term's
    /// fencing token, decimal). Exit status as for `exec`, for the last term.
    Elect(ElectArgs),
    /// Print the identity of the current leader of the election NAME; exit
    /// status 1 when nobody leads.
    Leader(LeaderArgs),
    /// Fence a resource store: refuse writes of former lock holders there.
    ///
    /// The URL names the store the writes go to (postgres://, mysql://,
    /// mariadb://, sqlite://, redis://, etcd://host:port).
    #[command(subcommand)]
    Fence(FenceCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum FenceCommand {
    /// Create, idempotently, what the store needs: on PostgreSQL and
    /// MySQL/MariaDB the table lockkit_fences and the function
    /// lockkit_fence(resource, token) that a transaction calls before its
    /// write; on SQLite the table. Redis and etcd need nothing.
    Install(FenceInstallArgs),
    /// Admit TOKEN for RESOURCE (record it) and exit 0, or refuse it and
    /// exit 65 when a greater token was admitted before.
    ///
    /// Exit status: 0 admitted; 65 stale; 64 for a bad resource name or
    /// token; 69 when the store cannot be reached or lacks the install.
    Check(FenceCheckArgs),
}

#[derive(Debug, Args)]
pub(crate) struct FenceInstallArgs {
    /// Print the SQL instead of running it (for a migration or a DBA).
    #[arg(long)]
    pub(crate) print: bool,

    /// How long to wait for the store.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration)]
    pub(crate) timeout: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct FenceCheckArgs {
    /// The resource the write is for, e.g. `reports/daily`.
    pub(crate) resource: String,

    /// The writer's fencing token (LOCKKIT_FENCING_TOKEN under `lockkit exec`).
    pub(crate) token: u64,

    /// How long to wait for the store (and for a transaction that holds the
    /// resource).
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = duration)]
    pub(crate) timeout: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The lock name.
    pub(crate) name: String,

    /// The lease: renewed every third of it while CMD runs; a crashed lockkit
    /// frees the lock after it (e.g. 500ms, 30s, 2m).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,

    /// How long to wait for the lock: a duration, or `forever`.
    #[arg(long, value_name = "DUR|forever", default_value = "forever", value_parser = wait, conflicts_with = "no_wait")]
    pub(crate) wait: WaitFor,

    /// Give up at once if the lock is held (exit 75).
    #[arg(long)]
    pub(crate) no_wait: bool,

    /// Take the read side of NAME's reader-writer lock: other `--shared`
    /// holders run at the same time, a plain `exec NAME` waits for them all
    /// (and new readers wait behind a waiting writer).
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,

    /// Take one of N permits of the semaphore NAME (a namespace of its own:
    /// unrelated to the lock NAME). Every user of the semaphore should pass
    /// the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) permits: Option<u32>,

    /// The holder identity recorded with the lock (shown by `status`);
    /// default `<hostname>:<pid>` where the backend records identities.
    #[arg(long, value_name = "ID")]
    pub(crate) holder: Option<String>,

    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// What `exec` and `elect` run, and how they treat it.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// What to do when the lock is lost while CMD runs: `kill` sends CMD
    /// SIGTERM, then SIGKILL after the grace period; `ignore` lets it finish.
    /// Either way lockkit then exits with 70 (`elect` campaigns again).
    #[arg(long, value_enum, value_name = "ACTION", default_value = "kill")]
    pub(crate) on_lost: OnLost,

    /// Time between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = duration)]
    pub(crate) grace: Duration,

    /// End the holding this long after its grant, however it is renewed:
    /// CMD is then stopped as on a lost lock (exit 70).
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub(crate) max_hold: Option<Duration>,

    /// Keep the lock taken until this long after its grant even when CMD
    /// ends sooner, so that a late trigger on another machine does not run
    /// the job again (TTL backends; the server keeps it).
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub(crate) min_hold: Option<Duration>,

    /// When lockkit dies or is cut off without releasing, keep the lock
    /// taken this much longer than its lease, so that CMD's writes in
    /// flight land before the next holder starts (TTL backends).
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub(crate) lock_delay: Option<Duration>,

    /// What to do when the lock is at risk (a renewal failed or is overdue,
    /// the session is down; still valid): `ignore`, `stop` (as on a lost
    /// lock), or a signal to send CMD each time, e.g. `USR1`.
    #[arg(long, value_name = "ACTION", default_value = "ignore", value_parser = on_at_risk)]
    pub(crate) on_at_risk: OnAtRisk,

    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The election's name (a lock name).
    pub(crate) name: String,

    /// This candidate's identity; default `<hostname>:<pid>`.
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<String>,

    /// The leadership's lease, renewed every third of it while leading.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,

    /// Stop after leading this many terms (default: until a signal).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) terms: Option<u32>,

    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    pub(crate) name: String,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The lock name.
    pub(crate) name: String,

    /// Ask about the semaphore NAME instead of the lock NAME.
    #[arg(long)]
    pub(crate) semaphore: bool,

    /// The semaphore's number of permits, as its users pass it to `exec
    /// --permits` (implies `--semaphore`). Backends that keep a semaphore's
    /// permits in slots look only at this many; without it, at up to 256.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) permits: Option<u32>,

    /// Print one JSON object instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// How long `exec` waits for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitFor {
    Forever,
    For(Duration),
}

impl RunArgs {
    /// `opts` with the bounds asked for.
    pub(crate) fn bounded(&self, mut opts: LockOptions) -> LockOptions {
        if let Some(limit) = self.max_hold {
            opts = opts.max_hold(limit);
        }
        if let Some(floor) = self.min_hold {
            opts = opts.min_hold(floor);
        }
        if let Some(delay) = self.lock_delay {
            opts = opts.lock_delay(delay);
        }
        opts
    }
}

/// What `--on-at-risk` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnAtRisk {
    /// Nothing (the default).
    Ignore,
    /// Stop the command as on a lost lock.
    Stop,
    /// Send the command this signal each time.
    Signal(Signal),
}

/// `ignore`, `stop`, or a signal name with or without `SIG` (`USR1`,
/// `SIGUSR2`).
fn on_at_risk(text: &str) -> Result<OnAtRisk, String> {
    let text = text.trim();
    match text.to_ascii_lowercase().as_str() {
        "ignore" => return Ok(OnAtRisk::Ignore),
        "stop" => return Ok(OnAtRisk::Stop),
        _ => {}
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map(OnAtRisk::Signal)
        .map_err(|_| format!("{text:?} is neither `ignore`, `stop` nor a signal name such as USR1"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM, then SIGKILL after the grace period.
    Kill,
    /// Let the command finish.
    Ignore,
}

/// `500ms`, `30s`, `2m`, `1h 30m`: humantime's syntax.
fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (expected a duration such as 500ms, 30s or 2m)"))
}

fn wait(text: &str) -> Result<WaitFor, String> {
    match text.trim() {
        "forever" => Ok(WaitFor::Forever),
        other => duration(other).map(WaitFor::For),
    }
}

/// The identity this process records by default: `<hostname>:<pid>`.
pub(crate) fn default_identity() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elect_and_leader_parse() {
        let cli = Cli::try_parse_from([
            "lockkit", "elect", "sched", "--id", "a", "--terms", "2", "--", "run-it",
        ])
        .unwrap();
        let Command::Elect(elect) = cli.command else {
            panic!("elect")
        };
        assert_eq!(elect.id.as_deref(), Some("a"));
        assert_eq!(elect.terms, Some(2));
        assert_eq!(elect.run.command, ["run-it"]);
        assert!(Cli::try_parse_from(["lockkit", "elect", "s", "--terms", "0", "--", "x"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["lockkit", "leader", "sched"])
                .unwrap()
                .command,
            Command::Leader(_)
        ));
        assert!(default_identity().contains(':'));
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn at_risk_actions() {
        assert_eq!(on_at_risk("ignore"), Ok(OnAtRisk::Ignore));
        assert_eq!(on_at_risk("STOP"), Ok(OnAtRisk::Stop));
        assert_eq!(on_at_risk("usr1"), Ok(OnAtRisk::Signal(Signal::SIGUSR1)));
        assert_eq!(on_at_risk("SIGUSR2"), Ok(OnAtRisk::Signal(Signal::SIGUSR2)));
        assert!(on_at_risk("panic").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert!(duration("soon").is_err());
        assert!(duration("").is_err());
        assert_eq!(wait("forever"), Ok(WaitFor::Forever));
        assert_eq!(wait("1s"), Ok(WaitFor::For(Duration::from_secs(1))));
    }

    #[test]
    fn exec_takes_everything_after_the_name_as_the_command() {
        let cli = Cli::try_parse_from([
            "lockkit",
            "exec",
            "job",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "echo --ttl",
        ])
        .unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("exec")
        };
        assert_eq!(exec.ttl, Duration::from_secs(2));
        assert_eq!(exec.run.command, ["sh", "-c", "echo --ttl"]);
        assert_eq!(exec.wait, WaitFor::Forever);
        assert_eq!(exec.run.on_lost, OnLost::Kill);
        assert!(Cli::try_parse_from(["lockkit", "exec", "job"]).is_err());
        assert!(!exec.shared && exec.permits.is_none());
        for bad in [
            &["--permits", "0"][..],
            &["--permits", "-1"],
            &["--permits", "many"],
            &["--shared", "--permits", "2"],
        ] {
            let line = ["lockkit", "exec", "job"]
                .iter()
                .chain(bad)
                .chain(&["--", "true"]);
            assert!(Cli::try_parse_from(line).is_err(), "{bad:?}");
        }
        let Command::Exec(exec) =
            Cli::try_parse_from(["lockkit", "exec", "job", "--permits", "4", "--", "true"])
                .unwrap()
                .command
        else {
            panic!("exec")
        };
        assert_eq!(exec.permits, Some(4));
        assert!(
            Cli::try_parse_from([
                "lockkit",
                "exec",
                "job",
                "--wait",
                "1s",
                "--no-wait",
                "--",
                "true"
            ])
            .is_err()
        );
    }
}
