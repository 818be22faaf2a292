//! What a fence check can answer besides "admitted".

use lockkit_core::FencingToken;

/// The result of a fence check.
pub type Result<T, E = FenceError> = std::result::Result<T, E>;

/// Boxed error of a store's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a fence check did not admit a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A greater token was admitted for the resource before: the writer is
    /// a former holder of the lock, and its write must not land. Nothing
    /// was written; inside a transaction, roll it back.
    #[error(
        "stale fencing token {token} for resource {resource:?}: {greatest} was admitted before"
    )]
    Stale {
        /// The resource the write was for.
        resource: String,
        /// The token that was refused.
        token: FencingToken,
        /// The greatest token admitted for the resource so far.
        greatest: FencingToken,
    },
    /// The resource name cannot be fenced: empty, too long, or with
    /// characters the store cannot keep. Nothing was written.
    #[error("invalid fence resource {resource:?}: {reason}")]
    InvalidResource {
        /// The name as given (cut to 64 characters).
        resource: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The token does not fit the store's column or value. Nothing was
    /// written.
    #[error("fencing token {token} does not fit the {store} fence (largest: {max})")]
    TokenOutOfRange {
        /// The token as given.
        token: FencingToken,
        /// The store, e.g. `postgres`.
        store: &'static str,
        /// The largest token the store keeps.
        max: u64,
    },
    /// The store failed, could not be reached, or lacks what
    /// `lockkit fence install` creates.
    #[error("{store} fence: {message}")]
    Store {
        /// The store, e.g. `postgres`.
        store: &'static str,
        /// What happened, with the fix where there is one.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl FenceError {
    /// Whether the token was refused as stale (the writer lost its lock).
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::Stale { .. })
    }

    /// The greatest token admitted before, for a stale token.
    pub fn greatest(&self) -> Option<FencingToken> {
        match self {
            FenceError::Stale { greatest, .. } => Some(*greatest),
            _ => None,
        }
    }

    #[allow(dead_code)] // not every store feature uses it
    pub(crate) fn stale(resource: &str, token: FencingToken, greatest: u64) -> FenceError {
        FenceError::Stale {
            resource: resource.to_owned(),
            token,
            greatest: FencingToken::new(greatest),
        }
    }

    #[allow(dead_code)] // not every store feature uses it
    pub(crate) fn store(
        store: &'static str,
        message: impl Into<String>,
        source: impl Into<Option<BoxError>>,
    ) -> FenceError {
        FenceError::Store {
            store,
            message: message.into(),
            source: source.into(),
        }
    }
}
