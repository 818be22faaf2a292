//! Connection settings and URL parsing: `redis://`, `rediss://`,
//! `redis+cluster://` and `redis+sentinel://`.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use lockkit_core::backend::{LeaseLock, MultiHostUrl, host_list, redact_url, timeout_param};
use lockkit_core::{LockError, Result};
use redis::{
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo,
};

use crate::backend::{RedisBackend, RedisLock};
use crate::instance::RedisInstance;
use crate::keys::DEFAULT_PREFIX;

/// Default time to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time to wait for the reply to one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a pub/sub subscription is kept after its last waiter is gone.
pub const DEFAULT_SUBSCRIPTION_LINGER: Duration = Duration::from_secs(10);
/// Default time `WAIT` may take for the replicas to acknowledge a new lock
/// (`wait_replicas` without `wait_timeout`).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// The default port of a Redis server (and of a cluster node).
const DEFAULT_PORT: u16 = 6379;
/// The default port of a Redis Sentinel.
const DEFAULT_SENTINEL_PORT: u16 = 26379;

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
/// [`RedisLockBuilder::wait_for_replicas`].
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
    pub(crate) tls_root_cert: Option<Vec<u8>>,
    pub(crate) wait: Option<ReplicaWait>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url)
            .field("mode", &self.mode())
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("subscription_linger", &self.subscription_linger)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "set"))
            .field("wait_for_replicas", &self.wait)
            .finish()
    }
}

impl RedisConfig {
    /// Parses the connection part of a `redis://`, `rediss://`,
    /// `redis+cluster://` or `redis+sentinel://` URL (see [`RedisLockBuilder`]
    /// for the parameters). `prefix` belongs to a lock, not to a connection,
    /// and is refused here.
    pub fn from_url(url: &str) -> Result<RedisConfig> {
        let (config, prefix) = parse_url(url)?;
        if prefix != DEFAULT_PREFIX {
            return Err(LockError::invalid_url(
                url,
                "prefix is an option of the lock, not of the connection",
            ));
        }
        Ok(config)
    }

    /// Sets the connect timeout.
    pub fn set_connect_timeout(&mut self, timeout: Duration) {
        self.connect_timeout = timeout;
    }

    /// Sets the per-command timeout.
    pub fn set_command_timeout(&mut self, timeout: Duration) {
        self.command_timeout = timeout;
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
        match self.topology {
            Topology::Single => "single",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
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

/// Builds a [`RedisLock`]: from a URL, then adjusted in code.
///
/// URL forms:
///
/// * `redis://[user:password@]host[:port][/db][?param=value…]`: one server;
///   `rediss://` for TLS (`#insecure` skips certificate verification).
/// * `redis+cluster://[user:password@]h1:p1,h2:p2,…[?param=value…]`: a Redis
///   Cluster, discovered from these seed nodes (any reachable one will do).
/// * `redis+sentinel://[user:password@]s1:p1,s2:p2,…/master-name[/db][?param=value…]`:
///   the master that the sentinels monitor as `master-name`, followed across
///   failovers. The credentials are those of the data nodes; the sentinels'
///   own password is the `sentinel_password` parameter.
///
/// Ports default to 6379 (26379 for sentinels); IPv6 hosts go in brackets.
/// Parameters (percent-decoded):
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | key prefix; empty for plain keys that other libraries share | `lockkit:` |
/// | `connect_timeout` | e.g. `500ms`, `2s` | 2 s |
/// | `command_timeout` | per command | 1 s |
/// | `ca_file` | PEM file of the CA that signed the server's certificate (`rediss://` only) | system roots |
/// | `protocol` | `resp2` or `resp3` for the command connection (Sentinel mode always speaks RESP3 to the master, to learn at once when the connection drops) | `resp2` |
/// | `wait_replicas` | `WAIT` for this many replicas after every grant (see [`wait_for_replicas`](Self::wait_for_replicas)) | off |
/// | `wait_timeout` | how long that `WAIT` may take | 1 s |
/// | `sentinel_password` | password of the sentinels (`redis+sentinel://` only) | none |
///
/// ```
/// use std::time::Duration;
/// use lockkit_redis::RedisLockBuilder;
///
/// let builder = RedisLockBuilder::from_url("redis://:s3cret@127.0.0.1:6379/0?prefix=app:")?
///     .command_timeout(Duration::from_millis(500));
/// assert!(!format!("{builder:?}").contains("s3cret"));
///
/// let sentinel = RedisLockBuilder::from_url(
///     "redis+sentinel://:s3cret@10.0.0.1,10.0.0.2,10.0.0.3/orders?wait_replicas=1&wait_timeout=200ms",
/// )?;
/// assert_eq!(sentinel.config().mode(), "sentinel");
/// assert_eq!(
///     sentinel.config().wait_for_replicas(),
///     Some((1, Duration::from_millis(200)))
/// );
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisLockBuilder {
    config: RedisConfig,
    prefix: String,
}

impl RedisLockBuilder {
    /// Parses a `redis://`, `rediss://`, `redis+cluster://` or
    /// `redis+sentinel://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        let (config, prefix) = parse_url(url)?;
        Ok(RedisLockBuilder { config, prefix })
    }

    /// The key prefix (default `lockkit:`). Empty: the lock key is the name itself.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How long to wait for one command's reply (default 1 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// How long a release subscription stays open after its last waiter left
    /// (default 10 s), so that hot names do not resubscribe on every wait.
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.config.subscription_linger = linger;
        self
    }

    /// Trusts this PEM-encoded CA certificate for `rediss://` instead of the system roots.
    pub fn tls_root_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.config.tls_root_cert = Some(pem.into());
        self
    }

    /// After every grant, `WAIT replicas timeout` on the connection that
    /// wrote the lock: if fewer than `replicas` replicas acknowledged the
    /// write within `timeout`, the lock is released again and the attempt
    /// fails with [`LockError::Unavailable`] ("lock written but only k of n
    /// replicas acknowledged…"). `replicas == 0` turns it off (the default).
    ///
    /// This **narrows, but does not close,** the window in which a failover
    /// loses a lock: Redis replicates asynchronously, `WAIT` does not make the
    /// write durable on the replicas (they may not have persisted it), a
    /// replica that acknowledged is not necessarily the one that gets
    /// promoted, and a lease renewed later is not waited for. It also costs a
    /// round trip to the replicas on every acquire.
    ///
    /// Acquires then run on a connection of their own (a blocked `WAIT` must
    /// not hold up renewals and releases), and a lock is never passed from one
    /// task of the client to the next without going through the server, so
    /// every grant is waited for. In Redis Cluster the `WAIT` goes to the
    /// master of the lock's slot.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.config.wait = (replicas > 0).then_some(ReplicaWait { replicas, timeout });
        self
    }

    /// The connection settings so far.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Connects (eagerly: an unreachable server gives `LockError::Unavailable`
    /// within the connect timeout) and loads the scripts.
    pub async fn connect(self) -> Result<RedisLock> {
        check_timeout("connect_timeout", self.config.connect_timeout)?;
        check_timeout("command_timeout", self.config.command_timeout)?;
        if let Some(wait) = self.config.wait {
            check_timeout("the replica wait timeout", wait.timeout)?;
        }
        let instance = RedisInstance::connect(self.config).await?;
        Ok(LeaseLock::new(RedisBackend::new(instance, self.prefix)))
    }
}

fn check_timeout(what: &str, value: Duration) -> Result<()> {
    if value.is_zero() || value > lockkit_core::backend::MAX_TIMEOUT_PARAM {
        Err(LockError::invalid_options(format!(
            "{what} {value:?} must be positive and at most one hour"
        )))
    } else {
        Ok(())
    }
}

/// Which URL form is being parsed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Single,
    Cluster,
    Sentinel,
}

/// The query parameters every URL form shares.
struct Params {
    prefix: String,
    connect_timeout: Duration,
    command_timeout: Duration,
    protocol: Option<ProtocolVersion>,
    tls_root_cert: Option<Vec<u8>>,
    wait_replicas: Option<usize>,
    wait_timeout: Option<Duration>,
    sentinel_password: Option<String>,
}

impl Params {
    fn parse<'a>(
        pairs: impl Iterator<Item = (Cow<'a, str>, Cow<'a, str>)>,
        form: Form,
        bad: &dyn Fn(String) -> LockError,
    ) -> Result<Params> {
        let mut params = Params {
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            protocol: None,
            tls_root_cert: None,
            wait_replicas: None,
            wait_timeout: None,
            sentinel_password: None,
        };
        for (key, value) in pairs {
            match &*key {
                "prefix" => params.prefix = value.into_owned(),
                "connect_timeout" => {
                    params.connect_timeout = timeout_param(&key, &value).map_err(bad)?
                }
                "command_timeout" => {
                    params.command_timeout = timeout_param(&key, &value).map_err(bad)?
                }
                "ca_file" if form == Form::Single => {
                    let pem = std::fs::read(&*value)
                        .map_err(|e| bad(format!("cannot read ca_file {value:?}: {e}")))?;
                    params.tls_root_cert = Some(pem);
                }
                "ca_file" => return Err(bad("ca_file needs a rediss:// URL".into())),
                "protocol" => {
                    params.protocol = Some(match &*value {
                        "resp2" | "2" => ProtocolVersion::RESP2,
                        "resp3" | "3" => ProtocolVersion::RESP3,
                        other => {
                            return Err(bad(format!("protocol {other:?} is not resp2 or resp3")));
                        }
                    })
                }
                "wait_replicas" => {
                    params.wait_replicas = Some(value.parse::<usize>().map_err(|_| {
                        bad(format!(
                            "wait_replicas={value:?} is not a number of replicas"
                        ))
                    })?)
                }
                "wait_timeout" => {
                    params.wait_timeout = Some(timeout_param(&key, &value).map_err(bad)?)
                }
                "sentinel_password" if form == Form::Sentinel => {
                    params.sentinel_password = Some(value.into_owned())
                }
                other => {
                    let known = match form {
                        Form::Single => {
                            "prefix, connect_timeout, command_timeout, ca_file, protocol, wait_replicas, wait_timeout"
                        }
                        Form::Cluster => {
                            "prefix, connect_timeout, command_timeout, protocol, wait_replicas, wait_timeout"
                        }
                        Form::Sentinel => {
                            "prefix, connect_timeout, command_timeout, protocol, wait_replicas, wait_timeout, sentinel_password"
                        }
                    };
                    return Err(bad(format!("unknown parameter {other:?} (known: {known})")));
                }
            }
        }
        if params.wait_timeout.is_some() && params.wait_replicas.is_none() {
            return Err(bad("wait_timeout needs wait_replicas".into()));
        }
        Ok(params)
    }

    fn wait(&self) -> Option<ReplicaWait> {
        match self.wait_replicas {
            Some(replicas) if replicas > 0 => Some(ReplicaWait {
                replicas,
                timeout: self.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT),
            }),
            _ => None,
        }
    }
}

/// `raw` without secrets: the password of the userinfo and the value of
/// `sentinel_password` replaced by `***`.
pub(crate) fn redact_secrets(raw: &str) -> String {
    let redacted = redact_url(raw);
    let Some((before, query)) = redacted.split_once('?') else {
        return redacted;
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let query = query
        .split('&')
        .map(|pair| {
            let key = pair.split_once('=').map_or(pair, |(key, _)| key);
            let decoded: String = url::form_urlencoded::parse(key.as_bytes())
                .map(|(k, _)| k.into_owned())
                .collect();
            if decoded == "sentinel_password" {
                format!("{key}=***")
            } else {
                pair.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&");
    match fragment {
        Some(fragment) => format!("{before}?{query}#{fragment}"),
        None => format!("{before}?{query}"),
    }
}

/// Parses a redis URL into connection settings and the key prefix.
pub(crate) fn parse_url(raw: &str) -> Result<(RedisConfig, String)> {
    let shown = redact_secrets(raw);
    let bad = |reason: String| LockError::invalid_url(&shown, reason);
    let scheme = raw
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("redis+cluster") => parse_multi_host(raw, shown.clone(), Form::Cluster, &bad),
        Some("redis+sentinel") => parse_multi_host(raw, shown.clone(), Form::Sentinel, &bad),
        _ => parse_single(raw, shown.clone(), &bad),
    }
}

fn parse_single(
    raw: &str,
    shown: String,
    bad: &dyn Fn(String) -> LockError,
) -> Result<(RedisConfig, String)> {
    let mut url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(bad(format!(
            "scheme {:?} is not redis://, rediss://, redis+cluster:// or redis+sentinel://",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("missing host".into()));
    }
    if url.port() == Some(0) {
        return Err(bad("port 0 is not a server's port".into()));
    }
    let params = Params::parse(url.query_pairs(), Form::Single, bad)?;
    url.set_query(None);
    if params.tls_root_cert.is_some() && url.scheme() != "rediss" {
        return Err(bad("ca_file needs a rediss:// URL".into()));
    }
    let mut info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| bad(e.to_string()))?;
    if let Some(protocol) = params.protocol {
        let settings = info.redis_settings().clone().set_protocol(protocol);
        info = info.set_redis_settings(settings);
    }
    let config = RedisConfig {
        info,
        topology: Topology::Single,
        redacted_url: shown,
        connect_timeout: params.connect_timeout,
        command_timeout: params.command_timeout,
        subscription_linger: DEFAULT_SUBSCRIPTION_LINGER,
        wait: params.wait(),
        tls_root_cert: params.tls_root_cert,
    };
    Ok((config, params.prefix))
}

fn parse_multi_host(
    raw: &str,
    shown: String,
    form: Form,
    bad: &dyn Fn(String) -> LockError,
) -> Result<(RedisConfig, String)> {
    let (scheme, default_port) = match form {
        Form::Sentinel => ("redis+sentinel", DEFAULT_SENTINEL_PORT),
        _ => ("redis+cluster", DEFAULT_PORT),
    };
    let parts = MultiHostUrl::parse(raw, scheme).map_err(bad)?;
    let decode = |part: &str| -> Result<String> {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(Cow::into_owned)
            .map_err(|_| bad("the user name, password or path is not UTF-8 once decoded".into()))
    };
    let (username, password) = match parts.userinfo {
        None => (None, None),
        Some(userinfo) => match userinfo.split_once(':') {
            Some((user, password)) => (
                Some(decode(user)?).filter(|u| !u.is_empty()),
                Some(decode(password)?),
            ),
            // A lone userinfo is a password, as redis-rs reads `redis://secret@host`.
            None => (None, Some(decode(userinfo)?)),
        },
    };
    if parts.hosts.is_empty() {
        return Err(bad("missing hosts".into()));
    }
    let hosts = host_list(parts.hosts, default_port).map_err(bad)?;
    let mut segments = parts.path.split('/').skip(1);
    let (master_name, db) = match form {
        Form::Sentinel => {
            let name = decode(segments.next().unwrap_or(""))?;
            if name.is_empty() {
                return Err(bad(
                    "missing master name: redis+sentinel://s1:p1,s2:p2/master-name".into(),
                ));
            }
            (Some(name), segments.next())
        }
        _ => (None, segments.next()),
    };
    if segments.next().is_some() {
        return Err(bad(format!("unexpected path {:?}", parts.path)));
    }
    let db = match db {
        None | Some("") => 0,
        Some(_) if form == Form::Cluster => {
            return Err(bad(
                "Redis Cluster has only database 0: remove the path".into()
            ));
        }
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| bad(format!("bad database {db:?}")))?,
    };
    let query_pairs = url::form_urlencoded::parse(parts.query.as_bytes());
    let params = Params::parse(query_pairs, form, bad)?;

    let mut settings = RedisConnectionInfo::default().set_db(db);
    if let Some(username) = &username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &password {
        settings = settings.set_password(password);
    }
    if let Some(protocol) = params.protocol {
        settings = settings.set_protocol(protocol);
    }
    let node = |(host, port): &(String, u16), settings: &RedisConnectionInfo| {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        ConnectionAddr::Tcp(host.to_owned(), *port)
            .into_connection_info()
            .map(|info| info.set_redis_settings(settings.clone()))
            .map_err(|e| bad(e.to_string()))
    };
    let nodes = hosts
        .iter()
        .map(|host| node(host, &settings))
        .collect::<Result<Vec<_>>>()?;
    let (info, topology) = match master_name {
        Some(master_name) => {
            let mut sentinel_settings = RedisConnectionInfo::default();
            if let Some(password) = &params.sentinel_password {
                sentinel_settings = sentinel_settings.set_password(password);
            }
            let sentinels = hosts
                .iter()
                .map(|host| node(host, &sentinel_settings))
                .collect::<Result<Vec<_>>>()?;
            (
                nodes[0].clone(),
                Topology::Sentinel {
                    sentinels,
                    master_name,
                },
            )
        }
        None => (nodes[0].clone(), Topology::Cluster { nodes }),
    };
    let config = RedisConfig {
        info,
        topology,
        redacted_url: shown,
        connect_timeout: params.connect_timeout,
        command_timeout: params.command_timeout,
        subscription_linger: DEFAULT_SUBSCRIPTION_LINGER,
        wait: params.wait(),
        tls_root_cert: None,
    };
    Ok((config, params.prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_parameters() {
        let (config, prefix) = parse_url(
            "redis://u:pw@127.0.0.1:7000/3?prefix=a%3Ab&connect_timeout=250ms&command_timeout=2s",
        )
        .unwrap();
        assert_eq!(prefix, "a:b");
        assert_eq!(config.connect_timeout, Duration::from_millis(250));
        assert_eq!(config.command_timeout, Duration::from_secs(2));
        assert_eq!(config.address(), "127.0.0.1:7000");
        assert_eq!(config.info.redis_settings().db(), 3);
        assert_eq!(config.info.redis_settings().password(), Some("pw"));
        assert!(!format!("{config:?}").contains("pw@"));
        assert_eq!(config.mode(), "single");
        assert_eq!(config.wait, None);
        assert_eq!(parse_url("redis://h?prefix=").unwrap().1, "");
        assert_eq!(parse_url("redis://h").unwrap().1, DEFAULT_PREFIX);
        let (config, _) = parse_url("redis://h?protocol=resp3").unwrap();
        assert_eq!(
            config.info.redis_settings().protocol(),
            ProtocolVersion::RESP3
        );
    }

    #[test]
    fn parses_wait_parameters() {
        let (config, _) = parse_url("redis://h?wait_replicas=2&wait_timeout=250ms").unwrap();
        assert_eq!(
            config.wait_for_replicas(),
            Some((2, Duration::from_millis(250)))
        );
        let (config, _) = parse_url("redis://h?wait_replicas=1").unwrap();
        assert_eq!(config.wait_for_replicas(), Some((1, DEFAULT_WAIT_TIMEOUT)));
        let (config, _) = parse_url("redis://h?wait_replicas=0").unwrap();
        assert_eq!(config.wait_for_replicas(), None);
        let (config, _) =
            parse_url("redis+sentinel://a,b/m?wait_replicas=1&wait_timeout=1s").unwrap();
        assert_eq!(
            config.wait_for_replicas(),
            Some((1, Duration::from_secs(1)))
        );
        let (config, _) = parse_url("redis+cluster://a:1,b:2?wait_replicas=1").unwrap();
        assert_eq!(config.wait_for_replicas(), Some((1, DEFAULT_WAIT_TIMEOUT)));
    }

    #[test]
    fn parses_cluster_urls() {
        let (config, prefix) = parse_url(
            "redis+cluster://u:p%40w@127.0.0.1:7000,127.0.0.1:7001,[::1]:7002,other?prefix=x:&command_timeout=300ms",
        )
        .unwrap();
        assert_eq!(prefix, "x:");
        assert_eq!(config.mode(), "cluster");
        assert_eq!(
            config.address(),
            "127.0.0.1:7000,127.0.0.1:7001,::1:7002,other:6379"
        );
        assert_eq!(config.command_timeout, Duration::from_millis(300));
        let Topology::Cluster { nodes } = &config.topology else {
            panic!("not a cluster")
        };
        for node in nodes {
            assert_eq!(node.redis_settings().username(), Some("u"));
            assert_eq!(node.redis_settings().password(), Some("p@w"));
        }
        assert!(!format!("{config:?}").contains("p%40w"));
        assert!(parse_url("REDIS+CLUSTER://a:1/").is_ok());
    }

    #[test]
    fn parses_sentinel_urls() {
        let (config, prefix) = parse_url(
            "redis+sentinel://:datapw@s1,s2:26380,s3:26381/my%20master/2?sentinel_password=sentpw&connect_timeout=1s",
        )
        .unwrap();
        assert_eq!(prefix, DEFAULT_PREFIX);
        assert_eq!(config.mode(), "sentinel");
        assert_eq!(config.address(), "my master@s1:26379,s2:26380,s3:26381");
        assert_eq!(config.info.redis_settings().password(), Some("datapw"));
        assert_eq!(config.info.redis_settings().db(), 2);
        let Topology::Sentinel {
            sentinels,
            master_name,
        } = &config.topology
        else {
            panic!("not sentinel")
        };
        assert_eq!(master_name, "my master");
        assert_eq!(sentinels.len(), 3);
        assert_eq!(sentinels[0].redis_settings().password(), Some("sentpw"));
        let shown = format!("{config:?} {}", config.redacted_url());
        assert!(
            !shown.contains("datapw") && !shown.contains("sentpw"),
            "{shown}"
        );
    }

    #[test]
    fn redacts_the_sentinel_password() {
        assert_eq!(
            redact_secrets("redis+sentinel://:pw@a,b/m?x=1&sentinel_password=spw&y=2#f"),
            "redis+sentinel://:***@a,b/m?x=1&sentinel_password=***&y=2#f"
        );
        assert_eq!(
            redact_secrets("redis+sentinel://a/m?sentinel%5Fpassword=spw"),
            "redis+sentinel://a/m?sentinel%5Fpassword=***"
        );
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "redis://:topsecret@h:99999",
            "redis://:topsecret@h:0",
            "redis://:topsecret@h/notanumber",
            "redis://:topsecret@h?prefx=a",
            "redis://:topsecret@h?connect_timeout=soon",
            "redis://:topsecret@h?connect_timeout=0s",
            "redis://:topsecret@h?command_timeout=100000h",
            "redis://:topsecret@h?protocol=resp9",
            "redis://:topsecret@h?ca_file=/nonexistent.pem",
            "redis://:topsecret@h?wait_replicas=many",
            "redis://:topsecret@h?wait_replicas=-1",
            "redis://:topsecret@h?wait_timeout=1s",
            "redis://:topsecret@h?wait_replicas=1&wait_timeout=0s",
            "redis://:topsecret@h?sentinel_password=topsecret",
            "redis://:topsecret@",
            "http://:topsecret@h",
            "redis//:topsecret@h",
            "redis+cluster://:topsecret@",
            "redis+cluster://:topsecret@/",
            "redis+cluster://:topsecret@a:1,,b:2",
            "redis+cluster://:topsecret@a:1,a:1",
            "redis+cluster://:topsecret@a:0",
            "redis+cluster://:topsecret@a:65536",
            "redis+cluster://:topsecret@a:1/2",
            "redis+cluster://:topsecret@a:1?ca_file=/etc/hosts",
            "redis+cluster://:topsecret@a:1?sentinel_password=topsecret",
            "redis+cluster://:topsecret@a:1?prefx=a",
            "redis+cluster://:topsecret@a:1#frag",
            "redis+sentinel://:topsecret@h:1",
            "redis+sentinel://:topsecret@h:1/",
            "redis+sentinel://:topsecret@/m",
            "redis+sentinel://:topsecret@h:0/m",
            "redis+sentinel://:topsecret@h:1/m/x",
            "redis+sentinel://:topsecret@h:1/m/1/2",
            "redis+sentinel://:topsecret@h:1/m?sentinel_password=topsecret&bogus=1",
            "redis+sentinel://:topsecret@h:1/m?sentinel_password=topsecret&wait_timeout=1s",
            "redis+sentinel://:topsecret@h:1/%FF",
        ] {
            let err = parse_url(bad).map(|_| ()).unwrap_err();
            assert!(matches!(err, LockError::InvalidUrl { .. }), "{bad}: {err}");
            let text = format!("{err} {err:?}");
            assert!(!text.contains("topsecret"), "{text}");
        }
    }
}
