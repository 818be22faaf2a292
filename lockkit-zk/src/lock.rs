//! The ZooKeeper lock recipe.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockkit_core::backend::{Intent, OwnerToken, QueueBackend, QueuedLock, Request, Waiter};
use lockkit_core::{
    Backoff, Capabilities, FencingToken, LockError, LockGuard, LockKind, LockOptions, LockStatus,
    ReleaseOnCrash, Result,
};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::error::BACKEND;
use crate::lease::ZkLease;
use crate::node::{Node, Queued};
use crate::path::{
    contenders, is_reader, lease_prefix, lock_dir, node_prefix, reader_prefix, semaphore_dir,
    sequence,
};
use crate::session::{RequestError, Session, Sessions};

/// How often one acquire joins the queue again after its session ended.
const SESSION_RETRIES: u32 = 3;

/// How often a lock node's create is sent before the acquire fails: a create
/// whose outcome is unknown (the connection dropped) is looked up by its
/// owner before it is sent again.
const CREATE_ATTEMPTS: u32 = 4;

/// How often `status` lists a lock's queue: the head may leave between the
/// listing and the read of its data.
const STATUS_LISTINGS: u32 = 3;

/// Between the retries of a request a waiter makes while its session lives
/// (jittered, never past the wait's deadline).
const WAITING_RETRY: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// What the ZooKeeper backend guarantees.
pub const ZK_CAPABILITIES: Capabilities = Capabilities::new(ReleaseOnCrash::Session)
    .with_fencing(true)
    .with_notified_wait(true)
    .with_fifo(true)
    .with_survives_minority_failure(true)
    .with_shared(true)
    .with_semaphore(true)
    .with_holder(true);

/// A lock client on a ZooKeeper ensemble; see the crate docs for the recipe.
///
/// The engine ([`QueuedLock`]) keeps a local queue per name, so that only one
/// task of this client at a time has a node on the server: thousands of
/// local contenders cost the server one node and one watch, not thousands of
/// nodes whose every waiter lists all the others.
pub type ZkLock = QueuedLock<ZkBackend>;

/// The ZooKeeper side of a [`ZkLock`]: the session and the recipe's requests.
#[derive(Debug)]
pub struct ZkBackend {
    sessions: Arc<Sessions>,
    children_reads: AtomicU64,
}

impl ZkBackend {
    pub(crate) fn new(sessions: Arc<Sessions>) -> Self {
        ZkBackend {
            sessions,
            children_reads: AtomicU64::new(0),
        }
    }

    /// How many times this client has listed a lock's contenders: once per
    /// attempt and once per wake-up of a waiter. A diagnostic: a release wakes
    /// exactly one waiter (its successor), so it adds exactly one read.
    pub fn children_reads(&self) -> u64 {
        self.children_reads.load(Ordering::Relaxed)
    }

    /// The id of the current session, if one is open.
    pub async fn session_id(&self) -> Result<i64> {
        Ok(self.sessions.session().await?.client.session_id().0)
    }

    async fn list(&self, session: &Session, dir: &str) -> Result<Vec<String>> {
        Ok(self.try_list(session, dir).await?)
    }

    async fn try_list(
        &self,
        session: &Session,
        dir: &str,
    ) -> std::result::Result<Vec<String>, RequestError> {
        self.children_reads.fetch_add(1, Ordering::Relaxed);
        session
            .run(
                "list the lock's contenders",
                session.client.list_children(dir),
            )
            .await
    }

    /// Creates our node, `<dir>/<prefix><sequence>`, with its parents as
    /// container nodes, and lists `dir` in the same round trip (the listing
    /// is sent right after the create, and ZooKeeper answers one session's
    /// requests in order, so it shows our node); `None` for the listing when
    /// it failed or the node took more than one try. After a lost connection
    /// the node may exist without our knowing: it is looked up by its prefix
    /// (the owner's uuid) before trying again.
    async fn create_node(
        &self,
        session: &Session,
        dir: &str,
        prefix: &str,
        data: &[u8],
    ) -> Result<(Node, Option<Vec<String>>)> {
        let prefix = prefix.to_owned();
        let path = format!("{dir}/{prefix}");
        let acls = session.acls();
        let options = CreateMode::EphemeralSequential.with_acls(acls);
        let mut in_doubt = false;
        for _ in 0..CREATE_ATTEMPTS {
            // The client sends a request when it is called: the create, then
            // the listing.
            let created = session.client.create(&path, data, &options);
            let listed = session.client.list_children(dir);
            match session.run("create the lock node", created).await {
                Ok((stat, sequence)) => {
                    let node = Node::created(&path, &prefix, &stat, sequence, in_doubt);
                    self.children_reads.fetch_add(1, Ordering::Relaxed);
                    let children = session.run("list the lock's contenders", listed).await.ok();
                    return Ok((node, children));
                }
                Err(RequestError::Server(_, ZkError::NoNode)) => {
                    let parents = CreateMode::Container.with_acls(acls);
                    match session
                        .run(
                            "create the lock's parent nodes",
                            session.client.mkdir(dir, &parents),
                        )
                        .await
                    {
                        Ok(()) | Err(RequestError::Server(_, ZkError::NodeExists)) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
                Err(error) if error.outcome_unknown() => {
                    in_doubt = true;
                    if let Some(node) = self.find_own(session, dir, &prefix).await? {
                        return Ok((node, None));
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("could not create a lock node under {dir}"),
        ))
    }

    /// Our node under `dir`, found by its owner prefix.
    async fn find_own(&self, session: &Session, dir: &str, prefix: &str) -> Result<Option<Node>> {
        let children = match self.list(session, dir).await {
            Ok(children) => children,
            Err(_) => return Ok(None),
        };
        let Some(name) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{dir}/{name}");
        match session
            .run("read the lock node", session.client.check_stat(&path))
            .await?
        {
            Some(stat) => Ok(Some(Node {
                path,
                name,
                czxid: stat.czxid,
                in_doubt: true,
            })),
            None => Ok(None),
        }
    }

    /// Joins the queue under `contender.dir` with a node
    /// `<prefix><sequence>` and waits until that node may hold: first in the
    /// queue, or (`shared`) with no writer's node before it. The node, its
    /// still-armed place in the queue (dropped, it removes the node), and when
    /// the holding was seen; `None` (and the node removed) when the wait ended
    /// first.
    async fn queue(
        &self,
        session: &Arc<Session>,
        contender: Contender<'_>,
        waiter: &mut Waiter<'_>,
        intent: Intent,
    ) -> Result<Option<(Node, Queued, Instant)>> {
        let Contender {
            dir,
            prefix,
            data,
            shared,
        } = contender;
        // Armed before the create is sent: an acquire dropped while it is in
        // flight still removes whatever node it produced.
        let mut queued = Queued::new(session.clone(), dir, prefix);
        let mut sent = Instant::now();
        let (node, mut listed) = waiter
            .attempt(self.create_node(session, dir, prefix, data))
            .await?;
        queued.created(&node);
        loop {
            // The lease counts from the listing that finds our node may hold:
            // that is when the lock is known to be ours, however long the
            // server queue took. (The first listing went with the create.)
            let children = match listed.take() {
                Some(children) => children,
                None => {
                    sent = Instant::now();
                    steady(session, waiter, || self.try_list(session, dir)).await?
                }
            };
            let queue = contenders(children);
            let Some(position) = queue.iter().position(|(_, child)| *child == node.name) else {
                return Err(LockError::unavailable(
                    BACKEND,
                    format!("our lock node under {dir} vanished (did the session expire?)"),
                ));
            };
            let ahead = &queue[..position];
            // A writer waits for its predecessor; a reader for the nearest
            // writer before it (readers before it hold with it).
            let blocker = if shared {
                ahead.iter().rev().find(|(_, child)| !is_reader(child))
            } else {
                ahead.last()
            };
            let Some((_, blocker)) = blocker else {
                return Ok(Some((node, queued, sent)));
            };
            if intent == Intent::Try || waiter.is_over() {
                queued.leave().await;
                return Ok(None);
            }
            let blocker = format!("{dir}/{blocker}");
            let (stat, watcher) = steady(session, waiter, || {
                session.run(
                    "watch the node before ours",
                    session.client.check_and_watch_stat(&blocker),
                )
            })
            .await?;
            if stat.is_none() {
                continue;
            }
            if waiter.until_deadline(watcher.changed()).await.is_err() {
                queued.leave().await;
                return Ok(None);
            }
        }
    }

    /// One of `permits` permits of the semaphore at `dir`, as Curator's
    /// `InterProcessSemaphoreV2` takes one: hold the mutex `<dir>/locks`,
    /// create a lease node `<dir>/leases/_c_<owner>-lease-<sequence>`, wait
    /// (watching the leases) until there are at most `permits` of them, then
    /// let the mutex go. The lease node is the permit; its `czxid` is the
    /// fencing token.
    async fn lock_permit(
        &self,
        session: Arc<Session>,
        permit: Permit<'_>,
        waiter: &mut Waiter<'_>,
        intent: Intent,
    ) -> Result<Option<LockGuard>> {
        let Permit {
            name,
            dir,
            permits,
            opts,
        } = permit;
        let mutex_dir = format!("{dir}/locks");
        let leases = format!("{dir}/leases");
        let data = &holder_data(opts);
        if let Some((lease, mut queued, sent)) = self
            .permit_at_once(&session, permits, &mutex_dir, &leases, data)
            .await
        {
            let twins = queued.granted();
            return Ok(Some(self.guard(name, session, lease, twins, opts, sent)));
        }
        // One step at a time, as a new contender (the first attempt's nodes
        // may still be on their way out).
        let owner = OwnerToken::new();
        let mutex_contender = Contender {
            dir: &mutex_dir,
            prefix: &node_prefix(owner.as_str()),
            data: &[],
            shared: false,
        };
        let Some((_, mut mutex, _)) = self
            .queue(&session, mutex_contender, waiter, intent)
            .await?
        else {
            return Ok(None);
        };
        let prefix = lease_prefix(owner.as_str());
        let mut queued = Queued::new(session.clone(), &leases, &prefix);
        let mut sent = Instant::now();
        let (lease, mut listed) = waiter
            .attempt(self.create_node(&session, &leases, &prefix, data))
            .await?;
        queued.created(&lease);
        let granted = loop {
            // The listing that went with the create, unless it shows the
            // permits taken: then a listing that watches for a change.
            if let Some(children) = listed.take()
                && holds_permit(&children, &lease, permits)
            {
                break Some(sent);
            }
            sent = Instant::now();
            let (children, watcher) = steady(&session, waiter, || {
                self.children_reads.fetch_add(1, Ordering::Relaxed);
                session.run(
                    "list the semaphore's leases",
                    session.client.list_and_watch_children(&leases),
                )
            })
            .await?;
            if !children.contains(&lease.name) {
                return Err(LockError::unavailable(
                    BACKEND,
                    format!("our lease node under {leases} vanished (did the session expire?)"),
                ));
            }
            if children.len() <= permits as usize {
                break Some(sent);
            }
            if intent == Intent::Try
                || waiter.is_over()
                || waiter.until_deadline(watcher.changed()).await.is_err()
            {
                break None;
            }
        };
        mutex.leave().await;
        let Some(sent) = granted else {
            queued.leave().await;
            return Ok(None);
        };
        let twins = queued.granted();
        Ok(Some(self.guard(name, session, lease, twins, opts, sent)))
    }

    /// The whole recipe of [`Self::lock_permit`] in one round trip, for the
    /// common case of a free mutex and a free permit: the mutex node, the
    /// mutex's listing, the lease node and the leases' listing are sent at
    /// once. ZooKeeper runs one session's requests in the order they were
    /// sent, so if the mutex's listing shows our node first, the leases were
    /// counted while the mutex was ours, exactly as the recipe counts them:
    /// with at most `permits` leases the permit is ours, and the mutex goes
    /// (its node's deletion runs in a task of its own). Otherwise both nodes
    /// are deleted and the caller takes the steps one by one; meanwhile a
    /// lease counted by another client made it wait for a change, which the
    /// deletion is.
    async fn permit_at_once(
        &self,
        session: &Arc<Session>,
        permits: u32,
        mutex_dir: &str,
        leases: &str,
        data: &[u8],
    ) -> Option<(Node, Queued, Instant)> {
        let owner = OwnerToken::new();
        let options = CreateMode::EphemeralSequential.with_acls(session.acls());
        let mutex_prefix = node_prefix(owner.as_str());
        let lease_prefix = lease_prefix(owner.as_str());
        let mut mutex = Queued::new(session.clone(), mutex_dir, &mutex_prefix);
        let mut lease = Queued::new(session.clone(), leases, &lease_prefix);
        let mutex_path = format!("{mutex_dir}/{mutex_prefix}");
        let lease_path = format!("{leases}/{lease_prefix}");
        let sent = Instant::now();
        // The client sends each request when it is called, in this order.
        let mutex_created = session.client.create(&mutex_path, &[], &options);
        let mutex_listed = session.client.list_children(mutex_dir);
        let lease_created = session.client.create(&lease_path, data, &options);
        let leases_listed = session.client.list_children(leases);
        self.children_reads.fetch_add(2, Ordering::Relaxed);
        let (mutex_created, mutex_listed, lease_created, leases_listed) = tokio::join!(
            session.run("create the semaphore's mutex node", mutex_created),
            session.run("list the semaphore's mutex", mutex_listed),
            session.run("create the lease node", lease_created),
            session.run("list the semaphore's leases", leases_listed),
        );
        let mutex_node = created(&mut mutex, &mutex_path, &mutex_prefix, mutex_created);
        let lease_node = created(&mut lease, &lease_path, &lease_prefix, lease_created);
        if let (Some(mutex_node), Ok(holders), Some(lease_node), Ok(children)) =
            (mutex_node, mutex_listed, lease_node, leases_listed)
        {
            let mutex_ours = contenders(holders)
                .first()
                .is_some_and(|(_, first)| *first == mutex_node.name);
            if mutex_ours && holds_permit(&children, &lease_node, permits) {
                drop(mutex);
                return Some((lease_node, lease, sent));
            }
        }
        lease.leave().await;
        mutex.leave().await;
        None
    }

    fn guard(
        &self,
        name: &str,
        session: Arc<Session>,
        node: Node,
        twins: Option<String>,
        opts: &LockOptions,
        sent: Instant,
    ) -> LockGuard {
        let lease = Arc::new(ZkLease {
            session: session.clone(),
            path: node.path.clone(),
            twins,
        });
        let guard = LockGuard::granted(
            name,
            lease,
            Some(FencingToken::new(node.czxid as u64)),
            sent,
            opts,
        );
        session.hold(&node.path, guard.loss_notifier());
        guard
    }
}

/// Whether the leases listed in `children` give `lease` a permit: it is
/// among them, and they are at most `permits` (Curator's count).
fn holds_permit(children: &[String], lease: &Node, permits: u32) -> bool {
    children.contains(&lease.name) && children.len() <= permits as usize
}

/// Our node `<path><sequence>` from a create's answer, recorded in
/// `queued`; `None` if the create failed (and `queued` knows whether a node
/// may exist all the same).
fn created(
    queued: &mut Queued,
    path: &str,
    prefix: &str,
    answer: std::result::Result<
        (zookeeper_client::Stat, zookeeper_client::CreateSequence),
        RequestError,
    >,
) -> Option<Node> {
    match answer {
        Ok((stat, sequence)) => {
            let node = Node::created(path, prefix, &stat, sequence, false);
            queued.created(&node);
            Some(node)
        }
        Err(error) if !error.outcome_unknown() => {
            queued.none_created();
            None
        }
        Err(_) => None,
    }
}

/// Runs a request of a waiting acquire, and runs it again after a lost
/// connection or a timeout, with backoff, for as long as the session lives and
/// the wait is not over: a disconnection (a leader election, a server restart)
/// is not yet a loss, and our node stays queued with the session.
async fn steady<T, F, Fut>(session: &Session, waiter: &Waiter<'_>, mut request: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, RequestError>>,
{
    let mut delays = WAITING_RETRY.delays();
    loop {
        match request().await {
            Ok(value) => return Ok(value),
            Err(error) if error.outcome_unknown() && !session.has_ended() && !waiter.is_over() => {
                tracing::debug!(?error, "zookeeper request failed while waiting; retrying");
                let wake = Instant::now() + delays.next().unwrap_or(WAITING_RETRY.max());
                tokio::time::sleep_until(waiter.deadline().map_or(wake, |d| d.min(wake))).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// A node about to join a queue: under `dir`, named `<prefix><sequence>`,
/// holding `data`; `shared` for a reader, which waits only for the writers
/// before it.
#[derive(Clone, Copy, Debug)]
struct Contender<'a> {
    dir: &'a str,
    prefix: &'a str,
    data: &'a [u8],
    shared: bool,
}

/// One permit of the semaphore `name`, whose nodes live under `dir`.
#[derive(Clone, Copy, Debug)]
struct Permit<'a> {
    name: &'a str,
    dir: &'a str,
    permits: u32,
    opts: &'a LockOptions,
}

impl ZkBackend {
    /// One acquire in `session`: a permit, or a place in the lock's queue.
    async fn lock_in(
        &self,
        session: Arc<Session>,
        name: &str,
        opts: &LockOptions,
        waiter: &mut Waiter<'_>,
        intent: Intent,
    ) -> Result<Option<LockGuard>> {
        let root = &self.sessions.settings.root;
        if let LockKind::Semaphore { permits } = opts.kind() {
            let dir = semaphore_dir(root, name)?;
            return self
                .lock_permit(
                    session,
                    Permit {
                        name,
                        dir: &dir,
                        permits,
                        opts,
                    },
                    waiter,
                    intent,
                )
                .await;
        }
        let dir = lock_dir(root, name)?;
        let owner = OwnerToken::new();
        let (prefix, shared) = match opts.kind() {
            LockKind::Shared => (reader_prefix(owner.as_str()), true),
            _ => (node_prefix(owner.as_str()), false),
        };
        let contender = Contender {
            dir: &dir,
            prefix: &prefix,
            data: holder_data(opts),
            shared,
        };
        let Some((node, mut queued, sent)) =
            self.queue(&session, contender, waiter, intent).await?
        else {
            return Ok(None);
        };
        let twins = queued.granted();
        Ok(Some(self.guard(name, session, node, twins, opts, sent)))
    }
}

#[lockkit_core::async_trait]
impl QueueBackend for ZkBackend {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        ZK_CAPABILITIES
    }

    fn check_name(&self, name: &str) -> Result<()> {
        lock_dir(&self.sessions.settings.root, name).map(drop)
    }

    /// Each waiter watches one node: a writer its predecessor, a reader the
    /// nearest writer before it, so a release wakes only those it lets in,
    /// in FIFO order. A permit is Curator `InterProcessSemaphoreV2`'s recipe.
    ///
    /// A session that ends while the acquire waits (the servers expired it
    /// in an outage) took its nodes with it, so nothing is held or queued:
    /// the acquire joins the queue again in a new session, at most three
    /// times, while its wait lasts.
    async fn lock(&self, request: Request<'_, '_>) -> Result<Option<LockGuard>> {
        let (name, opts, intent) = (request.name, request.opts, request.intent);
        let waiter = request.waiter;
        let mut retries = 0;
        loop {
            let session = waiter.until_deadline(self.sessions.session()).await??;
            match self
                .lock_in(session.clone(), name, opts, waiter, intent)
                .await
            {
                Err(error)
                    if session.has_ended()
                        && intent == Intent::Wait
                        && !waiter.is_over()
                        && retries < SESSION_RETRIES =>
                {
                    retries += 1;
                    tracing::info!(%error, lock.name = name, "the zookeeper session ended while acquiring; queuing again in a new session");
                }
                answer => return answer,
            }
        }
    }

    /// The contenders under the lock's node: the first holds the lock (its
    /// `czxid` is the holder's fencing token) with the readers right behind
    /// it if it is a reader; the others wait. A semaphore: its lease nodes,
    /// at most `permits` of them holding. No TTL: a holding lasts as long as
    /// its holder's session.
    async fn status(&self, name: &str, kind: LockKind) -> Result<LockStatus> {
        let root = &self.sessions.settings.root;
        let session = self.sessions.session().await?;
        if let LockKind::Semaphore { permits } = kind {
            let leases = format!("{}/leases", semaphore_dir(root, name)?);
            let mut children = match self.try_list(&session, &leases).await {
                Ok(children) => children,
                Err(RequestError::Server(_, ZkError::NoNode)) => Vec::new(),
                Err(error) => return Err(error.into()),
            };
            children.sort_by_key(|c| sequence(c));
            let count = children.len();
            let holders = count.min(permits as usize);
            if holders == 0 {
                return Ok(LockStatus::free());
            }
            let holder = match children.first() {
                Some(lease) => self.holder(&session, &format!("{leases}/{lease}")).await?,
                None => None,
            };
            return Ok(LockStatus::held()
                .with_holders(Some(holders))
                .with_waiters(Some(count - holders))
                .with_holder(holder));
        }
        let dir = lock_dir(root, name)?;
        // The head may leave between the listing and its stat: look again.
        for _ in 0..STATUS_LISTINGS {
            let children = match self.try_list(&session, &dir).await {
                Ok(children) => children,
                Err(RequestError::Server(_, ZkError::NoNode)) => return Ok(LockStatus::free()),
                Err(error) => return Err(error.into()),
            };
            let queue = contenders(children);
            let Some((_, head)) = queue.first() else {
                return Ok(LockStatus::free());
            };
            let holders = if is_reader(head) {
                queue.iter().take_while(|(_, c)| is_reader(c)).count()
            } else {
                1
            };
            let path = format!("{dir}/{head}");
            match session
                .run("read the lock node", session.client.get_data(&path))
                .await
            {
                Ok((data, stat)) => {
                    return Ok(LockStatus::held()
                        .with_fencing_token(Some(FencingToken::new(stat.czxid.max(0) as u64)))
                        .with_holders(Some(holders))
                        .with_waiters(Some(queue.len() - holders))
                        .with_holder(identity(&data)));
                }
                Err(RequestError::Server(_, ZkError::NoNode)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("the contenders of {dir} kept changing while their status was read"),
        ))
    }
}

/// The data of a node lockkit creates: the holder identity, if any (what
/// Curator's `LeaderSelector.getLeader()` and kazoo's `Election.contenders()`
/// read), else empty.
fn holder_data(opts: &LockOptions) -> &[u8] {
    opts.holder_identity().map_or(&[], str::as_bytes)
}

/// A node's data as a holder identity: none when empty or not UTF-8.
fn identity(data: &[u8]) -> Option<String> {
    std::str::from_utf8(data)
        .ok()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl ZkBackend {
    /// The holder identity in the node at `path`; none when it is gone.
    async fn holder(&self, session: &Session, path: &str) -> Result<Option<String>> {
        match session
            .run("read the lock node", session.client.get_data(path))
            .await
        {
            Ok((data, _)) => Ok(identity(&data)),
            Err(RequestError::Server(_, ZkError::NoNode)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }
}
