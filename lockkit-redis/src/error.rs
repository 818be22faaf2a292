//! Mapping redis-rs errors into `LockError`.

use lockkit_core::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// Maps a redis-rs error of `what` against `addr`. The address never contains
/// credentials, and redis-rs error texts do not either.
pub(crate) fn map_error(addr: &str, what: &str, error: RedisError) -> LockError {
    let auth = error.kind() == ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"));
    if auth {
        return LockError::Backend {
            backend: BACKEND,
            message: format!(
                "{what} on {addr}: authentication failed; check the user name and password in the URL"
            ),
            source: Some(Box::new(error)),
        };
    }
    let unavailable = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    // A replica answered: a failover is under way.
                    | ServerErrorKind::ReadOnly
            ) | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::ClusterConnectionNotFound
        );
    let message = format!("{what} on {addr} failed: {error}");
    if unavailable {
        LockError::Unavailable {
            backend: BACKEND,
            message,
            source: Some(Box::new(error)),
        }
    } else {
        LockError::Backend {
            backend: BACKEND,
            message,
            source: Some(Box::new(error)),
        }
    }
}

/// The error of a command that got no reply in time.
pub(crate) fn timed_out(addr: &str, what: &str, limit: std::time::Duration) -> LockError {
    LockError::unavailable(
        BACKEND,
        format!("{what} on {addr}: no reply within {limit:?}"),
    )
}
