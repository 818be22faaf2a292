//! The Redlock backend.

use std::time::Duration;

use futures_util::future::join_all;
use lockkit_core::{
    Attempt, Capabilities, FencingToken, LeaseBackend, LeaseLock, OwnerToken, ReleaseOnCrash,
    ReleaseWatch, Result,
};
use lockkit_redis::{Keys, RedisInstance};

use crate::error::{BACKEND, no_quorum, unreachable_quorum};
use crate::quorum::{Votes, ask};

/// A Redlock client: [`LeaseLock`] over [`RedlockBackend`].
pub type RedlockLock = LeaseLock<RedlockBackend>;

/// What Redlock guarantees: no fencing tokens (see the crate docs), crash
/// release by TTL, notified waits, and it survives a minority of instances down.
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_notified_wait(true)
    .with_survives_minority_failure(true);

/// The default upper bound of one request to one instance; the effective
/// default is min(this, ttl / 10).
pub const DEFAULT_INSTANCE_TIMEOUT: Duration = Duration::from_millis(50);

/// The [`LeaseBackend`] of Redlock: one lock over N independent Redis masters.
#[derive(Debug)]
pub struct RedlockBackend {
    instances: Vec<RedisInstance>,
    prefix: String,
    quorum: usize,
    instance_timeout: Option<Duration>,
}

impl RedlockBackend {
    /// A backend over connected (or lazily connecting) instances.
    pub fn new(
        instances: Vec<RedisInstance>,
        prefix: impl Into<String>,
        instance_timeout: Option<Duration>,
    ) -> Self {
        let quorum = instances.len() / 2 + 1;
        RedlockBackend {
            instances,
            prefix: prefix.into(),
            quorum,
            instance_timeout,
        }
    }

    /// The instances.
    pub fn instances(&self) -> &[RedisInstance] {
        &self.instances
    }

    /// How many instances must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound of one request to one instance for a lease of `ttl`.
    pub fn instance_timeout(&self, ttl: Option<Duration>) -> Duration {
        self.instance_timeout.unwrap_or_else(|| match ttl {
            Some(ttl) => (ttl / 10).min(DEFAULT_INSTANCE_TIMEOUT),
            None => DEFAULT_INSTANCE_TIMEOUT,
        })
    }

    fn all(&self) -> std::ops::Range<usize> {
        0..self.instances.len()
    }

    /// Undoes a partial grant without waking waiters. Waits for the instances
    /// that granted (they have just answered); the silent ones, which may be
    /// slow or down, are rolled back in the background.
    async fn roll_back(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        granted: &[usize],
        silent: Vec<usize>,
    ) {
        let quorum_of_granted = granted.len();
        ask(
            &self.instances,
            granted.iter().copied().chain(silent),
            self.instance_timeout(None),
            request(keys, owner, |instance, keys, owner| async move {
                instance.release(&keys, owner.as_str(), false).await
            }),
            // Done once every instance that granted has answered.
            |votes| {
                votes
                    .answers
                    .iter()
                    .filter(|(i, _)| granted.contains(i))
                    .count()
                    >= quorum_of_granted
            },
        )
        .await;
    }

    fn undecided(&self, votes: &Votes<bool>) -> lockkit_core::LockError {
        unreachable_quorum(
            votes.answers.len(),
            self.instances.len(),
            self.quorum,
            &votes.failures,
        )
    }
}

fn granted(answer: &Attempt<Option<FencingToken>>) -> bool {
    matches!(answer, Attempt::Acquired(_))
}

/// A request for [`ask`] made from `op`: each instance gets owned copies of the
/// keys and the owner token, so that a request the caller no longer waits for
/// can still complete in the background.
fn request<Fut>(
    keys: &Keys,
    owner: &OwnerToken,
    op: impl Fn(RedisInstance, Keys, OwnerToken) -> Fut,
) -> impl Fn(RedisInstance) -> Fut {
    let (keys, owner) = (keys.clone(), owner.clone());
    move |instance| op(instance, keys.clone(), owner.clone())
}

#[lockkit_core::async_trait]
impl LeaseBackend for RedlockBackend {
    type Key = Keys;

    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        REDLOCK_CAPABILITIES
    }

    fn key(&self, name: &str) -> Result<Keys> {
        Keys::new(&self.prefix, name)
    }

    /// Asks every instance at once and waits for all answers, each bounded by
    /// the per-instance timeout (so a frozen minority costs that timeout, no
    /// more). With a quorum of grants the lock is ours. Otherwise the partial
    /// grant is rolled back (quietly, so that contenders keep their random
    /// retry delays), and the answer is `Busy` when enough instances answered,
    /// `Unavailable` when not.
    ///
    /// It does not return at the first quorum: a `SET` still in flight could
    /// then reach its instance after the release of the same lease, and leave
    /// a key nobody holds until its TTL runs out.
    async fn try_lock(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let quorum = self.quorum;
        let votes = ask(
            &self.instances,
            self.all(),
            self.instance_timeout(Some(ttl)),
            request(keys, owner, move |instance, keys, owner| async move {
                instance.try_lock(&keys, owner.as_str(), ttl, false).await
            }),
            |_| false,
        )
        .await;
        let yes = votes.count(granted);
        if yes >= quorum {
            // Redlock has no safe fencing token.
            return Ok(Attempt::Acquired(None));
        }
        let total = self.instances.len();
        self.roll_back(keys, owner, &votes.which(granted), votes.silent(total))
            .await;
        let answered = votes.answers.len();
        if answered < quorum {
            return Err(no_quorum(answered, yes, total, quorum, &votes.failures));
        }
        let retry_after = votes
            .answers
            .iter()
            .filter_map(|(_, answer)| match answer {
                Attempt::Busy { retry_after } => *retry_after,
                Attempt::Acquired(_) => None,
            })
            .min();
        tracing::trace!(granted = yes, answered, quorum, "redlock: no quorum");
        Ok(Attempt::Busy { retry_after })
    }

    /// Needs a quorum of instances that still hold our token; returns as soon
    /// as the outcome is decided. `Ok(false)` (lost) once a quorum answered
    /// that it does not.
    async fn extend(&self, keys: &Keys, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        let quorum = self.quorum;
        let votes = ask(
            &self.instances,
            self.all(),
            self.instance_timeout(Some(ttl)),
            request(keys, owner, move |instance, keys, owner| async move {
                instance.extend(&keys, owner.as_str(), ttl).await
            }),
            |votes| votes.count(|ours| *ours) >= quorum || votes.count(|ours| !*ours) >= quorum,
        )
        .await;
        if votes.count(|ours| *ours) >= quorum {
            Ok(true)
        } else if votes.count(|ours| !*ours) >= quorum {
            Ok(false)
        } else {
            Err(self.undecided(&votes))
        }
    }

    /// Deletes our key on every instance and wakes waiters; returns as soon as
    /// the outcome is decided (the requests to a slow minority complete in the
    /// background).
    /// `Ok(false)` (lost) when a quorum answered that the lease was not ours;
    /// `Ok(true)` when a quorum released it, or when enough instances answered
    /// and none of them holds our token any more; `Unavailable` when fewer than
    /// a quorum answered.
    async fn release(&self, keys: &Keys, owner: &OwnerToken) -> Result<bool> {
        let quorum = self.quorum;
        let votes = ask(
            &self.instances,
            self.all(),
            self.instance_timeout(None),
            request(keys, owner, |instance, keys, owner| async move {
                instance.release(&keys, owner.as_str(), true).await
            }),
            |votes| votes.count(|gone| *gone) >= quorum || votes.count(|gone| !*gone) >= quorum,
        )
        .await;
        if votes.count(|released| !*released) >= quorum {
            Ok(false)
        } else if votes.answers.len() >= quorum {
            Ok(true)
        } else {
            Err(self.undecided(&votes))
        }
    }

    /// Release notifications from every instance that can subscribe in time.
    async fn watch(&self, keys: &Keys) -> Result<ReleaseWatch> {
        let timeout = self.instance_timeout(None);
        let watches = join_all(
            self.instances
                .iter()
                .map(|instance| tokio::time::timeout(timeout, instance.watch(keys))),
        )
        .await;
        Ok(ReleaseWatch::merge(watches.into_iter().flatten()))
    }
}
