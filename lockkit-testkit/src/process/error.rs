//! Why a test server could not be started.

use std::fmt;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a test server could not be started (or restarted).
#[derive(Debug)]
pub enum ServerError {
    /// The server's binary (or a helper such as `setpriv`, or a jar it
    /// needs) is not installed.
    NotInstalled {
        /// The binary looked for: a name searched on `PATH`, or a path (of a
        /// jar when it ends with `.jar`).
        binary: String,
        /// How to install it.
        hint: String,
    },
    /// Spawning the process failed.
    Spawn {
        /// What was being spawned.
        what: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// Preparing the server failed (temporary directory, configuration file…).
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The server did not become ready in time.
    NotReady {
        /// Which server.
        what: String,
        /// How long we waited.
        waited: Duration,
        /// The last lines of the server's log.
        log_tail: String,
    },
    /// The server exited before it became ready.
    Exited {
        /// Which server.
        what: String,
        /// Its exit status; `None` when the harness killed it meanwhile.
        status: Option<ExitStatus>,
        /// The last lines of the server's log.
        log_tail: String,
    },
}

impl ServerError {
    /// The server's log tail carried by this error, if any.
    pub fn log_tail(&self) -> Option<&str> {
        match self {
            Self::NotReady { log_tail, .. } | Self::Exited { log_tail, .. } => Some(log_tail),
            _ => None,
        }
    }

    /// Whether the server exited because one of its ports was taken meanwhile
    /// (its log says "Address already in use").
    pub(crate) fn is_address_in_use(&self) -> bool {
        matches!(self, Self::Exited { log_tail, .. } if log_tail.to_ascii_lowercase().contains("address already in use"))
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { binary, hint } => {
                if binary.ends_with(".jar") {
                    write!(f, "{binary} does not exist or is not a file: {hint}")
                } else if binary.contains('/') {
                    write!(
                        f,
                        "{binary} does not exist or is not an executable file: {hint}"
                    )
                } else {
                    write!(f, "{binary} was not found on PATH: {hint}")
                }
            }
            Self::Spawn { what, source } => write!(f, "cannot spawn {what}: {source}"),
            Self::Io { what, source } => write!(f, "cannot {what}: {source}"),
            Self::NotReady {
                what,
                waited,
                log_tail,
            } => write!(
                f,
                "{what} was not ready after {waited:?}; last lines of its log:\n{log_tail}"
            ),
            Self::Exited {
                what,
                status,
                log_tail,
            } => {
                match status {
                    Some(status) => write!(f, "{what} exited before it was ready ({status})")?,
                    None => write!(f, "{what} was killed before it was ready")?,
                }
                write!(f, "; last lines of its log:\n{log_tail}")
            }
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Spawn { source, .. } | Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
