//! The command connection of an instance: one server, a Redis Cluster or a
//! Sentinel-monitored master, behind redis-rs' `ConnectionLike` so that
//! scripts and pipelines run the same way on each.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::direct::{Direct, Route};
use crate::sentinel::SentinelConnection;

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
