//! A session lock's holding: the dedicated connection behind a guard, its
//! liveness checks and its identity record.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lockkit_core::backend::{Lease, LossNotifier};
use lockkit_core::{LockError, LostReason, Result};
use tokio::time::Instant;

use super::{Checkout, Connections, Record, SessionDb};
use crate::lease::IdentityRecords;

/// A holding's identity record: its row and the stored owner.
#[derive(Debug)]
pub(super) struct Identity {
    pub(super) row: String,
    pub(super) owner: String,
}

impl Identity {
    /// The record as a statement carries it, with a lease of `ttl`.
    pub(super) fn record(&self, ttl: Duration) -> Record<'_> {
        Record {
            row: &self.row,
            owner: &self.owner,
            ttl,
        }
    }
}

/// The dedicated connection behind a guard.
pub(super) struct SessionLease<D: SessionDb> {
    pub(super) this: Weak<SessionLease<D>>,
    pub(super) conns: Arc<Connections<D>>,
    pub(super) records: Arc<dyn IdentityRecords>,
    /// The identity record, if the holding records one.
    pub(super) identity: Option<Identity>,
    pub(super) key: D::Key,
    /// `None` once released or lost.
    pub(super) conn: tokio::sync::Mutex<Option<D::Conn>>,
    pub(super) notifier: OnceLock<LossNotifier>,
    pub(super) ttl: Duration,
    /// The liveness task, until its first check (see [`schedule_liveness`]).
    pub(super) liveness: Mutex<Option<lockkit_core::backend::ScheduledSpawn>>,
}

impl<D: SessionDb> fmt::Debug for SessionLease<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLease")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<D: SessionDb> SessionLease<D> {
    fn mark_lost(&self, reason: LostReason) {
        if let Some(notifier) = self.notifier.get() {
            notifier.mark_lost(reason);
        }
    }

    /// The liveness query; `false` (and the guard marked lost) once the lock
    /// is gone. Bounded by the TTL: a connection that cannot answer within
    /// the lease's whole length is given up.
    async fn check(&self) -> bool {
        let mut slot = self.conn.lock().await;
        let Some(conn) = slot.take() else {
            return false;
        };
        let mut checkout = Checkout::new(&self.conns, conn);
        let db = &self.conns.db;
        let outcome = tokio::time::timeout(self.ttl, db.ping(checkout.conn(), &self.key)).await;
        match outcome {
            Ok(Ok(true)) => {
                *slot = Some(checkout.finish());
                true
            }
            Ok(Ok(false)) => {
                checkout.close();
                self.mark_lost(LostReason::Revoked);
                false
            }
            Ok(Err(error)) => {
                tracing::warn!(backend = db.backend_name(), %error, "the connection holding a lock failed its liveness check");
                checkout.close();
                self.mark_lost(LostReason::ConnectionLost);
                false
            }
            Err(_) => {
                tracing::warn!(backend = db.backend_name(), ttl = ?self.ttl, "the connection holding a lock did not answer within the ttl");
                drop(checkout);
                self.mark_lost(LostReason::ConnectionLost);
                false
            }
        }
    }
}

#[lockkit_core::async_trait]
impl<D: SessionDb> Lease for SessionLease<D> {
    fn backend_name(&self) -> &'static str {
        self.conns.db.backend_name()
    }

    /// The server keeps a session lock as long as the connection lives; the
    /// TTL is the client's bound. Extending checks that the connection still
    /// holds the lock, and renews the identity record for `ttl`.
    ///
    /// The check runs in a task of its own: the watchdog gives up waiting
    /// for it when the validity runs out, and dropping a check in the middle
    /// of its query would leave the connection in an unknown state.
    async fn extend(&self, ttl: Duration) -> Result<bool> {
        let Some(this) = self.this.upgrade() else {
            return Ok(false);
        };
        Ok(tokio::spawn(async move {
            let held = this.check().await;
            if let (true, Some(identity)) = (held, &this.identity)
                && let Err(error) = this.records.record(&identity.row, &identity.owner, ttl).await
            {
                tracing::warn!(backend = this.conns.db.backend_name(), %error, "could not renew the holder's identity record");
            }
            held
        })
        .await
        .unwrap_or(false))
    }

    async fn release(&self) -> Result<bool> {
        if let Some(liveness) = self
            .liveness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            liveness.cancel();
        }
        let mut slot = self.conn.lock().await;
        let Some(conn) = slot.take() else {
            return Ok(false);
        };
        let mut checkout = Checkout::new(&self.conns, conn);
        let db = &self.conns.db;
        let limit = db.settings().command_timeout;
        // The identity record goes with the unlock where its statement
        // carries it; else at the same time, on a pooled connection. Either
        // way it is deleted only while it is still this holding's.
        let carried = db.carries_records(&self.key);
        let record = self
            .identity
            .as_ref()
            .filter(|_| carried)
            .map(|identity| identity.record(self.ttl));
        let unlock = tokio::time::timeout(limit, db.unlock(checkout.conn(), &self.key, record));
        let unlocked = match self.identity.as_ref().filter(|_| !carried) {
            None => unlock.await,
            Some(identity) => {
                let forget = async {
                    if let Err(error) = self.records.forget(&identity.row, &identity.owner).await {
                        tracing::warn!(backend = db.backend_name(), %error, "could not delete the holder's identity record; it ends with its TTL");
                    }
                };
                tokio::join!(unlock, forget).0
            }
        };
        match unlocked {
            Ok(Ok(true)) => {
                self.conns.put_back(checkout.finish());
                Ok(true)
            }
            Ok(Ok(false)) => {
                checkout.close();
                Ok(false)
            }
            Ok(Err(LockError::Unavailable { .. })) => {
                // The connection is gone, and the server dropped its locks with it.
                checkout.close();
                self.mark_lost(LostReason::ConnectionLost);
                Ok(false)
            }
            Ok(Err(error)) => {
                tracing::warn!(backend = db.backend_name(), %error, "unlock failed; closing the connection, which releases the lock");
                Ok(true)
            }
            Err(_) => {
                tracing::warn!(
                    backend = db.backend_name(),
                    ?limit,
                    "unlock got no answer; closing the connection, which releases the lock"
                );
                Ok(true)
            }
        }
    }
}

/// Checks the held lock's connection every `interval` until it is released
/// or lost, so that a dropped connection marks the guard lost even when
/// auto-renew is off. The task is spawned only when the first check is due
/// ([`lockkit_core::backend::spawn_at`]): a holding released sooner costs no task.
pub(super) fn schedule_liveness<D: SessionDb>(lease: &Arc<SessionLease<D>>, interval: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    let weak = Arc::downgrade(lease);
    let checks = async move {
        loop {
            let Some(lease) = weak.upgrade() else { return };
            if !lease.check().await {
                return;
            }
            drop(lease);
            tokio::time::sleep(interval).await;
        }
    };
    let scheduled = lockkit_core::backend::spawn_at(Instant::now() + interval, checks);
    *lease.liveness.lock().unwrap_or_else(|p| p.into_inner()) = scheduled;
}
