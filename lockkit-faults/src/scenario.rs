//! The fault scenarios: what is done to whom, and when.

use std::fmt;
use std::time::Duration;

use lockkit_testkit::ServerProcess;

use lockkit_testkit::catalog::{Deployment, StartOptions};

use crate::deploy::Testbed;
use crate::record::Micros;
use crate::resource::Resource;

/// A fault scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// The holder is frozen (SIGSTOP) for 2.5 leases, then continued: the
    /// classic GC pause past the TTL.
    HolderPaused,
    /// The holder is SIGKILLed in its critical section.
    HolderKilled,
    /// Every server is SIGKILLed, and restarted one lease later.
    ServerKilled,
    /// Every server is frozen for 2.5 leases, then continued.
    ServerPaused,
    /// The holder is cut off from every server (its proxies blackhole) for
    /// 2.5 leases, then healed. On ZooKeeper: session expiry.
    Partition,
    /// The SQL server kills every client connection; for etcd, every
    /// worker's proxy resets its connections.
    ConnectionKilled,
    /// Redlock, etcd cluster: one of three masters (members) is killed for
    /// two leases and restarted (Redlock's empty, etcd's with its data),
    /// then two of three.
    MinorityThenMajority,
    /// ZooKeeper ensemble, etcd cluster: the leader is killed, and
    /// restarted two leases later.
    LeaderKilled,
    /// A cluster of three: the holder is cut off (its proxies blackhole)
    /// from one member for two leases, then healed, then from two members
    /// for two leases. The members still reach each other: the holder can
    /// only talk to the cluster through the members it still reaches.
    MembersPartitioned,
    /// A server's wall clock leaps forward by three leases (more than a
    /// lease) while a lock is held, stays there for two leases, then jumps
    /// back. One server of a single-server deployment; on Redlock one master
    /// of three, and then Kleppmann's case: the holder is cut off from a
    /// second master (its key there runs out) before the first one's clock
    /// leaps. Servers whose clock can be moved (see
    /// `lockkit_testkit::ServerClock`): Redis, ZooKeeper, PostgreSQL, MariaDB.
    ClockJump,
    /// Servers in network namespaces of the suite's making, cut off from
    /// each other while the workers still reach them. Redis Sentinel: the
    /// master is cut off from its replica and the sentinels until the
    /// replica is promoted, and two leases more. A ZooKeeper ensemble or an
    /// etcd cluster: the
    /// holder is cut off (its proxies blackhole) from every member but the
    /// leader, then the leader is cut off from the other members for 2.5
    /// leases while the holder still reaches it, then both are healed.
    /// Jepsen's partitions between servers, and CURATOR-206's two holders
    /// after a session expiry.
    ServerPartition,
    /// Redis Sentinel, Redis Cluster with replicas: replication to the
    /// replica is cut, a lock is granted on the master meanwhile (if the
    /// backend grants one), the master is killed before that grant reaches
    /// the replica, and the sentinels (the cluster's other masters) promote
    /// the replica.
    Failover,
}

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 12] = [
        Scenario::HolderPaused,
        Scenario::HolderKilled,
        Scenario::ServerKilled,
        Scenario::ServerPaused,
        Scenario::Partition,
        Scenario::ConnectionKilled,
        Scenario::MinorityThenMajority,
        Scenario::LeaderKilled,
        Scenario::MembersPartitioned,
        Scenario::ClockJump,
        Scenario::ServerPartition,
        Scenario::Failover,
    ];

    /// The name used on the command line and in the report.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::HolderPaused => "holder-paused",
            Scenario::HolderKilled => "holder-killed",
            Scenario::ServerKilled => "server-killed",
            Scenario::ServerPaused => "server-paused",
            Scenario::Partition => "partition",
            Scenario::ConnectionKilled => "connection-killed",
            Scenario::MinorityThenMajority => "minority-then-majority",
            Scenario::LeaderKilled => "leader-killed",
            Scenario::MembersPartitioned => "members-partitioned",
            Scenario::ClockJump => "clock-jump",
            Scenario::ServerPartition => "server-partition",
            Scenario::Failover => "failover",
        }
    }

    /// The lease for this scenario, from the suite's `base` lease. A failover
    /// takes seconds (the sentinels' down-after time, an election, the
    /// promotion): a lock lost in it only matters to a lease longer than
    /// that, as leases in production are.
    pub fn lease(self, base: Duration) -> Duration {
        match self {
            Scenario::Failover => (base * 4).max(Duration::from_secs(4)),
            _ => base,
        }
    }

    /// How long the workers' critical sections last. Longer than the lease
    /// where the fault hits the lock's renewal (a partition, a server
    /// fault): a long job, kept alive by the watchdog, is what such a fault
    /// puts at risk. Shorter where the holder itself is frozen or killed.
    pub fn hold(self, lease: Duration) -> Duration {
        match self {
            Scenario::HolderPaused | Scenario::HolderKilled => lease.mul_f64(0.4),
            _ => lease.mul_f64(1.2),
        }
    }

    /// How long the holder is frozen or cut off, in the scenarios that do
    /// that to it.
    pub fn pause(lease: Duration) -> Duration {
        scaled(lease, 2.5)
    }

    /// The lock delay of this scenario's extra run on `deployment`, if it
    /// has one: twice the pause, on the unfenced (Redlock) and the plain
    /// Redis deployment, for the faults whose late writes a lock delay is
    /// meant to keep out (a frozen holder, a cut-off one).
    pub fn compared_lock_delay(self, deployment: Deployment, base: Duration) -> Option<Duration> {
        let compared = matches!(deployment, Deployment::Redis | Deployment::Redlock3)
            && matches!(self, Scenario::HolderPaused | Scenario::Partition);
        compared.then(|| Self::pause(self.lease(base)) * 2)
    }

    /// How the scenario needs its servers started: with wall clocks it
    /// can move, or in network namespaces it can cut apart.
    pub fn servers(self) -> StartOptions {
        StartOptions {
            shiftable_clocks: self == Scenario::ClockJump,
            namespaces: self == Scenario::ServerPartition,
        }
    }

    /// How far a clock jump moves a server's clock: more than a lease.
    pub fn clock_jump(lease: Duration) -> Duration {
        lease * 3
    }

    /// The scenario with this label.
    pub fn from_label(label: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.label() == label)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// What a scenario acts on.
pub struct Stage<'a> {
    /// The servers and proxies.
    pub deployment: &'a Testbed,
    /// The resource, which also records the faults.
    pub resource: &'a Resource,
    /// The worker processes, by client number.
    pub workers: &'a mut [ServerProcess],
    /// The lease length.
    pub lease: Duration,
    /// The workers' lock name.
    pub lock_name: &'a str,
}

impl fmt::Debug for Stage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("deployment", self.deployment)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Stage<'_> {
    /// Waits for the next critical section to start: its worker, the holder.
    async fn holder(&self) -> Result<u32, String> {
        let timeout = self.lease * 5;
        self.resource
            .next_section_start(timeout)
            .await
            .ok_or_else(|| format!("no critical section started within {timeout:?}"))
    }

    /// Waits for a critical section of worker `client` granted after
    /// `after` to start.
    async fn section_of(&self, client: u32, after: Micros) -> Result<(), String> {
        let timeout = self.lease * 20;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.resource.next_section_granted_after(after, left).await {
                Some(holder) if holder == client => return Ok(()),
                Some(_) => {}
                None => {
                    return Err(format!(
                        "worker {client} started no critical section within {timeout:?}"
                    ));
                }
            }
        }
    }

    /// Records a fault `label` injected from `start` until now.
    fn fault(&self, label: impl Into<String>, start: Micros) {
        self.resource.fault(label, start);
    }

    fn worker(&mut self, client: u32) -> &mut ServerProcess {
        &mut self.workers[client as usize]
    }

    /// Pauses (or resumes) every worker but `client`.
    fn pause_others(&mut self, client: u32, pause: bool) -> Result<(), String> {
        self.workers
            .iter_mut()
            .enumerate()
            .filter(|(index, _)| *index != client as usize)
            .try_for_each(|(_, worker)| {
                if pause {
                    worker.pause()
                } else {
                    worker.resume()
                }
            })
            .map_err(|e| e.to_string())
    }

    fn each_server(&self, mut action: impl FnMut(usize)) {
        (0..self.deployment.server_count()).for_each(&mut action);
    }

    /// Moves the wall clock of the servers `indexes` by `offset` (`None`:
    /// back to the machine's).
    fn shift_clocks(&self, indexes: &[usize], offset: Option<Duration>) -> Result<(), String> {
        indexes
            .iter()
            .try_for_each(|&index| self.deployment.shift_clock(index, offset))
    }

    /// One clock jump of the servers `indexes`, while a section runs: the
    /// leap, two leases, the jump back.
    async fn clock_jump(&self, indexes: &[usize], what: &str) -> Result<(), String> {
        let jump = Scenario::clock_jump(self.lease);
        let start = self.resource.now();
        self.shift_clocks(indexes, Some(jump))?;
        tokio::time::sleep(scaled(self.lease, 2.0)).await;
        self.shift_clocks(indexes, None)?;
        self.fault(
            format!(
                "{what} clock +{}, then back",
                humantime::format_duration(jump)
            ),
            start,
        );
        Ok(())
    }

    async fn restart(&self, indexes: impl IntoIterator<Item = usize>) -> Result<(), String> {
        for index in indexes {
            self.deployment.restart(index).await?;
        }
        self.deployment.settle(SETTLE_TIMEOUT).await
    }
}

/// How long a restarted deployment gets to serve again.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the sentinels get to promote the replica.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

fn scaled(lease: Duration, factor: f64) -> Duration {
    lease.mul_f64(factor)
}

impl Scenario {
    /// Injects the scenario's faults (recording each), healing them before
    /// it returns.
    pub async fn inject(self, stage: &mut Stage<'_>) -> Result<(), String> {
        let lease = stage.lease;
        match self {
            Scenario::HolderPaused => {
                let holder = stage.holder().await?;
                let start = stage.resource.now();
                stage.worker(holder).pause().map_err(|e| e.to_string())?;
                tokio::time::sleep(Scenario::pause(lease)).await;
                stage.worker(holder).resume().map_err(|e| e.to_string())?;
                stage.fault(format!("worker {holder} paused"), start);
            }
            Scenario::HolderKilled => {
                let holder = stage.holder().await?;
                let start = stage.resource.now();
                stage.worker(holder).kill();
                stage.fault(format!("worker {holder} killed"), start);
            }
            Scenario::ServerKilled => {
                stage.holder().await?;
                let start = stage.resource.now();
                stage.each_server(|i| stage.deployment.kill(i));
                tokio::time::sleep(lease).await;
                stage.restart(0..stage.deployment.server_count()).await?;
                stage.fault("server killed, restarted", start);
            }
            Scenario::ServerPaused => {
                stage.holder().await?;
                let start = stage.resource.now();
                stage.each_server(|i| stage.deployment.pause(i));
                tokio::time::sleep(scaled(lease, 2.5)).await;
                stage.each_server(|i| stage.deployment.resume(i));
                stage.fault("server paused", start);
            }
            Scenario::Partition => {
                let holder = stage.holder().await?;
                let start = stage.resource.now();
                stage.deployment.partition(holder, true)?;
                tokio::time::sleep(Scenario::pause(lease)).await;
                stage.deployment.partition(holder, false)?;
                stage.fault(format!("worker {holder} partitioned"), start);
            }
            Scenario::ConnectionKilled => {
                stage.holder().await?;
                let start = stage.resource.now();
                let killed = stage.deployment.kill_connections().await?;
                stage.fault(format!("{killed} connections killed"), start);
            }
            Scenario::MinorityThenMajority => {
                stage.holder().await?;
                let start = stage.resource.now();
                stage.deployment.kill(0);
                tokio::time::sleep(scaled(lease, 2.0)).await;
                stage.restart([0]).await?;
                stage.fault("1 of 3 killed", start);
                tokio::time::sleep(lease).await;
                stage.holder().await?;
                let start = stage.resource.now();
                stage.deployment.kill(0);
                stage.deployment.kill(1);
                tokio::time::sleep(scaled(lease, 2.0)).await;
                stage.restart([0, 1]).await?;
                stage.fault("2 of 3 killed", start);
            }
            Scenario::MembersPartitioned => {
                for cut in [1, 2] {
                    let holder = stage.holder().await?;
                    let start = stage.resource.now();
                    stage.deployment.partition_from(holder, 0..cut, true)?;
                    tokio::time::sleep(scaled(lease, 2.0)).await;
                    stage.deployment.partition_from(holder, 0..cut, false)?;
                    stage.fault(
                        format!("worker {holder} cut from {cut} of 3 members"),
                        start,
                    );
                    tokio::time::sleep(lease).await;
                }
            }
            Scenario::LeaderKilled => {
                stage.holder().await?;
                let leader = stage
                    .deployment
                    .leader()
                    .await
                    .ok_or("the cluster has no leader")?;
                let start = stage.resource.now();
                stage.deployment.kill(leader);
                tokio::time::sleep(scaled(lease, 2.0)).await;
                stage.restart([leader]).await?;
                stage.fault(format!("leader (server {leader}) killed"), start);
            }
            Scenario::ClockJump if stage.deployment.server_count() == 3 => {
                // Redlock: one master's clock leaps; the holder's keys on
                // the other two still stand in the way of a majority.
                stage.holder().await?;
                stage.clock_jump(&[0], "master 0").await?;
                tokio::time::sleep(lease).await;
                // Kleppmann's case: a worker that cannot reach master 2
                // takes the lock on a bare majority (0 and 1); then master
                // 0's clock leaps, its key there is gone, and masters 0 and
                // 2 are free for another worker's majority.
                // The other workers stand still until it has: racing them
                // with one master out of reach, it can starve for longer
                // than the scenario waits on a loaded machine.
                let holder = stage.holder().await?;
                let start = stage.resource.now();
                stage.deployment.partition_from(holder, [2], true)?;
                stage.pause_others(holder, true)?;
                let granted = stage.section_of(holder, start).await;
                stage.pause_others(holder, false)?;
                if granted.is_ok() {
                    stage.clock_jump(&[0], "master 0").await?;
                }
                stage.deployment.partition_from(holder, [2], false)?;
                stage.fault(
                    format!("worker {holder} cut from master 2, the others paused until it held"),
                    start,
                );
                granted?;
            }
            Scenario::ClockJump => {
                stage.holder().await?;
                let all: Vec<usize> = (0..stage.deployment.server_count()).collect();
                stage.clock_jump(&all, "server").await?;
            }
            Scenario::ServerPartition if stage.deployment.is_sentinel() => {
                // The master (namespace 0) cut off from its replica and the
                // sentinels, while the workers still reach it and write to
                // it; the sentinels promote the replica.
                stage.holder().await?;
                let start = stage.resource.now();
                stage.deployment.cut_servers(0, true)?;
                let promoted = stage.deployment.wait_for_promotion(FAILOVER_TIMEOUT).await;
                if promoted.is_ok() {
                    tokio::time::sleep(scaled(lease, 2.0)).await;
                }
                stage.deployment.cut_servers(0, false)?;
                stage.fault(
                    "master cut off from its replica and the sentinels, the replica promoted",
                    start,
                );
                promoted?;
                // Healed, the old master becomes the new one's replica, and
                // grants that wait for a replica can be acknowledged again.
                stage.deployment.demote_old_master(FAILOVER_TIMEOUT).await?;
            }
            Scenario::ServerPartition => {
                let holder = stage.holder().await?;
                let leader = stage
                    .deployment
                    .leader()
                    .await
                    .ok_or("the cluster has no leader")?;
                let others: Vec<usize> = (0..stage.deployment.server_count())
                    .filter(|&i| i != leader)
                    .collect();
                let start = stage.resource.now();
                stage
                    .deployment
                    .partition_from(holder, others.iter().copied(), true)?;
                stage.deployment.cut_servers(leader, true)?;
                tokio::time::sleep(Scenario::pause(lease)).await;
                stage.deployment.cut_servers(leader, false)?;
                stage.deployment.partition_from(holder, others, false)?;
                stage.fault(
                    format!("leader (server {leader}) cut off from the others; worker {holder} reaches only it"),
                    start,
                );
            }
            Scenario::Failover => {
                // Cut replication while a section runs, so that the next
                // grant is made (or refused) while the replica is cut off.
                stage.holder().await?;
                let start = stage.resource.now();
                let cut = stage.deployment.cut_replication_of(stage.lock_name).await?;
                let granted = stage
                    .resource
                    .next_section_granted_after(start, lease * 2)
                    .await;
                stage.deployment.fail_over(cut, FAILOVER_TIMEOUT).await?;
                stage.fault(
                    format!(
                        "replication cut, {}, master killed, replica promoted",
                        if granted.is_some() {
                            "lock granted meanwhile"
                        } else {
                            "no grant meanwhile"
                        }
                    ),
                    start,
                );
            }
        }
        Ok(())
    }
}

/// The deployments of the suite, in report order: those that some scenario
/// applies to.
pub fn suite() -> Vec<Deployment> {
    Deployment::ALL
        .iter()
        .copied()
        .filter(|&d| !scenarios_for(d).is_empty())
        .collect()
}

/// The faults of a single server and its clients, the first six of
/// [`Scenario::ALL`]: the first five apply to every server, the connection
/// kill to those that can kill their clients' connections.
const ONE_SERVER: &[Scenario] = Scenario::ALL.split_at(6).0;

/// The scenarios that apply to `deployment`.
pub fn scenarios_for(deployment: Deployment) -> &'static [Scenario] {
    use Scenario::*;
    match deployment {
        Deployment::Redis | Deployment::Zk => &[
            HolderPaused,
            HolderKilled,
            ServerKilled,
            ServerPaused,
            Partition,
            ClockJump,
        ],
        Deployment::RedisAof => &[ServerKilled],
        Deployment::Redlock3 => &[
            HolderPaused,
            HolderKilled,
            Partition,
            MinorityThenMajority,
            ClockJump,
        ],
        Deployment::ZkEnsemble => &[HolderPaused, Partition, LeaderKilled, ServerPartition],
        // The lease modes expire by the server's clock; the session modes
        // (row, advisory, named) by their connection, not by a clock.
        Deployment::PgLease | Deployment::MariaDbLease => &[
            HolderPaused,
            HolderKilled,
            ServerKilled,
            ServerPaused,
            Partition,
            ConnectionKilled,
            ClockJump,
        ],
        // etcd (Go) reads its clock without libc: it cannot be moved.
        Deployment::PgRow
        | Deployment::PgAdvisory
        | Deployment::MariaDbRow
        | Deployment::MariaDbNamed
        | Deployment::Etcd => ONE_SERVER,
        // The cluster and sentinel clients learn the servers' addresses
        // from the servers, so a per-worker proxy cannot sit in between:
        // no partition scenario for them.
        Deployment::RedisCluster => &[HolderPaused, HolderKilled, ServerKilled],
        Deployment::RedisSentinel | Deployment::RedisSentinelWait => {
            &[HolderPaused, ServerPartition, Failover]
        }
        Deployment::RedisClusterReplicas | Deployment::RedisClusterReplicasWait => {
            &[HolderPaused, Failover]
        }
        Deployment::EtcdCluster => &[
            HolderPaused,
            Partition,
            LeaderKilled,
            MinorityThenMajority,
            MembersPartitioned,
            ServerPartition,
        ],
        // In-process and single-file deployments have no server to fault;
        // Redlock runs on three masters (five adds run time, not cases).
        Deployment::Memory | Deployment::SqliteLease | Deployment::Redlock5 => &[],
    }
}
