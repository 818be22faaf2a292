//! Statements sent several at once, in one message (the text protocol):
//! they bind nothing, so names and values go in as literals (see
//! [`hex_literal`](crate::names::hex_literal)).

use futures_util::TryStreamExt as _;
use sqlx::{AssertSqlSafe, Either, MySqlConnection, Row as _};

/// What the server did with statements sent in one message.
#[derive(Debug)]
pub(super) struct Batch {
    /// How many of them it finished.
    pub(super) done: usize,
    /// The first column of the first row any of them returned.
    pub(super) first: Option<i64>,
    /// The error that stopped the rest, if one did.
    pub(super) error: Option<sqlx::Error>,
}

impl Batch {
    /// The first row's value, or the error that stopped the statements.
    pub(super) fn answer(self) -> sqlx::Result<Option<i64>> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(self.first),
        }
    }
}

/// Sends `sql`, statements separated by `;` with nothing to bind, in one
/// message on `conn`; the server runs them in order and stops at the first
/// error.
pub(super) async fn batch(conn: &mut MySqlConnection, sql: String) -> Batch {
    let mut answers = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(conn);
    let mut batch = Batch {
        done: 0,
        first: None,
        error: None,
    };
    loop {
        match answers.try_next().await {
            Ok(Some(Either::Left(_))) => batch.done += 1,
            Ok(Some(Either::Right(row))) if batch.first.is_none() => {
                match row.try_get::<Option<i64>, _>(0) {
                    Ok(value) => batch.first = value,
                    Err(error) => batch.error = Some(error),
                }
            }
            Ok(Some(Either::Right(_))) => {}
            Ok(None) => return batch,
            Err(error) => {
                batch.error = Some(error);
                return batch;
            }
        }
    }
}
