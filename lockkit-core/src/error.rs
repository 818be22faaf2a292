//! The one error type of lockkit.

use std::time::Duration;

use crate::lost::LostReason;

/// A boxed error from a backend's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result<T, LockError>`.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock.
///
/// Messages never contain secrets: URLs are redacted before they are stored here.
/// Use [`LockError::is_temporary`] to tell failures that may succeed on retry
/// (`Timeout`, `Unavailable`) from those that will not.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was held by someone else for the whole wait.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long `acquire` waited.
        waited: Duration,
    },
    /// The lease is no longer ours: it expired, was deleted, or was taken over.
    #[error("lock {name:?} was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why the lease is gone.
        reason: LostReason,
    },
    /// The lock name breaks the naming rules (1..=255 bytes of UTF-8, no control characters).
    #[error("invalid lock name {name}: {reason}")]
    InvalidName {
        /// The name, escaped and shortened for display.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration or another option is out of range.
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: String,
    },
    /// The connection URL cannot be used.
    #[error("invalid lock URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL names a backend whose cargo feature is not enabled.
    #[error(
        "the {scheme:?} backend is not compiled in: enable the cargo feature `{feature}` of lockkit"
    )]
    BackendNotCompiled {
        /// The URL scheme, e.g. `zk`.
        scheme: String,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// The backend cannot be reached or cannot serve: connect or I/O failure, timeout, no quorum.
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        /// Which backend, e.g. `redis`.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The backend cannot do this at all (e.g. a third-party backend that
    /// does not implement [`DistributedLock::status`](crate::DistributedLock::status)).
    #[error("{backend} cannot {operation}")]
    Unsupported {
        /// Which backend, e.g. `redis`.
        backend: &'static str,
        /// What it cannot do, e.g. `report a lock's status`.
        operation: &'static str,
    },
    /// Any other failure reported by the backend.
    #[error("{backend} error: {message}")]
    Backend {
        /// Which backend, e.g. `redis`.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl LockError {
    /// `Unavailable` with a message and no source.
    pub fn unavailable(backend: &'static str, message: impl Into<String>) -> Self {
        LockError::Unavailable {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// `Backend` with a message and no source.
    pub fn backend(backend: &'static str, message: impl Into<String>) -> Self {
        LockError::Backend {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// `InvalidOptions` with a reason.
    pub fn invalid_options(reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            reason: reason.into(),
        }
    }

    /// `InvalidUrl` for `url` (redacted here) with a reason.
    pub fn invalid_url(url: &str, reason: impl Into<String>) -> Self {
        LockError::InvalidUrl {
            url: crate::backend::redact_url(url),
            reason: reason.into(),
        }
    }

    /// `Lost` for `name` with a reason.
    pub fn lost(name: &str, reason: LostReason) -> Self {
        LockError::Lost {
            name: name.to_owned(),
            reason,
        }
    }

    /// True for failures that may go away on their own, so a retry can succeed
    /// (`Timeout`, `Unavailable`).
    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            LockError::Timeout { .. } | LockError::Unavailable { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn check<T: std::error::Error + Send + Sync + 'static>() {}
        check::<LockError>();
    }

    #[test]
    fn invalid_url_redacts_password() {
        let err = LockError::invalid_url("redis://user:hunter2@localhost:6379/0", "bad port");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user:***@localhost"), "{shown}");
    }

    #[test]
    fn temporary_errors() {
        assert!(LockError::unavailable("redis", "down").is_temporary());
        assert!(!LockError::invalid_options("zero ttl").is_temporary());
    }
}
