//! [`DisposableServer`]: the disposable server of the conformance suite for
//! any server, or group of servers, the testkit runs.

use std::sync::Arc;
use std::time::Duration;

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

    /// Every member at once: a cluster's members are ready only together.
    async fn restart(&self) {
        let members = self.servers.members();
        futures_util::future::join_all(members.iter().map(|m| m.restart())).await;
    }

    async fn connect_within(&self, timeout: Duration) -> Result<Arc<dyn DistributedLock>> {
        self.driver
            .connect(&with_connect_timeout(&self.url, timeout))
            .await
    }

    /// Moves every member's clock, if every member was started with one
    /// that can be moved.
    async fn shift_clock(&mut self, offset: Option<Duration>) -> bool {
        let members = self.servers.members();
        let Some(clocks) = members
            .iter()
            .map(|m| m.clock())
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let ms = offset.map_or(0, |o| i64::try_from(o.as_millis()).unwrap_or(i64::MAX));
        for clock in clocks {
            if let Err(e) = clock.set_offset_ms(ms) {
                panic!("cannot move a server's clock: {e}");
            }
        }
        true
    }
}

/// `url` with its `connect_timeout` parameter set to `timeout`.
fn with_connect_timeout(url: &str, timeout: Duration) -> String {
    let param = format!("connect_timeout={}ms", timeout.as_millis());
    match url.split_once('?') {
        None => format!("{url}?{param}"),
        Some((base, query)) => {
            let mut params: Vec<&str> = query
                .split('&')
                .filter(|p| !p.is_empty() && !p.starts_with("connect_timeout="))
                .collect();
            params.push(&param);
            format!("{base}?{}", params.join("&"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_timeout_is_replaced_or_added() {
        let t = Duration::from_secs(30);
        assert_eq!(
            with_connect_timeout(
                "redis://127.0.0.1:1?connect_timeout=500ms&command_timeout=1s",
                t
            ),
            "redis://127.0.0.1:1?command_timeout=1s&connect_timeout=30000ms"
        );
        assert_eq!(
            with_connect_timeout("zk://127.0.0.1:1/locks", t),
            "zk://127.0.0.1:1/locks?connect_timeout=30000ms"
        );
    }
}
