//! The rows beside a lock's own (permit slots, waiting writers, holder
//! identities), and the identity records written into them.

use std::fmt;
use std::time::Duration;

use lockkit_core::backend::holder_of;
use lockkit_core::{LockKind, Result};

use super::{LeaseDialect, LeaseRows};

/// Identity records: lease rows that say who holds a lock whose holding has
/// no place for it (a session lock; see [`holder_row_name`]). The record's
/// owner is [`stored_owner`](lockkit_core::backend::stored_owner)'s value; its lease follows the holding's.
#[lockkit_core::async_trait]
// Only the session modes write records; SQLite alone reads them.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) trait IdentityRecords: Send + Sync + fmt::Debug + 'static {
    /// Writes `owner` into the record `row` for `ttl`, in place of any
    /// earlier record (a crashed holder's, whose lease may still run).
    async fn record(&self, row: &str, owner: &str, ttl: Duration) -> Result<()>;
    /// Deletes the record `row` if it is still `owner`'s.
    async fn forget(&self, row: &str, owner: &str) -> Result<()>;
    /// The holder identity in the live record `row`, if any.
    async fn read(&self, row: &str) -> Result<Option<String>>;
}

/// The same upsert and conditional delete as a waiting writer's record,
/// on a row of its own.
#[lockkit_core::async_trait]
impl<D: LeaseDialect> IdentityRecords for LeaseRows<D> {
    async fn record(&self, row: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.rows
            .write_record(row, owner, ttl, "record the holder's identity")
            .await
    }

    async fn forget(&self, row: &str, owner: &str) -> Result<()> {
        self.rows
            .delete_record(Some(row), row, Some(owner), "delete the holder's identity")
            .await
    }

    async fn read(&self, row: &str) -> Result<Option<String>> {
        let record = self.rows.row_status(row).await?;
        Ok(record.and_then(|live| holder_of(&live.owner?).map(str::to_owned)))
    }
}

/// A row beside the lock's own for `name`: `\x01<role>:` and 40 hex digits
/// of the SHA-256 of the name. Lock names cannot contain `\x01`, so these
/// rows are apart from every lock's row, and they fit every database's
/// name column.
fn side_row_name(role: &str, name: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("\u{1}{role}:{hex}")
}

/// The lease row of permit slot `slot` (0-based) of the semaphore `name`:
/// `\x01permit:<hash>:<slot>` (see [`side_row_name`]).
pub(crate) fn permit_row_name(name: &str, slot: u32) -> String {
    format!("{}:{slot}", side_row_name("permit", name))
}

/// The row that marks `name` as waited for on a release bell (MySQL and
/// MariaDB, see `mysql::bells`): `\x01bell:<hash>`.
#[cfg(feature = "mysql")]
pub(crate) fn bell_mark_row(name: &str) -> String {
    side_row_name("bell", name)
}

/// The row where a writer waiting for `name` records itself:
/// `\x01waiting:<hash>`.
pub(crate) fn waiting_row_name(name: &str) -> String {
    side_row_name("waiting", name)
}

/// The row that records the identity of a holder of `name` where the
/// holding itself has no place for it (a reader group in `lease` mode, a
/// session lock): `\x01holder:<hash>`, or `\x01holders:<hash>` for the
/// semaphore `name`.
pub(crate) fn holder_row_name(name: &str, kind: LockKind) -> String {
    match kind {
        LockKind::Semaphore { .. } => side_row_name("holders", name),
        _ => side_row_name("holder", name),
    }
}
