//! What the SQL stores share: how a failed statement reads.

use lockkit_core::FencingToken;
use sqlx::error::DatabaseError;

use crate::error::FenceError;
use crate::resource::greatest_in;

/// How one dialect tells its function's answers apart.
pub(crate) struct Dialect {
    /// The store's name, e.g. `postgres`.
    pub(crate) store: &'static str,
    /// The module whose `install` creates the function, for the fix.
    pub(crate) module: &'static str,
    /// The function refused a stale token.
    pub(crate) stale: fn(&dyn DatabaseError) -> bool,
    /// The function does not exist.
    pub(crate) missing: fn(&dyn DatabaseError) -> bool,
}

impl Dialect {
    /// [`FenceError::Stale`] for the function's refusal, a
    /// [`FenceError::Store`] naming the fix for a missing function, and the
    /// store's failure otherwise.
    pub(crate) fn refusal(
        &self,
        error: sqlx::Error,
        resource: &str,
        token: FencingToken,
    ) -> FenceError {
        match error {
            sqlx::Error::Database(error) if (self.stale)(error.as_ref()) => {
                let greatest = greatest_in(error.message()).unwrap_or(u64::MAX);
                FenceError::stale(resource, token, greatest)
            }
            sqlx::Error::Database(error) if (self.missing)(error.as_ref()) => FenceError::store(
                self.store,
                format!(
                    "the lockkit_fence function is missing: run `lockkit fence install --url URL` \
                     (or lockkit_fence::{}::install)",
                    self.module
                ),
                Some(Box::new(sqlx::Error::Database(error)) as _),
            ),
            error => self.failed(error),
        }
    }

    /// The store failed.
    pub(crate) fn failed(&self, error: sqlx::Error) -> FenceError {
        FenceError::store(self.store, error.to_string(), Some(Box::new(error) as _))
    }
}
