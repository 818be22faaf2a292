//! Exit statuses (the `sysexits.h` values) and how errors map onto them.

use std::process::ExitCode;

use lockkit::LockError;

/// How `lockkit` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The command's own status (0–255; 128 + N for a command killed by signal N).
    Child(u8),
    /// 64: bad arguments, a bad URL, a bad lock name or duration.
    Usage,
    /// 65: `fence check` refused a stale token.
    DataErr,
    /// 69: the backend cannot be reached or cannot serve, or is not compiled in.
    Unavailable,
    /// 70: the lock was lost while the command ran, or an internal failure.
    Software,
    /// 75: the lock was not acquired within the wait.
    NotAcquired,
    /// 126: the command exists but cannot be run.
    CannotRun,
    /// 127: the command was not found.
    NotFound,
}

impl Exit {
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Child(code) => code,
            Exit::Usage => 64,
            Exit::DataErr => 65,
            Exit::Unavailable => 69,
            Exit::Software => 70,
            Exit::NotAcquired => 75,
            Exit::CannotRun => 126,
            Exit::NotFound => 127,
        }
    }

    /// The exit status for an error from the library.
    pub(crate) fn for_error(error: &LockError) -> Exit {
        match error {
            LockError::Timeout { .. } => Exit::NotAcquired,
            LockError::InvalidName { .. }
            | LockError::InvalidOptions { .. }
            | LockError::InvalidUrl { .. } => Exit::Usage,
            LockError::Lost { .. } => Exit::Software,
            // A backend this binary lacks, an unreachable server, a server
            // that refuses: the service is not available to us.
            _ => Exit::Unavailable,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// Prints clap's message; help and version go to stdout with status 0, any
/// other parse error is a usage error (64, not clap's 2).
pub(crate) fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = error.print();
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => ExitCode::SUCCESS,
        _ => Exit::Usage.into(),
    }
}

/// Prints `lockkit: <what>: <error>` with the error's sources (each once),
/// and returns the error's exit status.
pub(crate) fn report(what: &str, error: &LockError) -> Exit {
    print_error(what, error);
    Exit::for_error(error)
}

/// Prints `lockkit: <what>: <error>` with the error's sources, each once.
pub(crate) fn print_error(what: &str, error: &dyn std::error::Error) {
    let mut message = format!("lockkit: {what}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    eprintln!("{message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn errors_map_to_sysexits() {
        let timeout = LockError::Timeout {
            name: "job".into(),
            waited: Duration::from_secs(1),
        };
        assert_eq!(Exit::for_error(&timeout).code(), 75);
        assert_eq!(
            Exit::for_error(&LockError::invalid_url("x:", "bad")).code(),
            64
        );
        assert_eq!(
            Exit::for_error(&LockError::invalid_options("zero ttl")).code(),
            64
        );
        assert_eq!(
            Exit::for_error(&LockError::unavailable("redis", "down")).code(),
            69
        );
        let missing = LockError::BackendNotCompiled {
            scheme: "zk".into(),
            feature: "zk",
        };
        assert_eq!(Exit::for_error(&missing).code(), 69);
        assert_eq!(
            Exit::for_error(&LockError::lost("job", lockkit::LostReason::Revoked)).code(),
            70
        );
    }
}
