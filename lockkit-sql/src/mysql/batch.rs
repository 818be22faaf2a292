//! Statements sent several at once, in one message (the text protocol):
//! they bind nothing, so names and values go in as literals (see
//! [`hex_literal`](crate::names::hex_literal)).

use futures_util::TryStreamExt as _;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Either, MySqlConnection, Row as _};

/// What the server did with statements sent in one message.
#[derive(Debug)]
pub(super) struct Batch {
    /// How many of them it finished.
    pub(super) done: usize,
    /// The first row any of them returned.
    pub(super) first: Option<MySqlRow>,
    /// The error that stopped the rest, if one did.
    pub(super) error: Option<sqlx::Error>,
}

impl Batch {
    /// The first row's first column (`None` for no row, or `NULL`), or the
    /// error that stopped the statements.
    pub(super) fn answer(self) -> sqlx::Result<Option<i64>> {
        match self.row()? {
            Some(row) => row.try_get(0),
            None => Ok(None),
        }
    }

    /// The first row, or the error that stopped the statements.
    pub(super) fn row(self) -> sqlx::Result<Option<MySqlRow>> {
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
            Ok(Some(Either::Right(row))) if batch.first.is_none() => batch.first = Some(row),
            Ok(Some(Either::Right(_))) => {}
            Ok(None) => return batch,
            Err(error) => {
                batch.error = Some(error);
                return batch;
            }
        }
    }
}
