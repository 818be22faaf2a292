//! Leases of released holdings, kept for the client's next acquire.
//!
//! etcd's own `concurrency` package holds one session lease for many
//! acquisitions. lockkit gives every holding a lease of its own (its TTL is
//! the holding's), but a lease whose holding was released cleanly (its key
//! deleted) is kept here: the next acquire with the same TTL renews it (a
//! keep-alive, which the leader answers without a Raft write) instead of
//! granting a new one, and the release needs no revocation. An uncontended
//! cycle is then two writes (create, delete) instead of four (grant,
//! create, delete, revoke).
//!
//! A lease is only ever used by one holding at a time: it comes back here
//! only after its key was deleted, and a holding that takes it owns it until
//! its own release. At most [`MAX_IDLE`] leases wait here; one that waited
//! longer than half its TTL is not reused (revoked instead, or left to end
//! with its TTL), so an idle client leaves nothing behind for long.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many released leases a client keeps at most.
pub(crate) const MAX_IDLE: usize = 16;

/// A released lease.
#[derive(Debug, Clone, Copy)]
struct Idle {
    id: i64,
    ttl: Duration,
    /// Reusable until then: half its TTL after it was last known alive.
    until: Instant,
}

/// The released leases of one client.
#[derive(Debug, Default)]
pub(crate) struct LeasePool {
    idle: Mutex<Vec<Idle>>,
}

impl LeasePool {
    /// A kept lease of `ttl` still worth renewing, if there is one; and
    /// those that waited too long, to revoke.
    pub(crate) fn take(&self, ttl: Duration) -> (Option<i64>, Vec<i64>) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let stale: Vec<i64> = idle
            .iter()
            .filter(|l| l.until <= now)
            .map(|l| l.id)
            .collect();
        idle.retain(|l| l.until > now);
        let found = idle.iter().rposition(|l| l.ttl == ttl);
        (found.map(|i| idle.swap_remove(i).id), stale)
    }

    /// Keeps `id` (of `ttl`, known alive at `alive_at`, its key deleted);
    /// gives back the lease to revoke when the pool is full.
    pub(crate) fn put(&self, id: i64, ttl: Duration, alive_at: Instant) -> Option<i64> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let lease = Idle {
            id,
            ttl,
            until: alive_at + ttl / 2,
        };
        if idle.len() < MAX_IDLE {
            idle.push(lease);
            None
        } else {
            // The oldest goes: it would be the first to go stale.
            let oldest = idle.remove(0);
            idle.push(lease);
            Some(oldest.id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leases_are_reused_by_ttl_while_fresh_and_bounded() {
        let pool = LeasePool::default();
        let (ten, twenty) = (Duration::from_secs(10), Duration::from_secs(20));
        assert_eq!(pool.take(ten), (None, vec![]));
        assert_eq!(pool.put(1, ten, Instant::now()), None);
        assert_eq!(pool.put(2, twenty, Instant::now()), None);
        assert_eq!(pool.take(ten), (Some(1), vec![]));
        assert_eq!(pool.take(ten), (None, vec![]));
        tokio::time::advance(Duration::from_secs(11)).await;
        // Past half its TTL, lease 2 is given back to revoke.
        assert_eq!(pool.take(twenty), (None, vec![2]));
        for id in 0..MAX_IDLE as i64 {
            assert_eq!(pool.put(id, ten, Instant::now()), None);
        }
        assert_eq!(pool.put(99, ten, Instant::now()), Some(0));
        assert_eq!(pool.take(ten), (Some(99), vec![]));
    }
}
