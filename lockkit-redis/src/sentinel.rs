//! Redis Sentinel: finding the current master and following it across
//! failovers.
//!
//! A [`Resolver`] asks the sentinels (`SENTINEL get-master-addr-by-name`),
//! one after the other with a timeout each, starting with the one that
//! answered last. A [`SentinelConnection`] is a (RESP3) connection to the
//! master it names, checked with `ROLE`; on a sign that the master moved
//! (the connection closed — a failover makes the sentinels close the old
//! master's clients —, a refused connection, a `READONLY` reply, a command
//! that timed out) it asks the sentinels again and reconnects. A `READONLY` reply or a refused
//! connection means the command was not executed, so it is retried once on
//! the new master; after any other failure the command's outcome is unknown
//! and the error is returned (the next command goes to the new master).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue,
    Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::sync::watch;

/// A master's address as the sentinels name it.
pub(crate) type MasterAddr = (String, u16);

/// Finds the master that the sentinels monitor under one name.
pub(crate) struct Resolver {
    sentinels: Vec<ConnectionInfo>,
    master_name: String,
    /// Credentials, database and protocol of the data nodes.
    data: ConnectionInfo,
    connect_timeout: Duration,
    /// Bound of one sentinel's answer (connect included).
    query_timeout: Duration,
    /// The sentinel that answered last: asked first next time.
    preferred: AtomicUsize,
    /// The master the sentinels named last.
    known: watch::Sender<Option<MasterAddr>>,
}

impl Resolver {
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        master_name: String,
        data: ConnectionInfo,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Arc<Resolver> {
        // A sentinel that does not answer must leave time to ask the others
        // within one command's timeout.
        let query_timeout = (command_timeout / 3)
            .max(Duration::from_millis(100))
            .min(connect_timeout.max(Duration::from_millis(100)));
        Arc::new(Resolver {
            sentinels,
            master_name,
            data,
            connect_timeout,
            query_timeout,
            preferred: AtomicUsize::new(0),
            known: watch::channel(None).0,
        })
    }

    /// The master the sentinels named last, if any.
    pub(crate) fn known_master(&self) -> Option<MasterAddr> {
        self.known.borrow().clone()
    }

    /// Changes of [`known_master`](Self::known_master).
    pub(crate) fn changes(&self) -> watch::Receiver<Option<MasterAddr>> {
        self.known.subscribe()
    }

    /// The connection settings of the data node at `addr`.
    pub(crate) fn node_info(&self, addr: &MasterAddr) -> ConnectionInfo {
        self.data
            .clone()
            .set_addr(ConnectionAddr::Tcp(addr.0.clone(), addr.1))
    }

    /// Asks the sentinels for the master's address, the one that answered
    /// last first.
    pub(crate) async fn resolve(&self) -> RedisResult<MasterAddr> {
        let count = self.sentinels.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        let mut unknown = 0;
        for i in 0..count {
            let index = (start + i) % count;
            let sentinel = self.sentinels[index].addr().to_string();
            match tokio::time::timeout(self.query_timeout, self.ask(index)).await {
                Ok(Ok(Some(addr))) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    self.known.send_if_modified(|known| {
                        let changed = known.as_ref() != Some(&addr);
                        if changed {
                            tracing::info!(redis.sentinel = %sentinel, redis.master = %format!("{}:{}", addr.0, addr.1),
                                master_name = %self.master_name, "sentinel names a new master");
                            *known = Some(addr.clone());
                        }
                        changed
                    });
                    return Ok(addr);
                }
                Ok(Ok(None)) => {
                    unknown += 1;
                    failures.push(format!("{sentinel} does not know it"));
                }
                Ok(Err(error)) => failures.push(format!("{sentinel}: {error}")),
                Err(_) => failures.push(format!(
                    "{sentinel}: no reply within {:?}",
                    self.query_timeout
                )),
            }
        }
        let kind = if unknown == count {
            ErrorKind::MasterNameNotFoundBySentinel
        } else {
            ErrorKind::Io
        };
        Err(RedisError::from((
            kind,
            "no sentinel named the master",
            format!("master {:?}: {}", self.master_name, failures.join("; ")),
        )))
    }

    async fn ask(&self, index: usize) -> RedisResult<Option<MasterAddr>> {
        let client = Client::open(self.sentinels[index].clone())?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.query_timeout)),
            )
            .await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query_async(&mut conn)
            .await
    }
}

/// A connection to the current master of a [`Resolver`]; see the module
/// docs. Clones share the connection.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    resolver: Arc<Resolver>,
    slot: Arc<Slot>,
    db: i64,
}

/// The current master connection of one [`SentinelConnection`].
struct Slot {
    master: Mutex<Option<Master>>,
    /// Set when a command timed out (or was abandoned): before the next one,
    /// ask the sentinels whether the master is still the master.
    verify: AtomicBool,
    /// One (re)connection at a time.
    connecting: tokio::sync::Mutex<()>,
    connect_timeout: Duration,
    response_timeout: Duration,
}

#[derive(Clone)]
struct Master {
    addr: MasterAddr,
    conn: MultiplexedConnection,
    /// Set by the connection when it closes (its RESP3 disconnection push):
    /// the next command reconnects instead of failing on a dead connection.
    closed: Arc<AtomicBool>,
}

impl Master {
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }
}

impl Slot {
    fn usable(&self) -> Option<Master> {
        if self.verify.load(Ordering::Acquire) {
            return None;
        }
        self.master
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(Master::is_open)
    }

    /// Drops the connection to `addr` (if it is still the current one).
    fn forget(&self, addr: &MasterAddr) {
        let mut master = self.master.lock().unwrap_or_else(PoisonError::into_inner);
        if master.as_ref().is_some_and(|m| &m.addr == addr) {
            *master = None;
        }
    }
}

/// Marks the slot for verification unless defused: a command whose future
/// is dropped midway (its caller's timeout) leaves the master in doubt.
struct InDoubt<'a>(Option<&'a Slot>);

impl InDoubt<'_> {
    fn defuse(mut self) {
        self.0 = None;
    }
}

impl Drop for InDoubt<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.verify.store(true, Ordering::Release);
        }
    }
}

fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) || error.code() == Some("READONLY")
}

impl SentinelConnection {
    /// A connection whose replies may take up to `response_timeout`;
    /// connects on first use.
    pub(crate) fn new(
        resolver: Arc<Resolver>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> SentinelConnection {
        let db = resolver.data.redis_settings().db();
        SentinelConnection {
            resolver,
            slot: Arc::new(Slot {
                master: Mutex::new(None),
                verify: AtomicBool::new(false),
                connecting: tokio::sync::Mutex::new(()),
                connect_timeout,
                response_timeout,
            }),
            db,
        }
    }

    /// The connection to the current master, resolving and connecting first
    /// if there is none or it is in doubt.
    async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.slot.usable() {
            return Ok(master);
        }
        let _one = self.slot.connecting.lock().await;
        if let Some(master) = self.slot.usable() {
            return Ok(master);
        }
        let addr = self.resolver.resolve().await?;
        let current = self
            .slot
            .master
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(current) = current
            && current.addr == addr
            && current.is_open()
        {
            // Still the master: keep the connection.
            self.slot.verify.store(false, Ordering::Release);
            return Ok(current);
        }
        let closed = Arc::new(AtomicBool::new(false));
        let conn = self.connect(&addr, closed.clone()).await?;
        let master = Master { addr, conn, closed };
        *self
            .slot
            .master
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(master.clone());
        self.slot.verify.store(false, Ordering::Release);
        Ok(master)
    }

    /// Connects to `addr` and checks that it is a master (`ROLE`). The
    /// connection speaks RESP3, whose disconnection push sets `closed`.
    async fn connect(
        &self,
        addr: &MasterAddr,
        closed: Arc<AtomicBool>,
    ) -> RedisResult<MultiplexedConnection> {
        let info = self.resolver.node_info(addr);
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(resp3))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.slot.connect_timeout))
                    .set_response_timeout(Some(self.slot.response_timeout))
                    .set_push_sender(move |push: PushInfo| {
                        if push.kind == PushKind::Disconnection {
                            closed.store(true, Ordering::Release);
                        }
                        Ok::<(), std::convert::Infallible>(())
                    }),
            )
            .await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        let role = match role.into_iter().next() {
            Some(value) => String::from_redis_value(value)?,
            None => String::new(),
        };
        if role != "master" {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the sentinels' master is not a master",
                format!(
                    "{}:{} says its role is {role:?} (a failover in progress?)",
                    addr.0, addr.1
                ),
            )));
        }
        tracing::debug!(redis.master = %format!("{}:{}", addr.0, addr.1), "connected to the master");
        Ok(conn)
    }

    /// Runs `op` on the master's connection, following a failover as the
    /// module docs say.
    async fn call<T, F, Fut>(&self, op: F) -> RedisResult<T>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut retried = false;
        loop {
            let master = self.master().await?;
            let in_doubt = InDoubt(Some(&self.slot));
            let result = op(master.conn.clone()).await;
            in_doubt.defuse();
            match result {
                Err(error) if is_read_only(&error) || error.is_connection_refusal() => {
                    self.slot.forget(&master.addr);
                    if retried {
                        return Err(error);
                    }
                    retried = true;
                }
                Err(error) if error.is_timeout() => {
                    self.slot.verify.store(true, Ordering::Release);
                    return Err(error);
                }
                Err(error)
                    if error.is_io_error()
                        || error.is_connection_dropped()
                        || error.is_unrecoverable_error() =>
                {
                    self.slot.forget(&master.addr);
                    return Err(error);
                }
                other => return other,
            }
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call(move |mut conn| async move { conn.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.call(move |mut conn| async move {
            conn.req_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
