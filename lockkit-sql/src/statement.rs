//! Running a dialect's statements: their text, their bound values, and the
//! future of their answer. Every dialect binds through [`Bind::bind_all`],
//! so that a statement's call site reads as its text and its values in
//! order.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{AssertSqlSafe, Database, Encode, Executor, FromRow, IntoArguments, Type};

/// The answer of one statement on one connection.
pub(crate) type Answer<'c, T> = BoxFuture<'c, sqlx::Result<T>>;

/// A statement's text, built once from a validated table name (see
/// [`validate_table`](crate::validate_table)) and so safe to send as it is;
/// lock names are bound values, never part of it.
pub(crate) fn trusted(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(sql.clone())
}

/// One value a statement binds, in the type its column has.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    Text(&'a str),
    /// A text that may be `NULL`.
    MaybeText(Option<&'a str>),
    /// Bytes, for MySQL's `VARBINARY` name column.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Bytes(&'a [u8]),
    Int(i64),
    /// Seconds, for MySQL's `GET_LOCK`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Float(f64),
}

/// The databases that bind every [`Value`].
pub(crate) trait Binds: Database {
    /// `query` with `value` bound next.
    fn bind_value<'q, Q: Bind<'q, Self>>(query: Q, value: Value<'q>) -> Q;
}

impl<DB> Binds for DB
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    i64: for<'a> Encode<'a, DB> + Type<DB>,
    f64: for<'a> Encode<'a, DB> + Type<DB>,
{
    fn bind_value<'q, Q: Bind<'q, DB>>(query: Q, value: Value<'q>) -> Q {
        match value {
            Value::Text(text) => query.bind_one(text),
            Value::MaybeText(text) => query.bind_one(text),
            Value::Bytes(bytes) => query.bind_one(bytes),
            Value::Int(n) => query.bind_one(n),
            Value::Float(x) => query.bind_one(x),
        }
    }
}

/// A query that takes bound values (sqlx's three kinds). (sqlx keeps an
/// encoding error and reports it when the statement runs.)
pub(crate) trait Bind<'q, DB: Database>: Sized {
    fn bind_one<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self;

    /// `values`, in order.
    fn bind_all(self, values: &[Value<'q>]) -> Self
    where
        DB: Binds,
    {
        values
            .iter()
            .fold(self, |query, value| DB::bind_value(query, *value))
    }
}

impl<'q, DB: Database> Bind<'q, DB> for Query<'q, DB, DB::Arguments> {
    fn bind_one<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, DB: Database, O> Bind<'q, DB> for QueryAs<'q, DB, O, DB::Arguments> {
    fn bind_one<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, DB: Database, O> Bind<'q, DB> for QueryScalar<'q, DB, O, DB::Arguments> {
    fn bind_one<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

/// A duration in whole milliseconds.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn whole_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration as the whole milliseconds a statement binds.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn millis(d: Duration) -> Value<'static> {
    Value::Int(whole_millis(d))
}

/// A duration in whole microseconds.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn whole_micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A duration as the whole microseconds a statement binds.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn micros(d: Duration) -> Value<'static> {
    Value::Int(whole_micros(d))
}

/// A remaining time in milliseconds as a server answered it (never
/// negative).
pub(crate) fn remaining_ms(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// The rows a statement changed (on MySQL: found, as sqlx asks for).
pub(crate) trait Changed {
    fn changed(&self) -> u64;
}

/// [`Changed`] for the query results of the databases compiled in.
macro_rules! changed_rows {
    ($($feature:literal => $result:ty),*) => {
        $(
            #[cfg(feature = $feature)]
            impl Changed for $result {
                fn changed(&self) -> u64 {
                    self.rows_affected()
                }
            }
        )*
    };
}

changed_rows!(
    "postgres" => sqlx::postgres::PgQueryResult,
    "mysql" => sqlx::mysql::MySqlQueryResult,
    "sqlite" => sqlx::sqlite::SqliteQueryResult
);

/// A live row as a status statement answers it: fence, remaining
/// milliseconds, owner.
pub(crate) type LiveColumns = (i64, i64, Option<String>);

/// A statement to run: its text and its values.
pub(crate) type Stmt<'s, 'c> = (&'s Arc<str>, &'s [Value<'c>]);

/// The databases on whose connections the engines run a dialect's
/// statements without knowing the database.
pub(crate) trait Runs: Binds {
    /// Runs `stmt`: the rows it changed.
    fn changed<'c>(conn: &'c mut Self::Connection, stmt: Stmt<'_, 'c>) -> Answer<'c, u64>;

    /// Runs `stmt`: the number in its one row, if any.
    fn number<'c>(conn: &'c mut Self::Connection, stmt: Stmt<'_, 'c>) -> Answer<'c, Option<i64>>;

    /// Runs `stmt`: its one row of [`LiveColumns`], if any.
    fn live<'c>(
        conn: &'c mut Self::Connection,
        stmt: Stmt<'_, 'c>,
    ) -> Answer<'c, Option<LiveColumns>>;
}

impl<DB> Runs for DB
where
    DB: Binds<Arguments: IntoArguments<DB>, QueryResult: Changed>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    LiveColumns: for<'r> FromRow<'r, DB::Row>,
    (i64,): for<'r> FromRow<'r, DB::Row>,
{
    fn changed<'c>(conn: &'c mut DB::Connection, (sql, values): Stmt<'_, 'c>) -> Answer<'c, u64> {
        let query = sqlx::query::<DB>(trusted(sql)).bind_all(values);
        Box::pin(async move { query.execute(conn).await.map(|done| done.changed()) })
    }

    fn number<'c>(
        conn: &'c mut DB::Connection,
        (sql, values): Stmt<'_, 'c>,
    ) -> Answer<'c, Option<i64>> {
        Box::pin(
            sqlx::query_scalar::<DB, i64>(trusted(sql))
                .bind_all(values)
                .fetch_optional(conn),
        )
    }

    fn live<'c>(
        conn: &'c mut DB::Connection,
        (sql, values): Stmt<'_, 'c>,
    ) -> Answer<'c, Option<LiveColumns>> {
        Box::pin(
            sqlx::query_as::<DB, LiveColumns>(trusted(sql))
                .bind_all(values)
                .fetch_optional(conn),
        )
    }
}
