//! Test support for lockkit (not published).
//!
//! * Real servers as child processes on free loopback ports, in temporary
//!   directories, killed when dropped and when the test process dies:
//!   [`RedisServer`], [`ZkServer`] and a quorum of them, [`ZkEnsemble`].
//! * Redis deployments built from them: a [`RedisCluster`] of N masters, and
//!   [`RedisSentinels`] (a master, a replica that replicates through a
//!   [`TcpProxy`], and three sentinels) for failover tests.
//! * etcd the same way: [`EtcdServer`] and a quorum of them,
//!   [`EtcdCluster`], with `etcdctl` for interop tests.
//! * SQL servers the same way: [`PostgresServer`] and [`MariaDbServer`],
//!   each started from a copy of a template data directory built once per
//!   machine (so a start takes a fraction of a second).
//! * Fault injection on them: pause (SIGSTOP), resume, kill, restart; a
//!   wall clock that leaps ([`ServerClock`], on servers built with one); and
//!   on the network between client and server, a [`TcpProxy`] that delays,
//!   blackholes (partitions) and resets connections; between servers, a
//!   [`Fabric`] of network namespaces whose links can be cut.
//! * Client processes the same way: [`ServerProcess::spawn`] runs any
//!   command (the fault suite's workers) dying with the test process, and
//!   its [`pause`](ServerProcess::pause) freezes a *client* (SIGSTOP), the
//!   GC pause of the fencing literature.
//! * [`stamp`]: the first line of every generated report (command, date,
//!   commit, machine).
//! * [`catalog`]: the deployments the benchmarks and the fault suite run on
//!   (name, servers to start, lockkit URL), in one place.
//! * [`TestServer`] and [`FaultControl`], the two traits every server above
//!   implements, and [`DisposableServer`], the generic disposable server of
//!   the conformance suite (re-exported here as [`conformance`]; its own
//!   crate is `lockkit-conformance`, which a third-party backend can run).
//!
//! A missing server binary is a loud failure that says how to install it
//! (`scripts/install-services.sh`), never a silent skip.

pub mod catalog;
mod certs;
mod clock;
mod curator_peer;
mod disposable;
mod etcd_server;
mod mariadb_server;
mod netns;
mod poll;
mod postgres_server;
mod process;
mod proxy;
mod python_peer;
mod redis_cluster;
mod redis_resp;
mod redis_sentinel;
mod redis_server;
mod server;
pub mod stamp;
pub mod waiter;
mod zk_server;

pub use certs::TestCerts;
pub use clock::ServerClock;
pub use curator_peer::CuratorPeer;
pub use disposable::{DisposableServer, ServerGroup};
pub use etcd_server::{EtcdCluster, EtcdServer, EtcdServerTls};
/// The conformance suite (the `lockkit-conformance` crate), re-exported.
pub use lockkit_conformance as conformance;
pub use lockkit_conformance::{Probe, spawn_contenders};
pub use mariadb_server::{MariaDbServer, MariaDbServerBuilder};
pub use netns::Fabric;
pub use poll::eventually;
pub use postgres_server::{PostgresServer, PostgresServerBuilder};
pub use process::{ClosedPort, ProcessSlot, ServerError, ServerProcess, free_port};
pub use proxy::TcpProxy;
pub use python_peer::{PythonPeer, assert_mutual_exclusion_with};
pub use redis_cluster::RedisCluster;
pub use redis_resp::{command_stat, info_field};
pub use redis_sentinel::{RedisSentinel, RedisSentinels};
pub use redis_server::{RedisServer, RedisServerBuilder};
pub use server::{FaultControl, TestServer};
pub use zk_server::{ZkEnsemble, ZkServer, ZkServerBuilder};
