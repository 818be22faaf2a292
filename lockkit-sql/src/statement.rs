//! Small helpers shared by the databases' statement code.

use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;

/// A prepared statement's text, built once from a validated table name (see
/// [`validate_table`](crate::validate_table)); lock names are bound
/// parameters, never part of it.
pub(crate) fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(sql.clone())
}

/// A duration as the whole milliseconds a statement binds.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration as the whole microseconds a statement binds.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
