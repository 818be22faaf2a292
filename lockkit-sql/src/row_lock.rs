//! The row-lock loop of `row` mode, written once for every database that
//! has it: each database says how to begin and roll back, its locking
//! `SELECT`, how to create a missing row, and what a grant still needs.

use futures_util::future::BoxFuture;
use sqlx::{Database, Executor};

use crate::error::{is_deadlock, is_lock_busy};

/// One statement's answer on a connection.
pub(crate) type Answer<'c, T> = BoxFuture<'c, sqlx::Result<T>>;

/// One database's statements of `row` mode.
pub(crate) trait RowLocking: Sync {
    /// The sqlx database.
    type Db: Database;
    /// A dedicated connection.
    type Conn: Send;

    /// The sqlx connection of a dedicated connection.
    fn connection(conn: &mut Self::Conn) -> &mut <Self::Db as Database>::Connection;

    /// The locking `SELECT` of `name`'s row (`FOR UPDATE`, or `FOR UPDATE
    /// NOWAIT` with `no_wait`; the share-mode lock with `shared`, where the
    /// mode claims shared holdings): `Some(token)` once granted, `None` when
    /// the row does not exist, a "lock busy" error when the wait ended.
    fn select<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        name: &'c str,
        no_wait: bool,
        shared: bool,
    ) -> Answer<'c, Option<i64>>;

    /// Creates `name`'s row, committed on another connection so that it
    /// stays.
    fn ensure_row<'c>(&'c self, name: &'c str) -> Answer<'c, ()>;

    /// Makes `name`'s row if it is missing, without waiting for a lock a
    /// holder keeps on it; run while a lock begins its transaction, since a
    /// released name's row is gone (its holder deleted it) and the next
    /// holder would otherwise find it missing and begin again.
    fn make_missing_row<'c>(&'c self, name: &'c str) -> Answer<'c, ()>;

    /// The first row of `names` that no one has locked, locked `FOR UPDATE
    /// SKIP LOCKED`: its name and a token; `None` when every existing one is
    /// locked.
    fn select_free<'c>(
        &'c self,
        conn: &'c mut Self::Conn,
        names: &'c [String],
    ) -> Answer<'c, Option<(String, i64)>>;

    /// Creates the missing rows of `names` in one statement, committed on
    /// another connection.
    fn ensure_rows<'c>(&'c self, names: &'c [String]) -> Answer<'c, ()>;

    /// Deletes the row `name` in one autocommitted statement unless a
    /// transaction has it locked (`FOR UPDATE SKIP LOCKED` passes over it
    /// then, and does not wait): run after a holding's `ROLLBACK`, it leaves
    /// the row to a waiter that took the lock at once, or to a fellow reader,
    /// and otherwise removes it, so that a released name leaves no row.
    fn delete_if_free<'c>(&'c self, conn: &'c mut Self::Conn, name: &'c str) -> Answer<'c, ()>;

    /// What a grant still needs (a token drawn elsewhere): the fencing
    /// token. By default the one the `SELECT` drew.
    fn granted<'c>(&'c self, conn: &'c mut Self::Conn, token: i64) -> Answer<'c, i64> {
        let _ = conn;
        Box::pin(std::future::ready(Ok(token)))
    }
}

/// Locks `name`'s row in a transaction that stays open while the lock is
/// held: the fencing token when granted, `None` when busy (rolled back). A
/// name without a row gets one, and a second try.
pub(crate) async fn lock_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    name: &str,
    no_wait: bool,
    shared: bool,
) -> sqlx::Result<Option<i64>>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    // A waiter can find the row gone when a holder's clean-up deleted it
    // meanwhile: it makes the row again and waits anew.
    for attempt in 0..VANISHED_LIMIT {
        if attempt == 0 {
            begin_with_row(locking, conn, name).await?;
        } else {
            run::<R>(conn, "BEGIN").await?;
        }
        match locking.select(conn, name, no_wait, shared).await {
            Ok(Some(token)) => {
                return match locking.granted(conn, token).await {
                    Ok(token) => Ok(Some(token)),
                    Err(error) => {
                        run::<R>(conn, "ROLLBACK").await?;
                        Err(error)
                    }
                };
            }
            Ok(None) => {
                run::<R>(conn, "ROLLBACK").await?;
                match locking.ensure_row(name).await {
                    Err(error) if is_deadlock(&error) => {}
                    answer => answer?,
                }
            }
            // Waiters that find a deleted row, and the inserts that make it
            // again, can deadlock in InnoDB; the victim was rolled back
            // whole, and waits again.
            Err(error) if is_deadlock(&error) => {
                tracing::debug!(%error, "row lock chosen as a deadlock victim; waiting again");
                run::<R>(conn, "ROLLBACK").await?;
            }
            Err(error) => {
                run::<R>(conn, "ROLLBACK").await?;
                return if is_lock_busy(&error) {
                    Ok(None)
                } else {
                    Err(error)
                };
            }
        }
    }
    Err(sqlx::Error::Protocol(format!(
        "the row of lock {name:?} vanished (or its lock deadlocked) {VANISHED_LIMIT} times in a row while being locked"
    )))
}

/// `BEGIN`, and at the same time the row of `name` made where it is missing
/// (see [`RowLocking::make_missing_row`]). Its errors other than a deadlock
/// end the attempt (rolled back).
async fn begin_with_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    name: &str,
) -> sqlx::Result<()>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    let (begun, made) =
        futures_util::future::join(run::<R>(conn, "BEGIN"), locking.make_missing_row(name)).await;
    begun?;
    match made {
        Err(error) if !is_deadlock(&error) => {
            run::<R>(conn, "ROLLBACK").await?;
            Err(error)
        }
        _ => Ok(()),
    }
}

/// How often in a row [`lock_row`] makes a vanished row again.
const VANISHED_LIMIT: usize = 64;

/// Ends a `row` mode holding of the row `name`: `ROLLBACK`, which hands
/// the lock to the next waiter at once, then the row's clean-up (see
/// [`RowLocking::delete_if_free`]). A failed clean-up leaves the row, which
/// serves the name's next holder.
pub(crate) async fn unlock_row<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    name: &str,
) -> sqlx::Result<bool>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    run::<R>(conn, "ROLLBACK").await?;
    if let Err(error) = locking.delete_if_free(conn, name).await {
        tracing::debug!(%error, "could not delete a released row; it stays");
    }
    Ok(true)
}

/// Locks a free permit slot of a semaphore's rows (`slots`, see
/// [`permit_row_name`](crate::lease::permit_row_name)) in a transaction that
/// stays open while the permit is held: the slot's index and the token, or
/// `None` when every slot is held (rolled back). The slot `first` is tried
/// alone first (a point lookup, and clients spread over the slots), then
/// all of them. Missing slot rows are created, and the slots tried again.
pub(crate) async fn lock_free_slot<R: RowLocking>(
    locking: &R,
    conn: &mut R::Conn,
    slots: &[String],
    first: usize,
) -> sqlx::Result<Option<(usize, i64)>>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    for round in 0..2 {
        run::<R>(conn, "BEGIN").await?;
        let free = match locking.select_free(conn, &slots[first..=first]).await {
            Ok(None) if slots.len() > 1 => locking.select_free(conn, slots).await,
            answer => answer,
        };
        match free {
            Ok(Some((row, token))) => {
                let granted = match slots.iter().position(|slot| *slot == row) {
                    Some(slot) => locking.granted(conn, token).await.map(|t| (slot, t)),
                    None => Err(sqlx::Error::Protocol(format!(
                        "the server locked {row:?}, which is not a slot of this semaphore"
                    ))),
                };
                if granted.is_err() {
                    run::<R>(conn, "ROLLBACK").await?;
                }
                return granted.map(Some);
            }
            Ok(None) => {
                run::<R>(conn, "ROLLBACK").await?;
                if round == 0 {
                    match locking.ensure_rows(slots).await {
                        // Another client is creating the same rows.
                        Err(error) if is_lock_busy(&error) || is_deadlock(&error) => {}
                        answer => answer?,
                    }
                }
            }
            // As in `lock_row`: tried again.
            Err(error) if is_deadlock(&error) => run::<R>(conn, "ROLLBACK").await?,
            Err(error) => {
                run::<R>(conn, "ROLLBACK").await?;
                return Err(error);
            }
        }
    }
    Ok(None)
}

/// `BEGIN` or `ROLLBACK` on a dedicated connection.
async fn run<R: RowLocking>(conn: &mut R::Conn, statement: &'static str) -> sqlx::Result<()>
where
    for<'c> &'c mut <R::Db as Database>::Connection: Executor<'c, Database = R::Db>,
{
    sqlx::raw_sql(statement)
        .execute(R::connection(conn))
        .await
        .map(drop)
}
