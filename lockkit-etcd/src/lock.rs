//! etcd's lock recipe (the `concurrency` package's `Mutex`, which
//! `etcdctl lock` and `etcdctl elect` run), one lease per holding.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};
use lockkit_core::backend::{Intent, Lease, LossNotifier, QueueBackend, QueuedLock, Request};
use lockkit_core::{
    Backoff, Capabilities, FencingToken, LockError, LockGuard, LockKind, LockStatus,
    ReleaseOnCrash, Result,
};
use tokio::time::Instant;

use crate::client::Etcd;
use crate::error::BACKEND;
use crate::keys::{contender_key, is_reader, lock_dir, semaphore_dir};

/// What the etcd backend guarantees: a lease per holding (freed by its TTL
/// when the holder crashes), the key's create revision as fencing token,
/// waiters let through in order of arrival by the deletions of the keys
/// ahead of theirs (told by the client's one watch), and Raft underneath (a
/// minority of the cluster may fail); readers and writers in one directory
/// ordered by revision, semaphore permits as keys counted under a directory
/// of their own.
pub const ETCD_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Ttl)
    .with_server_bounds(true)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_fifo(true)
    .with_survives_minority_failure(true)
    .with_holder(true)
    .with_shared(true)
    .with_semaphore(true);

/// A lock client on an etcd cluster; see the crate docs for the recipe.
///
/// The engine ([`QueuedLock`]) keeps a local queue per name, so that only
/// one task of this client at a time has a key on the server.
pub type EtcdLock = QueuedLock<EtcdBackend>;

/// The etcd side of an [`EtcdLock`].
#[derive(Debug)]
pub struct EtcdBackend {
    etcd: Etcd,
}

impl EtcdBackend {
    pub(crate) fn new(etcd: Etcd) -> Self {
        EtcdBackend { etcd }
    }
}

/// Where a holding's key goes and when it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// The lock's directory; holds when no older key is left.
    Exclusive,
    /// The lock's directory, a reader's key; holds when no older writer's
    /// key is left.
    Shared,
    /// The semaphore's directory; holds among its `permits` oldest keys.
    Permits(u32),
}

impl Plan {
    fn of(kind: LockKind) -> Plan {
        match kind {
            LockKind::Shared => Plan::Shared,
            LockKind::Semaphore { permits } => Plan::Permits(permits),
            _ => Plan::Exclusive,
        }
    }

    /// The directory of `name`'s keys.
    fn dir(self, prefix: &str, name: &str) -> Result<String> {
        match self {
            Plan::Permits(_) => semaphore_dir(prefix, name),
            _ => lock_dir(prefix, name),
        }
    }

    /// The read that decides whether a key holds: the directory's keys in
    /// order of creation (as many as can matter).
    fn contenders(self) -> GetOptions {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        match self {
            Plan::Exclusive => all.with_limit(1),
            Plan::Permits(permits) => all.with_limit(i64::from(permits)),
            Plan::Shared => all,
        }
    }

    /// Whether the key created at `mine` holds, given the directory's keys
    /// in order of creation (at least those [`contenders`](Self::contenders)
    /// reads).
    fn holds(self, dir: &str, mine: i64, keys: &[KeyValue]) -> bool {
        let older = keys.iter().take_while(|kv| kv.create_revision() < mine);
        match self {
            Plan::Exclusive => older.count() == 0,
            Plan::Shared => !older.into_iter().any(|kv| !is_reader(dir, kv.key())),
            Plan::Permits(permits) => older.count() < permits as usize,
        }
    }
}

/// Revokes the lease of an acquire that has not handed it to a guard yet:
/// dropped (the caller gave up), it revokes in a task of its own, which
/// deletes whatever key the acquire created.
struct Revoker {
    etcd: Etcd,
    lease: Option<i64>,
}

impl Revoker {
    /// Revokes now, and waits for it.
    async fn revoke(mut self) {
        if let Some(lease) = self.lease.take()
            && let Err(error) = self.etcd.revoke(lease).await
        {
            tracing::warn!(%error, "could not revoke an unused lease; it ends with its TTL");
        }
    }

    /// The lease, now kept by a guard.
    fn disarm(mut self) -> i64 {
        self.lease.take().unwrap_or_default()
    }
}

impl Drop for Revoker {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.etcd.revoke_later(lease);
        }
    }
}

/// The answers of a transaction's reads, in the order of its operations.
fn read_ranges(answer: &etcd_client::TxnResponse) -> Vec<GetResponse> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}

/// What the create transaction answered: our key's create revision, and
/// the directory's keys as [`Plan::contenders`] reads them.
fn created_and_contenders(
    name: &str,
    answer: &etcd_client::TxnResponse,
) -> Result<(i64, Vec<KeyValue>)> {
    let mut ranges: Vec<Vec<KeyValue>> = read_ranges(answer)
        .into_iter()
        .map(|mut get| get.take_kvs())
        .collect();
    let mine = if answer.succeeded() {
        answer.header().map(|h| h.revision())
    } else {
        ranges
            .first()
            .and_then(|kvs| kvs.first())
            .map(KeyValue::create_revision)
    };
    let mine = mine.ok_or_else(|| {
        LockError::backend(
            BACKEND,
            format!("the create transaction of {name:?} answered no revision"),
        )
    })?;
    Ok((mine, ranges.pop().unwrap_or_default()))
}

/// The backoff of a waiter whose requests fail (the shared jittered
/// backoff): up to 10 ms, doubling up to 500 ms.
const RETRY: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// How a wait for one's turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// Nothing older stands in the way, and our key is still there.
    Holds,
    /// The deadline came first.
    TimedOut,
    /// Our own key was deleted while we waited (an operator, `etcdctl del`):
    /// a missing key is no place in the queue.
    KeyDeleted,
}

impl EtcdBackend {
    /// One request, read at one revision: the keys of `dir` created before
    /// `mine` (in order of creation), and whether our own `key` is there.
    async fn read_turn(&self, dir: &str, key: &str, mine: i64) -> Result<(Vec<KeyValue>, bool)> {
        let older = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only()
            .with_max_create_revision(mine - 1);
        let txn = Txn::new().and_then([
            TxnOp::get(dir, Some(older)),
            TxnOp::get(key, Some(GetOptions::new().with_count_only())),
        ]);
        let answer = self.etcd.txn("read the previous contenders", txn).await?;
        let mut gets = read_ranges(&answer).into_iter();
        match (gets.next(), gets.next()) {
            (Some(mut older), Some(ours)) => Ok((older.take_kvs(), ours.count() > 0)),
            _ => Err(LockError::backend(
                BACKEND,
                "the read of the previous contenders answered fewer ranges than asked",
            )),
        }
    }

    /// Waits until the key created at `mine` holds as `plan` says. A
    /// round reads the keys ahead of ours once, with the client's watch of
    /// deletions already in place, then counts them down as their deletions
    /// are told: keys older than ours can only go, never come, so the
    /// deletion that lets us through needs no read to be sure of it (and
    /// those that do not wake no request at all). A deletion of our own key
    /// ends the wait. A lost connection or a failed watch is not the end of
    /// the wait (the lease, kept alive alongside, says when it is): the
    /// round is made again, with backoff, until the deadline.
    async fn wait_turn(&self, place: Place<'_>, deadline: Option<Instant>) -> Result<Turn> {
        let mut delays = RETRY.delays();
        loop {
            match self.wait_round(place, deadline).await {
                Ok(turn) => return Ok(turn),
                Err(error @ LockError::Unavailable { .. }) => {
                    let wake = Instant::now() + delays.next().unwrap_or(RETRY.max());
                    if deadline.is_some_and(|deadline| deadline <= wake) {
                        return Ok(Turn::TimedOut);
                    }
                    tracing::debug!(%error, "etcd request failed while waiting; retrying");
                    tokio::time::sleep_until(wake).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One round of [`wait_turn`](Self::wait_turn).
    async fn wait_round(&self, place: Place<'_>, deadline: Option<Instant>) -> Result<Turn> {
        let (plan, dir, key, mine) = (place.plan, place.dir, place.key, place.mine);
        // In place before the read: every deletion the read does not show
        // is told.
        let mut deletes = self.etcd.watch_deletes(dir).await?;
        let (mut older, ours) = self.read_turn(dir, key, mine).await?;
        if !ours {
            return Ok(Turn::KeyDeleted);
        }
        loop {
            if plan.holds(dir, mine, &older) {
                return Ok(Turn::Holds);
            }
            let Some(deleted) = deletes.next(deadline).await? else {
                return Ok(Turn::TimedOut);
            };
            // A deletion counts for a key created before it: the same key
            // may have been deleted before, by an earlier holding of its
            // lease (see `crate::leases`), and told only now.
            let gone = |key: &[u8], created: i64| {
                deleted
                    .iter()
                    .any(|(k, revision)| k == key && *revision > created)
            };
            if gone(key.as_bytes(), mine) {
                return Ok(Turn::KeyDeleted);
            }
            older.retain(|kv| !gone(kv.key(), kv.create_revision()));
        }
    }

    /// Keeps `lease` alive every `period` while a contender waits, noting
    /// in `renewed` when the last renewal that succeeded was sent; returns
    /// (with the error) only when the lease is gone or cannot be renewed.
    async fn keep_waiting(
        &self,
        name: &str,
        lease: i64,
        ttl: Duration,
        period: Duration,
        renewed: &Mutex<Instant>,
    ) -> LockError {
        let last = || *renewed.lock().unwrap_or_else(|p| p.into_inner());
        let mut delays = RETRY.delays();
        let mut wait = period;
        loop {
            tokio::time::sleep(wait).await;
            let sent = Instant::now();
            match self.etcd.keep_alive(lease).await {
                Ok(Some(_)) => {
                    *renewed.lock().unwrap_or_else(|p| p.into_inner()) = sent;
                    delays.reset();
                    wait = period;
                }
                Ok(None) => {
                    return LockError::backend(
                        BACKEND,
                        format!("the lease of the waiting acquire of {name:?} expired"),
                    );
                }
                // A lost connection is retried while the lease may live.
                Err(error @ LockError::Unavailable { .. }) => {
                    wait = delays.next().unwrap_or(RETRY.max());
                    if Instant::now() + wait >= last() + ttl {
                        return error;
                    }
                    tracing::debug!(%error, "could not renew a waiting acquire's lease; retrying");
                }
                Err(error) => return error,
            }
        }
    }
}

/// Our place in a lock's line: how the lock is held, its directory, our
/// key and the revision that created it.
#[derive(Clone, Copy, Debug)]
struct Place<'a> {
    plan: Plan,
    dir: &'a str,
    key: &'a str,
    mine: i64,
}

#[lockkit_core::async_trait]
impl QueueBackend for EtcdBackend {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        ETCD_CAPABILITIES
    }

    /// A lease, then one transaction: our key (value: the holder identity)
    /// if it does not exist yet, and the oldest key of the lock. The oldest
    /// holds; a waiter counts down the keys ahead of its own as their
    /// deletions are told.
    async fn lock(&self, request: Request<'_, '_>) -> Result<Option<LockGuard>> {
        let (name, opts, intent) = (request.name, request.opts, request.intent);
        let waiter = request.waiter;
        let plan = Plan::of(opts.kind());
        let dir = plan.dir(self.etcd.prefix(), name)?;
        let ttl = opts.lease_ttl();
        // The lease counts from before it was asked for (granted, or a kept
        // one renewed): the server's expiry is never earlier than the
        // guard's. Its TTL has the lock delay added (see `LockOptions`).
        let server_ttl = opts.bounds().server_ttl(ttl);
        let (lease, mut granted_at) = self.etcd.lease(server_ttl).await?;
        let revoker = Revoker {
            etcd: self.etcd.clone(),
            lease: Some(lease),
        };
        let key = contender_key(&dir, plan == Plan::Shared, lease);
        let value = opts.holder_identity().unwrap_or_default();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(dir.clone(), Some(plan.contenders())),
            ])
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(dir.clone(), Some(plan.contenders())),
            ]);
        let answer = self.etcd.txn("create the lock key", txn).await?;
        let (mine, contenders) = created_and_contenders(name, &answer)?;
        if !plan.holds(&dir, mine, &contenders) {
            if intent == Intent::Try || waiter.is_over() {
                revoker.revoke().await;
                return Ok(None);
            }
            let deadline = waiter.deadline();
            let renewed = Mutex::new(granted_at);
            let period = (ttl / 3).max(Duration::from_millis(100));
            let turn = tokio::select! {
                turn = self.wait_turn(Place { plan, dir: &dir, key: &key, mine }, deadline) => turn?,
                error = self.keep_waiting(name, lease, ttl, period, &renewed) => return Err(error),
            };
            match turn {
                Turn::Holds => {}
                Turn::TimedOut => {
                    revoker.revoke().await;
                    return Ok(None);
                }
                Turn::KeyDeleted => {
                    revoker.revoke().await;
                    return Err(LockError::unavailable(
                        BACKEND,
                        format!(
                            "the key of the waiting acquire of {name:?} was deleted while it waited"
                        ),
                    ));
                }
            }
            // The guard's clock starts when the lease was last renewed: the
            // server's expiry is a whole TTL (or more) after that.
            granted_at = *renewed.lock().unwrap_or_else(|p| p.into_inner());
        }
        let lease = Arc::new(EtcdLease {
            etcd: self.etcd.clone(),
            lease: revoker.disarm(),
            ttl: server_ttl,
            key,
            revision: mine,
            kept: AtomicBool::new(false),
            notifier: OnceLock::new(),
        });
        let guard = LockGuard::granted(
            name,
            lease.clone(),
            Some(FencingToken::new(mine.max(0) as u64)),
            granted_at,
            opts,
        );
        let _ = lease.notifier.set(guard.loss_notifier());
        Ok(Some(guard))
    }

    /// The keys of the directory in order of creation: the holders are
    /// those that hold as their kind says (the oldest writer, or the
    /// readers before the first writer, or a semaphore's `permits` oldest);
    /// the rest wait. The token is the youngest holder's create revision
    /// (a semaphore's permits have no token standing for them all), the
    /// identity and remaining lease the oldest holder's.
    async fn status(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        let plan = Plan::of(kind);
        let dir = plan.dir(self.etcd.prefix(), name)?;
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let keys = self
            .etcd
            .get("read the lock's keys", dir.as_str(), all)
            .await?
            .take_kvs();
        let holders: Vec<&KeyValue> = match plan {
            Plan::Permits(permits) => keys.iter().take(permits as usize).collect(),
            _ => match keys.first() {
                Some(first) if !is_reader(&dir, first.key()) => vec![first],
                _ => keys
                    .iter()
                    .take_while(|kv| is_reader(&dir, kv.key()))
                    .collect(),
            },
        };
        let Some(oldest) = holders.first() else {
            return Ok(LockStatus::free());
        };
        let remaining = match oldest.lease() {
            0 => None,
            lease => self.etcd.lease_ttl(lease).await?,
        };
        let identity = holders.iter().find_map(|kv| {
            std::str::from_utf8(kv.value())
                .ok()
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        });
        let token = holders
            .iter()
            .map(|kv| kv.create_revision())
            .max()
            .map(|revision| FencingToken::new(revision.max(0) as u64));
        let status = LockStatus::held()
            .with_remaining(remaining)
            .with_waiters(Some(keys.len() - holders.len()))
            .with_holders(Some(holders.len()))
            .with_holder(identity);
        Ok(match plan {
            Plan::Permits(_) => status,
            _ => status.with_fencing_token(token),
        })
    }
}

/// A held lock: its lease and key.
#[derive(Debug)]
struct EtcdLease {
    etcd: Etcd,
    lease: i64,
    ttl: Duration,
    key: String,
    /// The key's create revision (the fencing token).
    revision: i64,
    /// Released, and the lease kept for another holding of the client: no
    /// longer this holding's to renew or revoke.
    kept: AtomicBool,
    notifier: OnceLock<LossNotifier>,
}

#[lockkit_core::async_trait]
impl Lease for EtcdLease {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// One keep-alive of the lease (its TTL was fixed when it was granted)
    /// and a read of the key: `false` once either is gone.
    async fn extend(&self, _ttl: Duration) -> Result<bool> {
        if self.kept.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let key = GetOptions::new().with_keys_only();
        let (alive, key) = tokio::join!(
            self.etcd.keep_alive(self.lease),
            self.etcd.get("read the lock key", self.key.clone(), key)
        );
        let ours = key?
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == self.revision);
        Ok(alive?.is_some() && ours)
    }

    /// Moves the key, if it is still ours, to a lease of its own of `after`
    /// (rounded up to whole seconds, etcd's unit): the server deletes it
    /// then. The holding's lease is kept for the client's next holding, as
    /// after a release.
    async fn release_after(&self, after: Duration) -> Result<bool> {
        if self.kept.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let sent = Instant::now();
        let end = self.etcd.grant(after).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                "",
                Some(PutOptions::new().with_ignore_value().with_lease(end)),
            )]);
        match self
            .etcd
            .txn("move the lock key to its last lease", txn)
            .await
        {
            Ok(answer) if answer.succeeded() => {
                if !self.kept.swap(true, Ordering::SeqCst) {
                    self.etcd.keep_lease(self.lease, self.ttl, sent);
                }
                Ok(true)
            }
            other => {
                self.etcd.revoke_later(end);
                self.etcd.revoke_later(self.lease);
                other.map(|_| false)
            }
        }
    }

    /// Deletes the key if it is still ours. Deleted, the lease is kept for
    /// the client's next holding (see `crate::leases`); otherwise (the key
    /// was gone, or the request failed) it is revoked in a task of its own
    /// (the release does not wait for it; a lease whose revocation fails
    /// ends with its TTL, holding no key).
    async fn release(&self) -> Result<bool> {
        if self.kept.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let sent = Instant::now();
        match self.etcd.txn("delete the lock key", txn).await {
            Ok(answer) if answer.succeeded() => {
                if !self.kept.swap(true, Ordering::SeqCst) {
                    self.etcd.keep_lease(self.lease, self.ttl, sent);
                }
                Ok(true)
            }
            Ok(_) => {
                self.etcd.revoke_later(self.lease);
                Ok(false)
            }
            Err(error) => {
                self.etcd.revoke_later(self.lease);
                Err(error)
            }
        }
    }
}
