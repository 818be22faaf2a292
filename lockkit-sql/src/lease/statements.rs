//! The statements of `lease` mode that every database answers alike (a
//! count of rows changed, or the live row), as a dialect writes them: a
//! text and the parameters it binds, in order. [`Rows`](super::rows::Rows)
//! binds and runs them.

use std::sync::Arc;
use std::time::Duration;

use super::LeaseDialect;
use crate::statement::Value;

/// What a placeholder of a lease statement stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    /// The row's name (a lock's, or a side row's).
    Name,
    /// The stored owner; `NULL` where the caller means anyone's.
    Owner,
    /// A reader's token.
    Token,
    /// The record of a writer waiting for the name (see
    /// `waiting_row_name`).
    Waiting,
    /// The owner a hand-over passes the lease to.
    To,
    /// The lease, in the unit the dialect binds.
    Ttl,
    /// The name whose waiters a deleted record wakes (Postgres' `NOTIFY`
    /// payload), or empty for none.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Woken,
    /// The release channel (Postgres' `NOTIFY`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Channel,
    /// This client, as the lines of waiting clients name it (Postgres).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Client,
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
    pub(crate) waiting: &'a str,
    pub(crate) to: &'a str,
    pub(crate) woken: &'a str,
}

impl<'a> Args<'a> {
    /// The values of a statement about the row `name`.
    pub(crate) fn of(name: &'a str) -> Self {
        Args {
            name,
            ..Args::default()
        }
    }

    pub(crate) fn owner(self, owner: &'a str) -> Self {
        Args {
            owner: Some(owner),
            ..self
        }
    }

    pub(crate) fn ttl(self, ttl: Duration) -> Self {
        Args { ttl, ..self }
    }

    pub(crate) fn token(self, token: i64) -> Self {
        Args { token, ..self }
    }
}

/// A grant's statement: a writer's upsert, or a reader's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grant {
    /// [`LeaseStatements::acquire`].
    Acquire,
    /// [`LeaseStatements::share`].
    Share,
}

/// What a grant asks: which statement, with what values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    pub(crate) grant: Grant,
    pub(crate) args: Args<'a>,
}

/// A dialect's statements of `lease` mode. Those of a grant and a hand-over
/// answer in each database's own way (see `LeaseDialect`); the others read
/// the same on every database.
#[derive(Debug)]
pub(crate) struct LeaseStatements {
    /// A writer's upsert: the lease taken with a new fence when free or
    /// expired, else the holder's remaining lease.
    pub(crate) acquire: LeaseSql,
    /// A reader joins the group holding the row, or starts one on a free
    /// row, unless a writer holds it or the record `waiting` is live: the
    /// reader's own token, or the longer of the row's and the record's
    /// remaining lease. The group's expiry becomes the later of its own and
    /// `ttl`.
    pub(crate) share: LeaseSql,
    /// Owner-conditional pass of the live lease to `to` for `ttl`, with the
    /// fence bumped: the new fence, or nothing when it was not `owner`'s.
    pub(crate) hand_over: LeaseSql,
    /// Owner-conditional extension of a live lease: a row changed if it
    /// was `owner`'s.
    pub(crate) extend: LeaseSql,
    /// Owner-conditional release: a row changed if it was `owner`'s. Tried
    /// in order until one changes a row (Postgres: the second, when the
    /// first changed nothing, hands the row to the line of waiting clients).
    pub(crate) release: Vec<LeaseSql>,
    /// The release of `owner`'s lease once it has run out (a holding kept
    /// to its `min_hold`): the row left as a release leaves it.
    pub(crate) purge: LeaseSql,
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
    /// This client, as Postgres' lines of waiting clients name it (16 hex
    /// digits, random); empty elsewhere.
    pub(crate) client: String,
}

impl LeaseStatements {
    /// The statement of `grant`.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn grant(&self, grant: Grant) -> &LeaseSql {
        match grant {
            Grant::Acquire => &self.acquire,
            Grant::Share => &self.share,
        }
    }

    /// The values of `sql`'s parameters, from `args`, bound as dialect `D`
    /// binds them.
    pub(crate) fn values<'a, D: LeaseDialect + ?Sized>(
        &'a self,
        sql: &LeaseSql,
        args: Args<'a>,
    ) -> Vec<Value<'a>> {
        let param = |param: &Param| match param {
            Param::Name => D::name_value(args.name),
            Param::Owner => Value::MaybeText(args.owner),
            Param::Token => Value::Int(args.token),
            Param::Ttl => D::ttl_value(args.ttl),
            Param::Waiting => D::name_value(args.waiting),
            Param::To => Value::Text(args.to),
            Param::Woken => Value::Text(args.woken),
            Param::Channel => Value::Text(&self.channel),
            Param::Client => Value::Text(&self.client),
        };
        sql.params.iter().map(param).collect()
    }
}
