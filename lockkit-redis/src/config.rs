//! [`RedisLockBuilder`]: a URL, then settings in code, then a connected lock.

use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::{LeaseLock, check_timeout};

use crate::backend::{RedisBackend, RedisLock};
use crate::instance::RedisInstance;
use crate::settings::{RedisConfig, ReplicaWait};
use crate::url::{FAIR_OR_BARGING, parse_url};

/// The longest [`RedisLockBuilder::turn`]: a reservation that outlasts
/// this only keeps a lock idle.
const MAX_TURN: Duration = Duration::from_secs(60);

/// Builds a [`RedisLock`]: from a URL, then adjusted in code.
///
/// URL forms:
///
/// * `redis://[user:password@]host[:port][/db][?param=value…]`: one server;
///   `rediss://` for TLS, with the server's certificate always verified
///   (against the system's roots, or the `ca_file` below): redis-rs's
///   `#insecure` fragment is refused, as is any fragment.
/// * `redis+cluster://[user:password@]h1:p1,h2:p2,…[?param=value…]`: a Redis
///   Cluster, discovered from these seed nodes (any reachable one will do).
/// * `redis+sentinel://[user:password@]s1:p1,s2:p2,…/master-name[/db][?param=value…]`:
///   the master that the sentinels monitor as `master-name`, followed across
///   failovers. The credentials are those of the data nodes; the sentinels'
///   own password is the `sentinel_password` parameter.
///
/// Ports default to 6379 (26379 for sentinels); IPv6 hosts go in brackets.
/// Parameters (percent-decoded):
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | key prefix; empty for plain keys that other libraries share | `lockkit:` |
/// | `fair` | `true`: waiters of an exclusive lock are served in order across clients ([`fair`](RedisLockBuilder::fair)) | `false` |
/// | `barging` | `true`: waiters of an exclusive lock ask again on the backoff, in no line, and a client that releases may take the lock straight back ([`barging`](RedisLockBuilder::barging)) | `false` |
/// | `fencing` | `false`: grants carry no fencing token, and an acquire spares the write that draws one ([`fencing`](RedisLockBuilder::fencing)) | `true` (where the deployment can fence) |
/// | `connect_timeout` | e.g. `500ms`, `2s` | 2 s |
/// | `command_timeout` | per command | 1 s |
/// | `ca_file` | PEM file of the CA that signed the server's certificate (`rediss://` only) | system roots |
/// | `protocol` | `resp2` or `resp3` for the command connection (Sentinel mode always speaks RESP3 to the master, to learn at once when the connection drops) | `resp2` |
/// | `wait_replicas` | `WAIT` for this many replicas after every grant (see [`wait_for_replicas`](Self::wait_for_replicas)) | off |
/// | `wait_timeout` | how long that `WAIT` may take | 1 s |
/// | `sentinel_password` | password of the sentinels (`redis+sentinel://` only) | none |
/// | `direct` | `false`: every command over the multiplexed connection, no direct connection beside it ([`direct_connection`](Self::direct_connection); `redis://` only) | `true` |
/// | `sharded_pubsub` | `redis+cluster://` only: `true` announces releases with sharded pub/sub (`SPUBLISH`, Redis 7; connecting fails where the servers lack it), `false` with `PUBLISH` ([`sharded_pubsub`](Self::sharded_pubsub)) | `auto`: sharded where the servers have it |
///
/// Connections: commands go over one multiplexed connection (redis-rs's,
/// which reconnects by itself). On a single server over plain TCP with
/// RESP2 (`redis://`, the default protocol), a second connection opens
/// beside it on first use: a request that finds it free runs on it
/// straight from the calling task, without the hand-offs to and from the
/// multiplexed connection's driver task, which is what a lone caller's
/// round trip mostly costs on the client; a request that finds it busy
/// takes the multiplexed one. A waiter adds the subscriber connection that
/// release notifications arrive on.
///
/// ```
/// use std::time::Duration;
/// use lockkit_redis::RedisLockBuilder;
///
/// let builder = RedisLockBuilder::from_url("redis://:s3cret@127.0.0.1:6379/0?prefix=app:")?
///     .command_timeout(Duration::from_millis(500));
/// assert!(!format!("{builder:?}").contains("s3cret"));
///
/// let sentinel = RedisLockBuilder::from_url(
///     "redis+sentinel://:s3cret@10.0.0.1,10.0.0.2,10.0.0.3/orders?wait_replicas=1&wait_timeout=200ms",
/// )?;
/// assert_eq!(sentinel.config().mode(), "sentinel");
/// assert_eq!(
///     sentinel.config().wait_for_replicas(),
///     Some((1, Duration::from_millis(200)))
/// );
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisLockBuilder {
    config: RedisConfig,
    prefix: String,
    fair: bool,
    barging: bool,
    fencing: bool,
}

impl RedisLockBuilder {
    /// Parses a `redis://`, `rediss://`, `redis+cluster://` or
    /// `redis+sentinel://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let (config, lock) = parse_url(url)?;
        Ok(RedisLockBuilder {
            config,
            prefix: lock.prefix,
            fair: lock.fair,
            barging: lock.barging,
            fencing: lock.fencing,
        })
    }

    /// The key prefix (default `lockkit:`). Empty: the lock key is the name itself.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Serves the waiters of an exclusive lock in the order they began to
    /// wait, across clients (default: no order between clients; `fair=true`
    /// in the URL). The server keeps a queue per name (two sorted sets beside
    /// the lock key); only its head may take the lock, and a grant never goes
    /// straight back to a client while others wait. Each client queues once,
    /// its own tasks in line behind it (a lock is then not passed from one
    /// task of the client to the next without going through the server).
    /// A waiter keeps its place by asking again at least every second (a
    /// release wakes it sooner); one that vanished holds up the line for
    /// [`QUEUE_PLACE`](crate::QUEUE_PLACE) (2 s) at most. `try_acquire` does
    /// not jump the queue: it fails while others wait. Readers and
    /// semaphores are not queued. [`capabilities().fifo`](lockkit_core::Capabilities::fifo)
    /// says so. Every client of a name must be fair for the order to hold:
    /// a plain client (or another library) ignores the queue and may take
    /// the lock whenever it is free.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Lets the lock go to whoever asks first (default false; `barging=true`
    /// in the URL): this client's waiters of an exclusive lock take no
    /// place in the name's waiting line and hear no releases; they ask
    /// again on the backoff of their [`LockOptions`](lockkit_core::LockOptions)
    /// (never past the holder's expiry), and take the lock whenever they
    /// find it free. Under many clients contending for one name, a client
    /// that releases and asks again at once then mostly takes the lock
    /// straight back, without a handoff between processes: the most
    /// critical sections per second (what `rslock` and most lock
    /// libraries do), at the price of order: a waiter may wait as long as
    /// others keep finding the lock free first, and a handoff to a waiting
    /// client takes up to its backoff. Readers, semaphores and the other
    /// clients of the name are unchanged: a barging client's release still
    /// hands the lock to the first client in line, if a client that is not
    /// barging waits there. Excludes [`fair`](Self::fair): connecting
    /// with both fails with `LockError::InvalidOptions`.
    pub fn barging(mut self, barging: bool) -> Self {
        self.barging = barging;
        self
    }

    /// Whether grants carry fencing tokens (default true, where the
    /// deployment can fence: see [`RedisBackend::fences`]; `fencing=false`
    /// in the URL). A token costs each exclusive acquire a `TIME` and a
    /// write of the name's fence counter inside its script, and the
    /// release the counter's clean-up; a client whose resources take no
    /// token can spare them. Its
    /// [`capabilities().fencing`](lockkit_core::Capabilities::fencing) is
    /// then false and its guards have no token. Clients with and without
    /// tokens may share a name: a holding without one leaves the counter
    /// alone, and the next token drawn is still above every earlier one.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Whether single commands may take a direct connection beside the
    /// multiplexed one (default true; used on one server over plain TCP
    /// with RESP2 only). The calling task then writes a request and reads
    /// its reply itself, without the hand-offs to and from redis-rs's driver
    /// task; `false` sends every command over the multiplexed connection, as
    /// redis-rs alone would, for a user who suspects the direct path.
    pub fn direct_connection(mut self, on: bool) -> Self {
        self.config.direct = on;
        self
    }

    lockkit_core::timeout_setters!(
        config,
        connect: "How long to wait for a connection (default 2 s).",
        command: "How long to wait for one command's reply (default 1 s).",
    );

    /// Redis Cluster: how a release reaches the waiters of other clients.
    /// A `PUBLISH` is broadcast over the cluster bus to every node, so its
    /// cost grows with the cluster; sharded pub/sub (`SPUBLISH` and
    /// `SSUBSCRIBE`, Redis 7) stays within the shard that owns the channel's
    /// slot, which is the lock key's. `Some(true)` asks for sharded pub/sub
    /// (connecting fails with `InvalidOptions` where the servers lack it),
    /// `Some(false)` for `PUBLISH`, `None` (the default) for sharded pub/sub
    /// where the servers have it. Ignored outside a cluster. Every client of
    /// a lock must announce the same way: a waiter subscribed one way does
    /// not hear a release published the other (it still gets the lock, by
    /// polling, later).
    pub fn sharded_pubsub(mut self, sharded: Option<bool>) -> Self {
        self.config.sharded_pubsub = sharded;
        self
    }

    /// How long a release subscription stays open after its last waiter left
    /// (default 10 s), so that hot names do not resubscribe on every wait.
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.config.subscription_linger = linger;
        self
    }

    /// How long a release keeps the lock for the first client in the
    /// lock's waiting line while that client is woken and asks for it
    /// (default [`TURN`](crate::TURN), 100 ms). A client in line that
    /// vanished holds the lock up this long, once; one slower than this to
    /// come loses its turn to whoever asks first. At least 1 ms and at most
    /// a minute. Every client of a lock should use the same.
    pub fn turn(mut self, turn: Duration) -> Self {
        self.config.turn = turn;
        self
    }

    /// Trusts this PEM-encoded CA certificate for `rediss://` instead of the system roots.
    pub fn tls_root_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.config.tls_root_cert = Some(pem.into());
        self
    }

    /// After every grant and renewal, `WAIT replicas timeout` on the connection that
    /// wrote the lock: if fewer than `replicas` replicas acknowledged the
    /// write within `timeout`, the lock is released again and the attempt
    /// fails with [`LockError::Unavailable`](lockkit_core::LockError::Unavailable) ("lock written but only k of n
    /// replicas acknowledged…"). `replicas == 0` turns it off (the default).
    ///
    /// This **narrows, but does not close,** the window in which a failover
    /// loses a lock: Redis replicates asynchronously, `WAIT` does not make the
    /// write durable on the replicas (they may not have persisted it), a
    /// replica that acknowledged is not necessarily the one that gets
    /// promoted. Renewals are waited for too: one that too few replicas
    /// acknowledged fails with `LockError::Unavailable`, and the guard's
    /// validity does not move. It costs a round trip to the replicas on every
    /// acquire and renewal.
    ///
    /// Acquires and renewals then run on a connection of their own (a blocked
    /// `WAIT` must not hold up releases), and a lock is never passed from one
    /// task of the client to the next without going through the server, so
    /// every grant is waited for. In Redis Cluster the `WAIT` goes to the
    /// master of the lock's slot.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.config.wait = (replicas > 0).then_some(ReplicaWait { replicas, timeout });
        self
    }

    /// The connection settings so far.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Connects eagerly and loads the scripts: a server that does not serve
    /// yet (a cluster whose state is not ok yet, too) is tried again with
    /// backoff until the connect timeout, then gives
    /// `LockError::Unavailable`.
    pub async fn connect(self) -> Result<RedisLock> {
        check_timeout("connect_timeout", self.config.connect_timeout)?;
        check_timeout("command_timeout", self.config.command_timeout)?;
        if let Some(wait) = self.config.wait {
            check_timeout("the replica wait timeout", wait.timeout)?;
        }
        let turn = self.config.turn;
        if !(Duration::from_millis(1)..=MAX_TURN).contains(&turn) {
            return Err(lockkit_core::LockError::invalid_options(format!(
                "turn: {turn:?} is not between 1 ms and {MAX_TURN:?}"
            )));
        }
        if self.fair && self.barging {
            return Err(lockkit_core::LockError::invalid_options(format!(
                "fair and barging {FAIR_OR_BARGING}"
            )));
        }
        let config = if self.barging {
            self.config.without_line()
        } else {
            self.config
        };
        let instance = RedisInstance::connect(config).await?;
        let backend = RedisBackend::new(instance, self.prefix).fencing(self.fencing);
        Ok(LeaseLock::new(match (self.fair, self.barging) {
            (true, _) => backend.fair(),
            (_, true) => backend.barging(),
            _ => backend,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fair_and_barging_are_refused_before_connecting() {
        let builder = RedisLockBuilder::from_url("redis://127.0.0.1:1")
            .unwrap()
            .fair(true)
            .barging(true);
        let err = builder.connect().await.map(|_| ()).unwrap_err();
        assert!(
            matches!(err, lockkit_core::LockError::InvalidOptions { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("exclude each other"), "{err}");
    }
}
