//! The statements of `lease` mode that every database answers alike (a
//! count of rows changed, or the live row), as a dialect writes them: a
//! text and the parameters it binds, in order. [`Rows`](super::rows::Rows)
//! binds and runs them.

use std::sync::Arc;
use std::time::Duration;

/// What a placeholder of a lease statement stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    /// The row's name (a lock's, or a side row's).
    Name,
    /// The stored owner; `NULL` where the caller means anyone's.
    Owner,
    /// A reader's token.
    Token,
    /// The lease, in the unit the dialect binds.
    Ttl,
    /// The name whose waiters a deleted record wakes (Postgres' `NOTIFY`
    /// payload).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Woken,
    /// The release channel (Postgres' `NOTIFY`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Channel,
}

/// One lease statement: its text (built from a validated table name) and
/// its parameters, in the order the text binds them.
#[derive(Debug)]
pub(crate) struct LeaseSql {
    pub(crate) text: Arc<str>,
    pub(crate) params: &'static [Param],
}

impl LeaseSql {
    pub(crate) fn new(text: String, params: &'static [Param]) -> Self {
        LeaseSql {
            text: text.into(),
            params,
        }
    }
}

/// The values a lease statement may bind (see [`Param`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Args<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: Option<&'a str>,
    pub(crate) token: i64,
    pub(crate) ttl: Duration,
    pub(crate) woken: &'a str,
}

/// A dialect's statements of `lease` mode whose answers read the same on
/// every database.
#[derive(Debug)]
pub(crate) struct LeaseStatements {
    /// Owner-conditional extension of a live lease: a row changed if it
    /// was `owner`'s.
    pub(crate) extend: LeaseSql,
    /// Owner-conditional release: a row changed if it was `owner`'s.
    pub(crate) release: LeaseSql,
    /// The live lease on a row: its fence, remaining milliseconds and
    /// owner.
    pub(crate) status: LeaseSql,
    /// Moves a reader group's expiry to at least `ttl` from now if the
    /// reader with `token` is in it (the live group started at or before
    /// `token`).
    pub(crate) extend_share: LeaseSql,
    /// The reader with `token` leaves its group; the last one out frees
    /// the row. Tried in order until one changes a row.
    pub(crate) leave: Vec<LeaseSql>,
    /// Writes `owner` into a record row for `ttl`, in place of any earlier
    /// record.
    pub(crate) record: LeaseSql,
    /// Deletes a record row if it is `owner`'s (anyone's with `NULL`), and
    /// on Postgres wakes the waiters of the name `woken`.
    pub(crate) forget: LeaseSql,
    /// Postgres' release channel (`lockkit_<table>`); empty elsewhere.
    pub(crate) channel: String,
}
