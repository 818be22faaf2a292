//! One Redis server: the command connection, the scripts, and release notifications.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{Attempt, FencingToken, LockError, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, TlsCertificates};

use crate::config::RedisConfig;
use crate::error::{map_error, timed_out};
use crate::keys::Keys;
use crate::notifications::Notifications;
use crate::scripts::{SCRIPTS, SOURCES};

/// A connection to one Redis server with the lock operations as single atomic
/// scripts. Every call is bounded by the command timeout; the connection
/// reconnects on its own after the server comes back.
///
/// [`RedisLock`](crate::RedisLock) uses one; the Redlock backend uses N.
#[derive(Clone)]
pub struct RedisInstance {
    inner: Arc<Inner>,
}

struct Inner {
    address: String,
    commands: ConnectionManager,
    notifications: Arc<Notifications>,
    command_timeout: Duration,
}

impl fmt::Debug for RedisInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisInstance")
            .field("address", &self.inner.address)
            .field("command_timeout", &self.inner.command_timeout)
            .finish_non_exhaustive()
    }
}

fn client_for(config: &RedisConfig, info: redis::ConnectionInfo) -> Result<Client> {
    let result = match &config.tls_root_cert {
        Some(pem) => Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        ),
        None => Client::open(info),
    };
    result.map_err(|e| LockError::invalid_url(&config.redacted_url, e.to_string()))
}

/// Reconnection settings: few, quick retries, so that a command on a dead
/// server fails within its own timeout instead of waiting out a long backoff.
fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
}

impl RedisInstance {
    /// Connects, checks that the server answers, and loads the scripts.
    pub async fn connect(config: RedisConfig) -> Result<RedisInstance> {
        let address = config.address();
        let client = client_for(&config, config.info.clone())?;
        let connect = async {
            let mut manager =
                ConnectionManager::new_with_config(client, manager_config(&config)).await?;
            // A lone PING first: it surfaces a missing or wrong password as one
            // clear error instead of one per pipelined command.
            redis::cmd("PING").query_async::<()>(&mut manager).await?;
            let mut load = redis::pipe();
            for source in SOURCES {
                load.cmd("SCRIPT").arg("LOAD").arg(source);
            }
            load.query_async::<()>(&mut manager).await?;
            Ok::<_, RedisError>(manager)
        };
        let commands = match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(Ok(manager)) => manager,
            Ok(Err(error)) => return Err(map_error(&address, "connect", error)),
            Err(_) => {
                return Err(LockError::unavailable(
                    crate::error::BACKEND,
                    format!(
                        "connect to {address}: no connection within {:?}",
                        config.connect_timeout
                    ),
                ));
            }
        };
        tracing::debug!(redis.address = %address, "connected");
        Self::with_commands(&config, commands)
    }

    /// An instance that connects on first use: no network traffic here, and a
    /// server that is down now is picked up once it is back. The scripts are
    /// loaded on their first `NOSCRIPT`. For Redlock, which must start with a
    /// quorum and let the other instances come later.
    pub fn connect_lazy(config: RedisConfig) -> Result<RedisInstance> {
        let client = client_for(&config, config.info.clone())?;
        let commands = ConnectionManager::new_lazy_with_config(client, manager_config(&config))
            .map_err(|e| map_error(&config.address(), "set up the connection", e))?;
        Self::with_commands(&config, commands)
    }

    fn with_commands(config: &RedisConfig, commands: ConnectionManager) -> Result<RedisInstance> {
        let address = config.address();
        // Release notifications arrive on a second, RESP3 connection that is only
        // opened when the first waiter needs it.
        let resp3 = config.info.clone().set_redis_settings(
            config
                .info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3),
        );
        let notifications = Notifications::new(
            client_for(config, resp3)?,
            manager_config(config),
            address.clone(),
            config.command_timeout,
            config.subscription_linger,
        )
        .map_err(|e| map_error(&address, "set up the subscriber", e))?;
        Ok(RedisInstance {
            inner: Arc::new(Inner {
                address,
                commands,
                notifications,
                command_timeout: config.command_timeout,
            }),
        })
    }

    /// The server address, `host:port`.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    async fn run<T>(
        &self,
        what: &str,
        call: impl Future<Output = std::result::Result<T, RedisError>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.inner.command_timeout, call).await {
            Ok(result) => result.map_err(|e| map_error(&self.inner.address, what, e)),
            Err(_) => Err(timed_out(
                &self.inner.address,
                what,
                self.inner.command_timeout,
            )),
        }
    }

    /// `SET lock owner NX PX ttl`, and on success `INCR fence` when `fencing`;
    /// on failure the holder's remaining TTL.
    pub async fn try_lock(
        &self,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let mut conn = self.inner.commands.clone();
        let (granted, value): (i64, i64) = self
            .run(
                "acquire",
                SCRIPTS
                    .acquire
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .arg(owner)
                    .arg(ttl_millis(ttl))
                    .arg(if fencing { "1" } else { "0" })
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(if granted == 1 {
            Attempt::Acquired(fencing.then(|| FencingToken::new(value.max(0) as u64)))
        } else {
            Attempt::Busy {
                retry_after: match value {
                    // The key has no expiry: someone set it by hand.
                    -1 => None,
                    // Gone since the SET: retry at once.
                    ..=-2 => Some(Duration::ZERO),
                    ms => Some(Duration::from_millis(ms as u64)),
                },
            }
        })
    }

    /// Extends `owner`'s lease to `ttl` from now; false if the key is not `owner`'s.
    pub async fn extend(&self, keys: &Keys, owner: &str, ttl: Duration) -> Result<bool> {
        let mut conn = self.inner.commands.clone();
        let extended: i64 = self
            .run(
                "extend",
                SCRIPTS
                    .extend
                    .key(&keys.lock)
                    .arg(owner)
                    .arg(ttl_millis(ttl))
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(extended == 1)
    }

    /// Deletes the key if it is `owner`'s; false if it was not. With `notify`,
    /// a release is published to wake waiters (Redlock rolls back a partial
    /// grant without it, so that contenders keep their random retry delays).
    pub async fn release(&self, keys: &Keys, owner: &str, notify: bool) -> Result<bool> {
        let mut conn = self.inner.commands.clone();
        let released: i64 = self
            .run(
                "release",
                SCRIPTS
                    .release
                    .key(&keys.lock)
                    .arg(owner)
                    .arg(&keys.channel)
                    .arg(if notify { "1" } else { "0" })
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(released == 1)
    }

    /// Passes `from`'s lease to `to` for `ttl` from now, drawing a new
    /// fencing token when `fencing`: `Ok(None)` if the lease was not `from`'s,
    /// else the token (0 without fencing). No release is published: the lock
    /// never comes free.
    pub async fn hand_over(
        &self,
        keys: &Keys,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<Option<u64>> {
        let mut conn = self.inner.commands.clone();
        let token: i64 = self
            .run(
                "hand the lease over",
                SCRIPTS
                    .hand_over
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .arg(from)
                    .arg(to)
                    .arg(ttl_millis(ttl))
                    .arg(if fencing { "1" } else { "0" })
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(u64::try_from(token).ok())
    }

    /// Subscribes to the release channel of `keys` (shared by all waiters of
    /// this instance). Falls back to no notifications if the subscription fails.
    pub async fn watch(&self, keys: &Keys) -> lockkit_core::ReleaseWatch {
        self.inner.notifications.watch(&keys.channel).await
    }

    /// The remaining TTL of the lock key in ms (`PTTL`): `None` if the lock is free.
    pub async fn holder_ttl(&self, keys: &Keys) -> Result<Option<Duration>> {
        let mut conn = self.inner.commands.clone();
        let pttl: i64 = self
            .run(
                "pttl",
                redis::cmd("PTTL").arg(&keys.lock).query_async(&mut conn),
            )
            .await?;
        Ok(match pttl {
            ..=-2 => None,
            -1 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms as u64)),
        })
    }

    /// Who holds the lock, read in one `MULTI`/`EXEC` (`GET` and `PTTL` of
    /// the lock key, `GET` of the fence counter); `None` if it is free.
    pub async fn holder(&self, keys: &Keys) -> Result<Option<Holder>> {
        let mut conn = self.inner.commands.clone();
        let (owner, pttl, fence): (Option<String>, i64, Option<u64>) = self
            .run(
                "read the lock's holder",
                redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg(&keys.lock)
                    .cmd("PTTL")
                    .arg(&keys.lock)
                    .cmd("GET")
                    .arg(&keys.fence)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(owner.map(|owner| Holder {
            owner,
            remaining: match pttl {
                -1 => Duration::MAX,
                ms => Duration::from_millis(ms.max(0) as u64),
            },
            fence,
        }))
    }

    /// Round trip of one `PING`, for benchmarks and health checks.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.inner.commands.clone();
        self.run("ping", redis::cmd("PING").query_async::<()>(&mut conn))
            .await
    }
}

/// The holder of a lock as one Redis server sees it; see
/// [`RedisInstance::holder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The lock key's value: the holder's owner token.
    pub owner: String,
    /// The lock key's remaining TTL (`Duration::MAX` for a key without one).
    pub remaining: Duration,
    /// The fence counter: the last fencing token drawn for the name, if any.
    pub fence: Option<u64>,
}

fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}
