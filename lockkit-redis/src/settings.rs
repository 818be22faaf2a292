//! The resolved settings of a connection to one Redis deployment, as the
//! URL parser or the builder left them; the client (`instance`) reads them.

use std::fmt;
use std::time::Duration;

use redis::ConnectionInfo;

/// Default time to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time to wait for the reply to one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a pub/sub subscription is kept after its last waiter is gone.
pub const DEFAULT_SUBSCRIPTION_LINGER: Duration = Duration::from_secs(10);
/// Default time `WAIT` may take for the replicas to acknowledge a new lock
/// (`wait_replicas` without `wait_timeout`).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// How a client reaches its servers: the kind of [`Topology`], kept by a
/// connected instance that no longer needs the addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// One server.
    Single,
    /// A Redis Cluster.
    Cluster,
    /// The master Sentinel names.
    Sentinel,
}

impl Reach {
    /// `"single"`, `"cluster"` or `"sentinel"`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reach::Single => "single",
            Reach::Cluster => "cluster",
            Reach::Sentinel => "sentinel",
        }
    }
}

/// How the server that holds the locks is reached.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server: `RedisConfig::info`.
    Single,
    /// A Redis Cluster, discovered from these seed nodes (with the
    /// credentials of `RedisConfig::info`).
    Cluster {
        /// The seed nodes.
        nodes: Vec<ConnectionInfo>,
    },
    /// The master that these sentinels name; `RedisConfig::info` holds the
    /// credentials, database and protocol for the data nodes.
    Sentinel {
        /// The sentinels, with the sentinels' own credentials.
        sentinels: Vec<ConnectionInfo>,
        /// The name the sentinels monitor the master under.
        master_name: String,
    },
}

/// `WAIT replicas timeout` after every grant; see
/// [`RedisLockBuilder::wait_for_replicas`](crate::RedisLockBuilder::wait_for_replicas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    /// How many replicas must acknowledge.
    pub(crate) replicas: usize,
    /// How long `WAIT` may block.
    pub(crate) timeout: Duration,
}

/// Settings of the connection to one Redis deployment: a single server, a
/// Redis Cluster or a Sentinel-monitored master. `Debug` hides the passwords.
#[derive(Clone)]
pub struct RedisConfig {
    /// The single server; for Cluster and Sentinel the template of every data
    /// node's connection (credentials, database, protocol) with the first
    /// host's address.
    pub(crate) info: ConnectionInfo,
    pub(crate) topology: Topology,
    pub(crate) redacted_url: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) subscription_linger: Duration,
    /// How long a release reserves the lock for the first client in line.
    pub(crate) turn: Duration,
    /// Whether waiting clients queue in a line per lock (see `Keys::line`).
    pub(crate) line: bool,
    pub(crate) tls_root_cert: Option<Vec<u8>>,
    pub(crate) wait: Option<ReplicaWait>,
    /// Whether single commands may take a direct connection beside the
    /// multiplexed one (one server over plain TCP with RESP2 only).
    pub(crate) direct: bool,
    /// Redis Cluster: announce releases with sharded pub/sub (`Some(true)`),
    /// with `PUBLISH` (`Some(false)`), or sharded where the servers have it
    /// (`None`).
    pub(crate) sharded_pubsub: Option<bool>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url)
            .field("mode", &self.mode())
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("subscription_linger", &self.subscription_linger)
            .field("turn", &self.turn)
            .field("line", &self.line)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "set"))
            .field("wait_for_replicas", &self.wait)
            .field("direct", &self.direct)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .finish()
    }
}

impl RedisConfig {
    /// The same settings, with waiting clients not queued in a line per
    /// lock (see [`Keys::line`](crate::Keys::line)): every release is
    /// published to every waiting client, and the fastest takes the lock.
    /// The line is what keeps a handoff's cost flat as waiters add up, and
    /// what stops a holder that releases and asks again at once from taking
    /// the lock straight back; without it, both depend on who is fastest.
    pub fn without_line(mut self) -> Self {
        self.line = false;
        self
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The per-command timeout.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The server address as `host:port`; for Redis Cluster the seed nodes
    /// (`h1:p1,h2:p2`), for Sentinel `master-name@s1:p1,s2:p2` (never with
    /// credentials).
    pub fn address(&self) -> String {
        match &self.topology {
            Topology::Single => self.info.addr().to_string(),
            Topology::Cluster { nodes } => join_addresses(nodes),
            Topology::Sentinel {
                sentinels,
                master_name,
            } => format!("{master_name}@{}", join_addresses(sentinels)),
        }
    }

    /// `"single"`, `"cluster"` or `"sentinel"`: how the servers are reached.
    pub fn mode(&self) -> &'static str {
        self.reach().name()
    }

    /// How the servers are reached, without the addresses.
    pub(crate) fn reach(&self) -> Reach {
        match self.topology {
            Topology::Single => Reach::Single,
            Topology::Cluster { .. } => Reach::Cluster,
            Topology::Sentinel { .. } => Reach::Sentinel,
        }
    }

    /// The URL with its passwords replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }

    /// The `WAIT` after every grant, if set: how many replicas must
    /// acknowledge, and how long to wait for them.
    pub fn wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.wait.map(|w| (w.replicas, w.timeout))
    }
}

fn join_addresses(infos: &[ConnectionInfo]) -> String {
    infos
        .iter()
        .map(|info| info.addr().to_string())
        .collect::<Vec<_>>()
        .join(",")
}
