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
                    // Redirections the cluster client could not follow
                    // within its retries: slots are moving (a failover).
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `MOVED` or `ASK` that redis-rs's cluster client gives up on (a
    /// failover moved the slot while its retries ran) is worth trying
    /// again; a cross-slot script is not.
    #[test]
    fn unfollowed_cluster_redirections_are_unavailable() {
        for kind in [ServerErrorKind::Moved, ServerErrorKind::Ask] {
            let error = RedisError::from((
                ErrorKind::Server(kind),
                "redirected",
                "10332 127.0.0.1:42247".to_owned(),
            ));
            let mapped = map_error("127.0.0.1:7000", "acquire", error);
            assert!(matches!(mapped, LockError::Unavailable { .. }), "{mapped}");
        }
        let error = RedisError::from((ErrorKind::Server(ServerErrorKind::CrossSlot), "cross slot"));
        let mapped = map_error("127.0.0.1:7000", "acquire", error);
        assert!(matches!(mapped, LockError::Backend { .. }), "{mapped}");
    }
}
