//! A real Redis Cluster of N masters on free loopback ports, for tests.

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::time::Instant;

use crate::process::{ServerError, free_port};
use crate::redis_resp::info_field;
use crate::redis_server::RedisServer;
use crate::server::{FaultControl, TestServer};

/// The number of hash slots of Redis Cluster.
const SLOTS: usize = 16384;
/// How long the cluster may take to report `cluster_state:ok` everywhere.
const READY_DEADLINE: Duration = Duration::from_secs(20);
/// `cluster-node-timeout` of every node, in ms.
const NODE_TIMEOUT_MS: &str = "1000";

/// A Redis Cluster of `masters` masters, each a [`RedisServer`] started
/// with `--cluster-enabled yes` on a free loopback port (and a free
/// cluster-bus port), the hash slots split evenly between them; with
/// [`try_start_with_replicas`](Self::try_start_with_replicas), one replica
/// per master too.
///
/// The nodes die with the `RedisCluster` (and with the test process). Each
/// node can be paused, resumed, killed and restarted through
/// [`nodes`](Self::nodes); a restarted node keeps its `nodes.conf` and so
/// its slots (its data is gone: no persistence). With one master down the
/// cluster reports `cluster_state:fail` after the node timeout (1 s), as
/// every slot must be served.
///
/// ```no_run
/// # async fn demo() {
/// use lockkit_testkit::{FaultControl, RedisCluster};
///
/// let cluster = RedisCluster::start(3).await;
/// let url = cluster.url(); // redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
/// cluster.nodes()[1].pause();
/// # }
/// ```
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// `replicas[i]` was started as the replica of `nodes[i]`.
    replicas: Vec<RedisServer>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("ports", &self.ports())
            .field(
                "replica_ports",
                &self
                    .replicas
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RedisCluster {
    /// Starts a cluster of `masters` masters and waits until every node
    /// reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    pub async fn start(masters: usize) -> RedisCluster {
        Self::try_start(masters)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a cluster of `masters` (at least 1) masters and waits until
    /// every node reports `cluster_state:ok` (within 20 s).
    pub async fn try_start(masters: usize) -> Result<RedisCluster, ServerError> {
        Self::try_start_with(masters, false).await
    }

    /// Like [`try_start`](Self::try_start), and one replica per master
    /// ([`replicas`](Self::replicas)), replicating before this returns. A
    /// master that fails is replaced by its replica after the node timeout
    /// (1 s), as the other masters vote; restarted, the old master rejoins
    /// as the new one's replica.
    pub async fn try_start_with_replicas(masters: usize) -> Result<RedisCluster, ServerError> {
        Self::try_start_with(masters, true).await
    }

    async fn try_start_with(masters: usize, replicas: bool) -> Result<RedisCluster, ServerError> {
        let masters = masters.max(1);
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            nodes.push(start_node().await?);
        }
        let mut replica_nodes = Vec::new();
        if replicas {
            for _ in 0..masters {
                replica_nodes.push(start_node().await?);
            }
        }
        let cluster = RedisCluster {
            nodes,
            replicas: replica_nodes,
        };
        cluster.form().await?;
        if !cluster.wait_until_ok(READY_DEADLINE).await {
            return Err(ServerError::NotReady {
                what: format!("Redis Cluster on ports {:?}", cluster.ports()),
                waited: READY_DEADLINE,
                log_tail: cluster.nodes[0].log_tail(20),
            });
        }
        cluster.attach_replicas().await?;
        Ok(cluster)
    }

    /// Every node: the masters as started, then the replicas.
    pub fn all_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().chain(&self.replicas)
    }

    /// Makes `replicas[i]` the replica of `nodes[i]` and waits until each
    /// replicates.
    async fn attach_replicas(&self) -> Result<(), ServerError> {
        let failed = |what: String, source: io::Error| ServerError::Io { what, source };
        for (master, replica) in self.nodes.iter().zip(&self.replicas) {
            let id = master
                .command(&["CLUSTER", "MYID"])
                .await
                .map_err(|e| failed(format!("read the node id of {}", master.addr()), e))?;
            let reply = replica
                .command(&["CLUSTER", "REPLICATE", id.trim()])
                .await
                .map_err(|e| failed(format!("make {} a replica", replica.addr()), e))?;
            expect_ok(&reply, "CLUSTER REPLICATE")?;
        }
        let deadline = Instant::now() + READY_DEADLINE;
        for replica in &self.replicas {
            let left = deadline.saturating_duration_since(Instant::now());
            if !replica.wait_for_role("slave", left).await {
                return Err(ServerError::NotReady {
                    what: format!("the Redis Cluster replica on {}", replica.addr()),
                    waited: READY_DEADLINE,
                    log_tail: replica.log_tail(20),
                });
            }
        }
        Ok(())
    }

    /// The running node that serves `key` as its slot's master (the others
    /// answer `MOVED`), if any.
    pub async fn master_of(&self, key: &str) -> Option<&RedisServer> {
        for node in self.all_nodes().filter(|n| n.pid().is_some()) {
            match node.command(&["EXISTS", key]).await {
                Ok(reply) if reply == "0" || reply == "1" => return Some(node),
                _ => {}
            }
        }
        None
    }

    /// The node that replicates `master`, as `master` reports it.
    pub async fn replica_of(&self, master: &RedisServer) -> Option<&RedisServer> {
        let info = master.command(&["INFO", "replication"]).await.ok()?;
        let port = info_field(&info, "slave0")?
            .split(',')
            .find_map(|field| field.strip_prefix("port="))?
            .parse::<u16>()
            .ok()?;
        self.all_nodes().find(|node| node.port() == port)
    }

    /// Assigns the slots and introduces the nodes to each other.
    async fn form(&self) -> Result<(), ServerError> {
        let count = self.nodes.len();
        let failed = |what: String, source: io::Error| ServerError::Io { what, source };
        for (i, node) in self.nodes.iter().enumerate() {
            let first = i * SLOTS / count;
            let last = (i + 1) * SLOTS / count - 1;
            let reply = node
                .command(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])
                .await
                .map_err(|e| failed(format!("assign slots on {}", node.addr()), e))?;
            expect_ok(&reply, "CLUSTER ADDSLOTSRANGE")?;
        }
        let first = &self.nodes[0];
        for node in self.all_nodes().skip(1) {
            let bus_port = node
                .command(&["CONFIG", "GET", "cluster-port"])
                .await
                .map_err(|e| failed(format!("read the bus port of {}", node.addr()), e))?;
            let bus_port = bus_port.split_whitespace().nth(1).unwrap_or("0").to_owned();
            let reply = first
                .command(&[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port().to_string(),
                    &bus_port,
                ])
                .await
                .map_err(|e| failed(format!("introduce {} to {}", node.addr(), first.addr()), e))?;
            expect_ok(&reply, "CLUSTER MEET")?;
        }
        Ok(())
    }

    /// Waits until every running node reports `cluster_state:ok` and knows
    /// all the others; `false` when `timeout` passed first.
    pub async fn wait_until_ok(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ok = true;
            for node in self.all_nodes().filter(|n| n.pid().is_some()) {
                let healthy = node.command(&["CLUSTER", "INFO"]).await.is_ok_and(|info| {
                    info_field(&info, "cluster_state") == Some("ok")
                        && info_field(&info, "cluster_known_nodes")
                            == Some(&*(self.nodes.len() + self.replicas.len()).to_string())
                });
                if !healthy {
                    ok = false;
                    break;
                }
            }
            if ok {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The nodes started as masters (each with pause, resume, kill and
    /// restart); after a failover one of them may be a replica.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes started as replicas, `replicas()[i]` of `nodes()[i]`
    /// (empty without [`try_start_with_replicas`](Self::try_start_with_replicas)).
    pub fn replicas(&self) -> &[RedisServer] {
        &self.replicas
    }

    /// The nodes' client ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Sends one command to the node that serves its key: tries the nodes
    /// in turn and returns the first reply that is not a `MOVED` or `ASK`
    /// redirection (for a command without a key: the first node's reply).
    /// The reply is text as in [`RedisServer::command`].
    pub async fn command(&self, args: &[&str]) -> io::Result<String> {
        let mut last = None;
        for node in self.all_nodes().filter(|n| n.pid().is_some()) {
            match node.command(args).await {
                Ok(reply) if reply.starts_with("MOVED ") || reply.starts_with("ASK ") => {
                    last = Some(Ok(reply));
                }
                other => return other,
            }
        }
        last.unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no node of the cluster is running",
            ))
        })
    }

    /// Kills every node.
    pub fn kill_all(&self) {
        for node in self.all_nodes() {
            node.kill();
        }
    }

    /// Pauses (SIGSTOP) every node.
    pub fn pause_all(&self) {
        for node in self.all_nodes() {
            node.pause();
        }
    }

    /// Resumes every node.
    pub fn resume_all(&self) {
        for node in self.all_nodes() {
            node.resume();
        }
    }
}

/// One cluster node on a free port and a free bus port.
async fn start_node() -> Result<RedisServer, ServerError> {
    let bus_port = free_port().to_string();
    RedisServer::builder()
        .arg("--cluster-enabled")
        .arg("yes")
        .arg("--cluster-config-file")
        .arg("nodes.conf")
        .arg("--cluster-node-timeout")
        .arg(NODE_TIMEOUT_MS)
        .arg("--cluster-port")
        .arg(&bus_port)
        .arg("--cluster-announce-ip")
        .arg("127.0.0.1")
        .try_start()
        .await
}

fn expect_ok(reply: &str, what: &str) -> Result<(), ServerError> {
    if reply == "OK" {
        Ok(())
    } else {
        Err(ServerError::Io {
            what: format!("form the cluster: {what}"),
            source: io::Error::other(reply.to_owned()),
        })
    }
}
