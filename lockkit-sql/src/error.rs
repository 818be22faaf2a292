//! Mapping sqlx errors into `LockError`.

use std::time::Duration;

use lockkit_core::LockError;

/// The SQLSTATE / error codes that mean "the lock is held and the wait is over".
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn is_lock_busy(error: &sqlx::Error) -> bool {
    let Some(db) = error.as_database_error() else {
        return false;
    };
    matches!(
        db.code().as_deref(),
        // Postgres lock_not_available (lock_timeout, NOWAIT).
        Some("55P03")
    ) || mysql_code(db).is_some_and(|code| {
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_NOWAIT (MySQL 8).
        code == 1205 || code == 3572
    })
}

/// Whether the statement's transaction was chosen as a deadlock victim
/// (MySQL/MariaDB 1213, Postgres 40P01): the server rolled it back whole,
/// so running it again is safe.
pub(crate) fn is_deadlock(error: &sqlx::Error) -> bool {
    let Some(db) = error.as_database_error() else {
        return false;
    };
    db.code().as_deref() == Some("40P01") || mysql_code(db) == Some(1213)
}

/// Whether the statement was ended by another session: MySQL/MariaDB's
/// `KILL QUERY` (`ER_QUERY_INTERRUPTED`, 1317), PostgreSQL's
/// `pg_cancel_backend` (`query_canceled`, 57014).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn is_interrupted(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("57014") || mysql_code(db) == Some(1317))
}

// SQLite's primary result codes (the low byte of an extended code).
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CANTOPEN: i32 = 14;

fn sqlite_error(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    {
        db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
    }
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = db;
        false
    }
}

#[cfg(feature = "mysql")]
fn mysql_code(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

#[cfg(not(feature = "mysql"))]
fn mysql_code(_db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    None
}

/// Whether the error means the connection itself is unusable (so a session
/// lock held on it is gone).
pub(crate) fn is_connection_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or("");
            // Postgres: connection exceptions (class 08), admin / crash shutdown.
            code.starts_with("08")
                // SQLite: busy or locked past the busy timeout, cannot open, I/O error.
                || (sqlite_error(db.as_ref())
                    && code
                        .parse::<i32>()
                        .is_ok_and(|c| matches!(c & 0xff, SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR | SQLITE_CANTOPEN)))
                || matches!(code, "57P01" | "57P02" | "57P03")
                // MySQL: server gone, lost connection, killed.
                || mysql_code(db.as_ref()).is_some_and(|c| matches!(c, 1053 | 1927 | 2006 | 2013))
        }
        _ => false,
    }
}

/// Whether the server refused the credentials (PostgreSQL 28P01/28000,
/// MySQL/MariaDB 1044, 1045, 1698).
pub(crate) fn is_auth_error(error: &sqlx::Error) -> bool {
    let Some(db) = error.as_database_error() else {
        return false;
    };
    matches!(db.code().as_deref(), Some("28P01" | "28000"))
        || mysql_code(db).is_some_and(|c| matches!(c, 1044 | 1045 | 1698))
}

/// Maps an sqlx error of `what` against `address` (never with credentials).
pub(crate) fn map_error(
    backend: &'static str,
    address: &str,
    what: &str,
    error: sqlx::Error,
) -> LockError {
    if is_auth_error(&error) {
        return LockError::Backend {
            backend,
            message: format!(
                "{what} on {address}: authentication failed; check the user name and password in the URL"
            ),
            source: Some(Box::new(error)),
        };
    }
    let message = format!("{what} on {address} failed: {error}");
    if is_connection_error(&error) {
        LockError::Unavailable {
            backend,
            message,
            source: Some(Box::new(error)),
        }
    } else {
        LockError::Backend {
            backend,
            message,
            source: Some(Box::new(error)),
        }
    }
}

/// The error of a statement that got no answer in time.
pub(crate) fn timed_out(
    backend: &'static str,
    address: &str,
    what: &str,
    limit: Duration,
) -> LockError {
    LockError::unavailable(
        backend,
        format!("{what} on {address}: no answer within {limit:?}"),
    )
}
