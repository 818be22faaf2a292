//! [`DisposableServer`]: the disposable server of the conformance suite for
//! any server, or group of servers, the testkit runs.

use std::sync::Arc;

use lockkit_conformance::Disposable;
use lockkit_core::backend::Driver;
use lockkit_core::{DistributedLock, Result};

use crate::server::FaultControl;
use crate::{RedisCluster, RedisSentinels, RedisServer};

/// Servers that die, freeze and thaw together in a test: one server, several
/// independent ones (Redlock's masters), or every process of a deployment
/// (a Redis Cluster's nodes; Sentinel's sentinels, replica and master).
pub trait ServerGroup: Send + Sync {
    /// The processes, in the order they are killed and paused (and resumed
    /// in reverse).
    fn members(&self) -> Vec<&dyn FaultControl>;
}

impl<T: FaultControl> ServerGroup for T {
    fn members(&self) -> Vec<&dyn FaultControl> {
        vec![self]
    }
}

impl ServerGroup for Vec<RedisServer> {
    fn members(&self) -> Vec<&dyn FaultControl> {
        self.iter().map(|s| s as &dyn FaultControl).collect()
    }
}

impl ServerGroup for RedisCluster {
    fn members(&self) -> Vec<&dyn FaultControl> {
        self.nodes().members()
    }
}

impl ServerGroup for RedisSentinels {
    /// The sentinels first (so that none of them sees the master go), then
    /// the replica and the master.
    fn members(&self) -> Vec<&dyn FaultControl> {
        let mut members: Vec<&dyn FaultControl> = self
            .sentinels()
            .iter()
            .map(|s| s as &dyn FaultControl)
            .collect();
        members.push(self.replica());
        members.push(self.master());
        members
    }
}

impl ServerGroup for [RedisServer] {
    fn members(&self) -> Vec<&dyn FaultControl> {
        self.iter().map(|s| s as &dyn FaultControl).collect()
    }
}

/// A [`Disposable`] for any [`ServerGroup`]: clients connect to `url` with
/// `driver`; `kill`, `pause` and `resume` act on every member.
///
/// ```no_run
/// # async fn example() -> Box<dyn lockkit_conformance::Disposable> {
/// use lockkit_testkit::{DisposableServer, RedisServer, TestServer};
///
/// let server = RedisServer::start().await;
/// let url = format!("{}?connect_timeout=500ms", server.url());
/// # let driver = lockkit_core::MEMORY_DRIVER;
/// Box::new(DisposableServer::new(server, url, driver))
/// # }
/// ```
#[derive(Debug)]
pub struct DisposableServer<G> {
    servers: G,
    url: String,
    driver: Driver,
}

impl<G: ServerGroup> DisposableServer<G> {
    /// Owns `servers` (they die when it is dropped).
    pub fn new(servers: G, url: impl Into<String>, driver: Driver) -> Self {
        DisposableServer {
            servers,
            url: url.into(),
            driver,
        }
    }

    /// The servers.
    pub fn servers(&self) -> &G {
        &self.servers
    }
}

#[async_trait::async_trait]
impl<G: ServerGroup + 'static> Disposable for DisposableServer<G> {
    async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        self.driver.connect(&self.url).await
    }

    async fn kill(&mut self) {
        self.servers.members().iter().for_each(|s| s.kill());
    }

    async fn pause(&mut self) {
        self.servers.members().iter().for_each(|s| s.pause());
    }

    async fn resume(&mut self) {
        self.servers.members().iter().rev().for_each(|s| s.resume());
    }
}
