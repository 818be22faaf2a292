//! The command connection of an instance: one server, a Redis Cluster or a
//! Sentinel-monitored master, behind redis-rs' `ConnectionLike` so that
//! scripts and pipelines run the same way on each.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{LockError, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

use crate::direct::{Direct, Route};
use crate::error::map_error;
use crate::notifications::PushSender;
use crate::sentinel::{Resolver, SentinelConnection};
use crate::settings::{RedisConfig, Topology};

/// A connection in one of the three modes. Clones share the connection.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server; reconnects by itself.
    Single(Single),
    /// A Redis Cluster; commands go to the master of their key's slot.
    Cluster(ClusterConnection),
    /// The current master of a Sentinel deployment.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
            Connection::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
            Connection::Sentinel(conn) => conn.get_db(),
        }
    }
}

/// One server: a multiplexed connection that reconnects by itself, and
/// beside it, where it may be used, a [`Direct`] one that single commands
/// take when it is free. Pipelines always go over the multiplexed one.
#[derive(Clone)]
pub(crate) struct Single {
    manager: ConnectionManager,
    direct: Option<Arc<Direct>>,
}

impl Single {
    pub(crate) fn new(manager: ConnectionManager, direct: Option<Arc<Direct>>) -> Single {
        Single { manager, direct }
    }
}

impl ConnectionLike for Single {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let Some(direct) = &self.direct else {
            return self.manager.req_packed_command(cmd);
        };
        match direct.route() {
            Route::Direct(lease) => Box::pin(lease.request(cmd)),
            Route::Queue => {
                let direct = direct.clone();
                Box::pin(async move {
                    if let Some(lease) = direct.clone().queue().await {
                        if !direct.multiplexed_owes() {
                            return lease.request(cmd).await;
                        }
                        // Behind requests cut off on both connections.
                        lease.settle().await;
                    }
                    let ticket = direct.ticket();
                    ticket.run(self.manager.req_packed_command(cmd)).await
                })
            }
            Route::Multiplexed(ticket) => {
                Box::pin(ticket.run(self.manager.req_packed_command(cmd)))
            }
        }
    }

    /// Over the multiplexed connection, after the direct one's owed
    /// replies.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let Some(direct) = self.direct.clone() else {
            return self.manager.req_packed_commands(pipeline, offset, count);
        };
        Box::pin(async move {
            direct.settle().await;
            let ticket = direct.ticket();
            ticket
                .run(self.manager.req_packed_commands(pipeline, offset, count))
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

pub(crate) fn client_for(config: &RedisConfig, info: redis::ConnectionInfo) -> Result<Client> {
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
pub(crate) fn manager_config(
    config: &RedisConfig,
    response_timeout: Duration,
) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
}

/// A single server's command connection: `manager`, and a direct one
/// beside it where it may be used (see [`Direct`]).
pub(crate) fn single(config: &RedisConfig, manager: ConnectionManager) -> Connection {
    let direct = config
        .direct
        .then(|| {
            Direct::new(
                &config.info,
                config.tls_root_cert.is_some(),
                config.connect_timeout,
            )
        })
        .flatten();
    Connection::Single(Single::new(manager, direct))
}

/// The same `info` speaking RESP3 (for the subscriber).
pub(crate) fn resp3(info: &redis::ConnectionInfo) -> redis::ConnectionInfo {
    info.clone().set_redis_settings(
        info.redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3),
    )
}

/// The client of the subscriber connection of a Redis Cluster with sharded
/// pub/sub: RESP3 (pushes), each message handed to `push`.
pub(crate) fn shard_subscriber(
    config: &RedisConfig,
    nodes: &[redis::ConnectionInfo],
    push: PushSender,
) -> Result<ClusterClient> {
    let builder = cluster_builder(config, nodes, config.command_timeout)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(move |info| push(info));
    build_cluster(config, builder)
}

/// A cluster client's settings, as for the command connection: few, quick
/// retries (see [`manager_config`]).
fn cluster_builder(
    config: &RedisConfig,
    nodes: &[redis::ConnectionInfo],
    response_timeout: Duration,
) -> ClusterClientBuilder {
    ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(config.connect_timeout)
        .response_timeout(response_timeout)
        .retries(2)
        .min_retry_wait(10)
        .max_retry_wait(200)
}

fn build_cluster(config: &RedisConfig, builder: ClusterClientBuilder) -> Result<ClusterClient> {
    builder
        .build()
        .map_err(|e| LockError::invalid_url(&config.redacted_url, e.to_string()))
}

/// Opens a command connection whose replies may take `response_timeout`.
/// Single server and Cluster connect here; Sentinel on first use.
pub(crate) async fn open(
    config: &RedisConfig,
    resolver: Option<&Arc<Resolver>>,
    response_timeout: Duration,
) -> Result<Connection> {
    let address = config.address();
    match (&config.topology, resolver) {
        (Topology::Cluster { nodes }, _) => {
            let client = build_cluster(config, cluster_builder(config, nodes, response_timeout))?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(|e| map_error(&address, "connect", e))?;
            Ok(Connection::Cluster(conn))
        }
        (Topology::Sentinel { .. }, Some(resolver)) => Ok(Connection::Sentinel(
            SentinelConnection::new(resolver.clone(), config.connect_timeout, response_timeout),
        )),
        _ => {
            let client = client_for(config, config.info.clone())?;
            let manager = ConnectionManager::new_with_config(
                client,
                manager_config(config, response_timeout),
            )
            .await
            .map_err(|e| map_error(&address, "connect", e))?;
            Ok(single(config, manager))
        }
    }
}
