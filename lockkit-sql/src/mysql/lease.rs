//! `lease` mode on MySQL and MariaDB: the answer of an upsert comes back in
//! `LAST_INSERT_ID`, as MySQL has no `RETURNING`; waiters of other clients
//! are woken by the release bells.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryFutureExt as _;
use futures_util::future::BoxFuture;
use lockkit_core::backend::{Attempt, ReleaseWatch};
use lockkit_core::{Capabilities, FencingToken};
use sqlx::AssertSqlSafe;

use super::bells::{ASK_AGAIN, Bells};
use super::statements::{BUSY_FLAG, CONNECTION_ID, MySql};
use crate::lease::{Args, Ask, Conn, Grant, Granted, LeaseDialect, LeaseStatements};
use crate::pool::SessionId;
use crate::settings::{NOTIFIED_LEASE_CAPABILITIES, Settings};
use crate::statement::{Answer, Bind as _, Value, micros, trusted};

/// What a lease upsert answered in `LAST_INSERT_ID`: the new fence, or
/// [`BUSY_FLAG`] plus the remaining wait in µs (asked again within
/// [`ASK_AGAIN`] at the latest, should no bell ring).
fn upsert_answer(answer: u64) -> sqlx::Result<Granted> {
    if answer >= BUSY_FLAG {
        let remaining = Duration::from_micros(answer - BUSY_FLAG);
        Ok(Attempt::Busy {
            retry_after: Some(remaining.min(ASK_AGAIN)),
        })
    } else if answer > 0 {
        Ok(Attempt::Acquired(Some(FencingToken::new(answer))))
    } else {
        Err(sqlx::Error::Protocol(
            "the server returned no LAST_INSERT_ID for the lease upsert".into(),
        ))
    }
}

/// `lease` mode on MySQL/MariaDB, its waiters woken by the release bells.
#[derive(Debug)]
pub(super) struct MyLease {
    pub(super) sql: Arc<MySql>,
    pub(super) bells: Bells,
}

impl LeaseDialect for MyLease {
    type Db = sqlx::MySql;
    const CAPABILITIES: Capabilities = NOTIFIED_LEASE_CAPABILITIES;

    fn statements(&self) -> &LeaseStatements {
        &self.sql.lease
    }

    /// Names are `VARBINARY`.
    fn name_value(name: &str) -> Value<'_> {
        Value::Bytes(name.as_bytes())
    }

    /// `INTERVAL … MICROSECOND`.
    fn ttl_value(ttl: Duration) -> Value<'static> {
        micros(ttl)
    }

    /// The connection id (MariaDB and MySQL never reuse one while the
    /// server runs).
    fn session_id(conn: &mut Conn<Self>) -> Answer<'_, Option<SessionId>> {
        let query = sqlx::query_scalar::<_, i64>(CONNECTION_ID);
        Box::pin(query.fetch_one(conn).map_ok(|id| Some(SessionId(id))))
    }

    /// `KILL CONNECTION` (which fails if it is already gone), then waits
    /// until the process list no longer has it: the server ends a killed
    /// connection's statement in its own time.
    fn end_session(conn: &mut Conn<Self>, SessionId(id): SessionId) -> Answer<'_, ()> {
        Box::pin(async move {
            let kill = format!("KILL CONNECTION {id}");
            if let Err(error) = sqlx::raw_sql(AssertSqlSafe(kill)).execute(&mut *conn).await {
                tracing::trace!(connection = id, %error, "KILL CONNECTION");
            }
            const PRESENT: &str =
                "SELECT CAST(1 AS SIGNED) FROM information_schema.PROCESSLIST WHERE ID = ?";
            let mut pause = Duration::from_millis(2);
            while sqlx::query_scalar::<_, i64>(PRESENT)
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
                .is_some()
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Ok(())
        })
    }

    /// While a writer waits, a reader's upsert changes no row (see the
    /// statement): busy, with no time to wait.
    fn grant<'c>(&'c self, conn: &'c mut Conn<Self>, ask: Ask<'c>) -> Answer<'c, Granted> {
        let sql = self.sql.lease.grant(ask.grant);
        let values = self.sql.lease.values::<Self>(sql, ask.args);
        let query = sqlx::query(trusted(&sql.text)).bind_all(&values);
        Box::pin(query.execute(conn).and_then(move |done| async move {
            if ask.grant == Grant::Share && done.rows_affected() == 0 {
                return Ok(Attempt::Busy { retry_after: None });
            }
            upsert_answer(done.last_insert_id())
        }))
    }

    /// One matched row when it was the owner's; the new fence in
    /// `LAST_INSERT_ID`.
    fn hand_over<'c>(
        &'c self,
        conn: &'c mut Conn<Self>,
        args: Args<'c>,
    ) -> Answer<'c, Option<i64>> {
        let sql = &self.sql.lease.hand_over;
        let values = self.sql.lease.values::<Self>(sql, args);
        Box::pin(
            sqlx::query(trusted(&sql.text))
                .bind_all(&values)
                .execute(conn)
                .map_ok(|done| (done.rows_affected() == 1).then(|| done.last_insert_id() as i64)),
        )
    }

    /// With nobody sleeping on the name's release bell (no live mark), the
    /// row goes (`lease.release`). Otherwise the sleepers of other clients
    /// are looked up: with none (this client's own bell is the one that
    /// marks the name), the row and the mark go; with some, the row is left
    /// to the other clients for [`RESERVED_MS`](super::statements::RESERVED_MS) (`reserve`: this client
    /// may not take it back meanwhile, so that a holder that releases and
    /// asks again at once does not take the lock straight back from the
    /// waiters it wakes), and their sleep is ended. A release that nobody
    /// waits for thus costs one statement, and one that others wait for
    /// costs three and a `KILL QUERY` per sleeper woken, however many
    /// clients wait.
    fn release<'c>(&'c self, conn: &'c mut Conn<Self>, args: Args<'c>) -> Answer<'c, u64> {
        Box::pin(async move {
            let sql = &self.sql;
            for release in &sql.lease.release {
                let changed = self.run(&mut *conn, release, args).await?;
                if changed >= 1 {
                    return Ok(changed);
                }
            }
            let sleepers = self.bells.sleepers(&mut *conn, args.name).await;
            if sleepers.is_empty() {
                return self.run(conn, &sql.release_marked, args).await;
            }
            let reserved = self.run(&mut *conn, &sql.reserve, args).await?;
            if reserved >= 1 {
                self.bells.wake(sleepers);
            }
            Ok(reserved)
        })
    }

    fn watch<'a>(&'a self, _: &'a Settings, name: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        Box::pin(self.bells.watch(name))
    }
}
