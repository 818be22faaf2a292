//! Mapping ZooKeeper client errors into `LockError`.

use lockkit_core::LockError;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Maps an error of `what`; the cluster address never carries credentials.
pub(crate) fn map_error(what: &str, error: ZkError) -> LockError {
    let message = format!("{what} failed: {error}");
    let source = Some(Box::new(error.clone()) as lockkit_core::BoxError);
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
        | ZkError::ConnectionLoss
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
