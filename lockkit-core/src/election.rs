//! Leader election on any [`DistributedLock`] that records holders.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Result;
use crate::fencing::FencingToken;
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::lost::LostReason;
use crate::options::LockOptions;

/// A leader election: candidates that campaign for one name, at most one of
/// them leading at a time.
///
/// Built on the trait: [`campaign`](Self::campaign) takes the name
/// exclusively with [`holder(identity)`](LockOptions::holder), the term is
/// the holding's fencing token, [`Leadership::resign`] releases it, and
/// [`leader`](Self::leader) reads the holder from
/// [`status`](DistributedLock::status). So it works on every backend whose
/// capabilities say [`holder`](crate::Capabilities::holder) (elsewhere
/// `campaign` is `Unsupported`), with the backend's guarantees: a leader
/// whose lease runs out learns it through [`Leadership::lost`] before
/// another candidate can be granted the name (TTL backends), or at once
/// (session backends); where the backend fences, terms strictly increase
/// across leaders, and a resource that checks them refuses a deposed
/// leader's writes.
///
/// ```
/// # async fn demo() -> lockkit_core::Result<()> {
/// use std::sync::Arc;
/// use lockkit_core::{DistributedLock, Election, LockOptions, MemoryLock};
///
/// let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::shared());
/// let election = Election::new(locks, "scheduler", "node-a:4242");
/// let leadership = election.campaign(&LockOptions::new()).await?;
/// assert_eq!(election.leader().await?.as_deref(), Some("node-a:4242"));
/// println!("leading in term {:?}", leadership.term());
/// leadership.resign().await?;
/// assert_eq!(election.leader().await?, None);
/// # Ok(())
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone)]
pub struct Election {
    locks: Arc<dyn DistributedLock>,
    name: String,
    identity: String,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("locks", &self.locks)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish()
    }
}

impl Election {
    /// A candidate `identity` (what [`leader`](Self::leader) shows while it
    /// leads: at most 255 bytes of UTF-8, no control characters) in the
    /// election `name` on `locks`.
    pub fn new(
        locks: Arc<dyn DistributedLock>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Election {
            locks,
            name: name.into(),
            identity: identity.into(),
        }
    }

    /// The election's name (the lock name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits, as `opts` say (`wait_for`, `no_wait`, `wait_forever`, the TTL
    /// and auto-renew of the leadership's lease), until this candidate
    /// leads. `opts`' kind and holder are replaced: a leadership is an
    /// exclusive holding recorded under this candidate's identity.
    pub async fn campaign(&self, opts: &LockOptions) -> Result<Leadership> {
        let opts = opts.clone().exclusive().holder(self.identity.clone());
        let guard = self.locks.acquire(&self.name, &opts).await?;
        tracing::info!(election = %self.name, identity = %self.identity, term = ?guard.fencing_token(), "leading");
        crate::metrics::leader_change("elected");
        Ok(Leadership {
            guard,
            identity: self.identity.clone(),
        })
    }

    /// The current leader's identity; `None` while nobody leads (or the
    /// holder recorded none).
    pub async fn leader(&self) -> Result<Option<String>> {
        let status = self.locks.status(&self.name).await?;
        Ok(if status.held { status.holder } else { None })
    }

    /// A watch of the leader's identity: the receiver holds the current
    /// leader (`None` while nobody leads) and changes when another leads.
    /// A task reads [`leader`](Self::leader) after each release the backend
    /// notifies and at least every `poll`; it ends when every receiver is
    /// dropped. A failed read keeps the last value (and is logged).
    pub fn observe(&self, poll: Duration) -> watch::Receiver<Option<String>> {
        let (tx, rx) = watch::channel(None);
        let election = self.clone();
        let poll = poll.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut releases = election.locks.watch_releases(&election.name).await.ok();
            loop {
                match election.leader().await {
                    Ok(leader) => {
                        tx.send_if_modified(|seen| {
                            let changed = *seen != leader;
                            if changed && leader.is_some() {
                                // Counted before the receivers are woken.
                                crate::metrics::leader_change("observed");
                            }
                            *seen = leader;
                            changed
                        });
                    }
                    Err(error) => {
                        tracing::debug!(election = %election.name, %error, "could not read the leader");
                    }
                }
                let released = async {
                    match releases.as_mut() {
                        Some(watch) => watch.changed().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = released => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
        });
        rx
    }
}

/// This candidate's leadership, from [`Election::campaign`] until
/// [`resign`](Self::resign), its loss, or its drop (which resigns in the
/// background, as dropping a [`LockGuard`] releases).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    identity: String,
}

impl Leadership {
    /// The term: the leadership's fencing token, strictly increasing across
    /// leaders where the backend fences. Pass it to the resources the leader
    /// writes to.
    pub fn term(&self) -> Option<FencingToken> {
        self.guard.fencing_token()
    }

    /// The identity this candidate leads under.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether the leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the leadership is lost (its lease ran out, was taken
    /// away, or its session ended): stop acting as the leader then.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// Whether the leadership is at risk: its holding cannot be confirmed
    /// right now; see [`LockGuard::is_at_risk`]. A leader that acts on
    /// something only the leader may do should pause while this is true.
    pub fn is_at_risk(&self) -> bool {
        self.guard.is_at_risk()
    }

    /// Resolves when the leadership becomes at risk, or is lost; see
    /// [`LockGuard::at_risk`].
    pub fn at_risk(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.at_risk()
    }

    /// The lock guard behind the leadership (to extend it by hand, or to
    /// read its lease).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lock guard behind the leadership, to release or drop as a guard.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Steps down: releases the name, so that another candidate can lead.
    pub async fn resign(self) -> Result<()> {
        tracing::info!(election = %self.guard.name(), identity = %self.identity, "resigning");
        crate::metrics::leader_change("resigned");
        self.guard.release().await
    }
}
