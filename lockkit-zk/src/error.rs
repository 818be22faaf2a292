//! Mapping ZooKeeper client errors into `LockError`.

use lockkit_core::LockError;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Whether `error` is the connection itself failing (reset, broken pipe, a
/// server gone silent): zookeeper-client hands the requests pending on a
/// connection it drops the reason it dropped it, which is `ConnectionLoss`,
/// the socket's I/O error, or (0.11) a message of its own without a source
/// ("no response from connection in …", "encounter writable server …");
/// all mean the same.
pub(crate) fn is_connection_failure(error: &ZkError) -> bool {
    if matches!(error, ZkError::ConnectionLoss) {
        return true;
    }
    if let ZkError::Custom(custom) = error
        && std::error::Error::source(custom).is_none()
    {
        return true;
    }
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if error.is::<std::io::Error>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Maps an error of `what`; the cluster address never carries credentials.
pub(crate) fn map_error(what: &str, error: ZkError) -> LockError {
    let message = format!("{what} failed: {error}");
    let source = Some(Box::new(error.clone()) as lockkit_core::BoxError);
    if is_connection_failure(&error) {
        return LockError::Unavailable {
            backend: BACKEND,
            message,
            source,
        };
    }
    match error {
        ZkError::AuthFailed | ZkError::NoAuth | ZkError::InvalidAcl => LockError::Backend {
            backend: BACKEND,
            message: format!(
                "{message} (check the credentials in the URL and the ACLs of the lock path)"
            ),
            source,
        },
        ZkError::NoHosts
        | ZkError::Timeout
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::ClientClosed
        | ZkError::Throttled
        | ZkError::NotReadOnly => LockError::Unavailable {
            backend: BACKEND,
            message,
            source,
        },
        _ => LockError::Backend {
            backend: BACKEND,
            message,
            source,
        },
    }
}

/// The error of a request that got no answer in time.
pub(crate) fn timed_out(what: &str, limit: std::time::Duration) -> LockError {
    LockError::unavailable(BACKEND, format!("{what}: no answer within {limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The client builds the I/O-error form only internally; the failover
    // test in tests/zk.rs meets it on real connection resets.
    #[test]
    fn connection_failures_are_unavailable_and_others_are_not() {
        assert!(is_connection_failure(&ZkError::ConnectionLoss));
        assert!(!is_connection_failure(&ZkError::NoNode));
        assert!(!is_connection_failure(&ZkError::AuthFailed));
        assert!(matches!(
            map_error("x", ZkError::ConnectionLoss),
            LockError::Unavailable { .. }
        ));
        assert!(matches!(
            map_error("x", ZkError::NoNode),
            LockError::Backend { .. }
        ));
    }
}
