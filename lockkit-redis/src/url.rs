//! URL parsing: `redis://`, `rediss://`, `redis+cluster://` and
//! `redis+sentinel://` into [`RedisConfig`] and the key prefix.

use std::borrow::Cow;
use std::time::Duration;

use lockkit_core::backend::{MultiHostUrl, bool_param, host_list, redact_url, timeout_param};
use lockkit_core::{LockError, Result};
use redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo};

use crate::keys::{DEFAULT_PREFIX, TURN};
use crate::settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SUBSCRIPTION_LINGER,
    DEFAULT_WAIT_TIMEOUT, RedisConfig, ReplicaWait, Topology,
};

/// The default port of a Redis server (and of a cluster node).
const DEFAULT_PORT: u16 = 6379;
/// The default port of a Redis Sentinel.
const DEFAULT_SENTINEL_PORT: u16 = 26379;

impl RedisConfig {
    /// Parses the connection part of a `redis://`, `rediss://`,
    /// `redis+cluster://` or `redis+sentinel://` URL (see [`RedisLockBuilder`](crate::RedisLockBuilder)
    /// for the parameters). `prefix` belongs to a lock, not to a connection,
    /// and is refused here.
    pub fn from_url(url: &str) -> Result<RedisConfig> {
        let (config, lock) = parse_url(url)?;
        if lock.prefix != DEFAULT_PREFIX {
            return Err(LockError::invalid_url(
                url,
                "prefix is an option of the lock, not of the connection",
            ));
        }
        if lock.fair || lock.barging {
            let what = if lock.fair { "fair" } else { "barging" };
            return Err(LockError::invalid_url(
                url,
                format!("{what} is an option of the lock, not of the connection"),
            ));
        }
        if !lock.fencing {
            return Err(LockError::invalid_url(
                url,
                "fencing is an option of the lock, not of the connection",
            ));
        }
        Ok(config)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Single,
    Cluster,
    Sentinel,
}

/// Why a lock cannot be both fair and barging (the URL's and the builder's
/// refusal say it alike).
pub(crate) const FAIR_OR_BARGING: &str =
    "exclude each other: a fair lock's waiters keep their order, a barging lock's keep none";

/// The options of the lock (not of the connection) a URL sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockParams {
    /// The key prefix.
    pub(crate) prefix: String,
    /// Whether waiters are served in order (`fair=true`).
    pub(crate) fair: bool,
    /// Whether waiters ask on the backoff, out of any line (`barging=true`).
    pub(crate) barging: bool,
    /// Whether grants draw fencing tokens where the deployment can
    /// (`fencing=false` turns it off).
    pub(crate) fencing: bool,
}

/// The query parameters every URL form shares.
struct Params {
    prefix: String,
    fair: bool,
    barging: bool,
    fencing: bool,
    connect_timeout: Duration,
    command_timeout: Duration,
    protocol: Option<ProtocolVersion>,
    tls_root_cert: Option<Vec<u8>>,
    wait_replicas: Option<usize>,
    wait_timeout: Option<Duration>,
    sentinel_password: Option<String>,
    direct: bool,
    sharded_pubsub: Option<bool>,
}

impl Params {
    fn parse<'a>(
        pairs: impl Iterator<Item = (Cow<'a, str>, Cow<'a, str>)>,
        form: Form,
        bad: &dyn Fn(String) -> LockError,
    ) -> Result<Params> {
        let mut params = Params {
            prefix: DEFAULT_PREFIX.to_owned(),
            fair: false,
            barging: false,
            fencing: true,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            protocol: None,
            tls_root_cert: None,
            wait_replicas: None,
            wait_timeout: None,
            sentinel_password: None,
            direct: true,
            sharded_pubsub: None,
        };
        for (key, value) in pairs {
            match &*key {
                "prefix" => params.prefix = value.into_owned(),
                "fair" => params.fair = bool_param(&key, &value).map_err(bad)?,
                "barging" => params.barging = bool_param(&key, &value).map_err(bad)?,
                "fencing" => params.fencing = bool_param(&key, &value).map_err(bad)?,
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
                "direct" if form == Form::Single => {
                    params.direct = bool_param(&key, &value).map_err(bad)?
                }
                "sharded_pubsub" if form == Form::Cluster => {
                    params.sharded_pubsub = match &*value {
                        "auto" => None,
                        _ => Some(bool_param(&key, &value).map_err(|e| {
                            bad(format!("{e} (or auto: sharded where the servers have it)"))
                        })?),
                    }
                }
                other => {
                    let known = match form {
                        Form::Single => {
                            "prefix, fair, barging, fencing, connect_timeout, command_timeout, ca_file, protocol, wait_replicas, wait_timeout, direct"
                        }
                        Form::Cluster => {
                            "prefix, fair, barging, fencing, connect_timeout, command_timeout, protocol, wait_replicas, wait_timeout, sharded_pubsub"
                        }
                        Form::Sentinel => {
                            "prefix, fair, barging, fencing, connect_timeout, command_timeout, protocol, wait_replicas, wait_timeout, sentinel_password"
                        }
                    };
                    return Err(bad(format!("unknown parameter {other:?} (known: {known})")));
                }
            }
        }
        if params.fair && params.barging {
            return Err(bad(format!("fair=true and barging=true {FAIR_OR_BARGING}")));
        }
        if params.wait_timeout.is_some() && params.wait_replicas.is_none() {
            return Err(bad("wait_timeout needs wait_replicas".into()));
        }
        Ok(params)
    }

    fn lock(&self) -> LockParams {
        LockParams {
            prefix: self.prefix.clone(),
            fair: self.fair,
            barging: self.barging,
            fencing: self.fencing,
        }
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

/// Parses a redis URL into connection settings and the key prefix.
pub(crate) fn parse_url(raw: &str) -> Result<(RedisConfig, LockParams)> {
    let shown = redact_url(raw);
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
) -> Result<(RedisConfig, LockParams)> {
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
    if url.fragment().is_some() {
        // redis-rs reads `#insecure` as "skip certificate verification":
        // lockkit never turns the checks off (a private CA is `ca_file`).
        return Err(bad(
            "a fragment is not allowed (certificate checks cannot be turned off; give a private CA with ca_file)".into(),
        ));
    }
    let params = Params::parse(url.query_pairs(), Form::Single, bad)?;
    let lock = params.lock();
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
        turn: TURN,
        line: true,
        wait: params.wait(),
        tls_root_cert: params.tls_root_cert,
        direct: params.direct,
        sharded_pubsub: None,
    };
    Ok((config, lock))
}

fn parse_multi_host(
    raw: &str,
    shown: String,
    form: Form,
    bad: &dyn Fn(String) -> LockError,
) -> Result<(RedisConfig, LockParams)> {
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
    let lock = params.lock();

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
        turn: TURN,
        line: true,
        wait: params.wait(),
        tls_root_cert: None,
        direct: false,
        sharded_pubsub: params.sharded_pubsub,
    };
    Ok((config, lock))
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
        assert_eq!(prefix.prefix, "a:b");
        assert!(!prefix.fair);
        assert_eq!(config.connect_timeout, Duration::from_millis(250));
        assert_eq!(config.command_timeout, Duration::from_secs(2));
        assert_eq!(config.address(), "127.0.0.1:7000");
        assert_eq!(config.info.redis_settings().db(), 3);
        assert_eq!(config.info.redis_settings().password(), Some("pw"));
        assert!(!format!("{config:?}").contains("pw@"));
        assert_eq!(config.mode(), "single");
        assert_eq!(config.wait, None);
        assert_eq!(parse_url("redis://h?prefix=").unwrap().1.prefix, "");
        assert_eq!(parse_url("redis://h").unwrap().1.prefix, DEFAULT_PREFIX);
        assert!(parse_url("redis://h?fair=true").unwrap().1.fair);
        assert!(!parse_url("redis://h?fair=false").unwrap().1.fair);
        let err = parse_url("redis://h?fair=maybe").unwrap_err().to_string();
        assert!(err.contains("must be true or false"), "{err}");
        assert!(parse_url("redis://h?barging=true").unwrap().1.barging);
        assert!(!parse_url("redis://h").unwrap().1.barging);
        let err = parse_url("redis://h?fair=true&barging=true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("exclude each other"), "{err}");
        let err = RedisConfig::from_url("redis://h?barging=true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("barging is an option of the lock"), "{err}");
        assert!(parse_url("redis://h").unwrap().1.fencing);
        assert!(!parse_url("redis://h?fencing=false").unwrap().1.fencing);
        assert!(
            !parse_url("redis+cluster://h?fencing=false")
                .unwrap()
                .1
                .fencing
        );
        let err = parse_url("redis://h?fencing=off").unwrap_err().to_string();
        assert!(err.contains("must be true or false"), "{err}");
        let err = RedisConfig::from_url("redis://h?fencing=false")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fencing is an option of the lock"), "{err}");
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
        assert_eq!(prefix.prefix, "x:");
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
        assert_eq!(config.sharded_pubsub, None);
    }

    #[test]
    fn sharded_pubsub_is_a_cluster_parameter() {
        for (value, expected) in [("auto", None), ("true", Some(true)), ("false", Some(false))] {
            let url = format!("redis+cluster://a:1,b:2?sharded_pubsub={value}");
            assert_eq!(
                parse_url(&url).unwrap().0.sharded_pubsub,
                expected,
                "{value}"
            );
        }
        let err = parse_url("redis+cluster://a:1?sharded_pubsub=maybe").unwrap_err();
        assert!(err.to_string().contains("auto"), "{err}");
        for url in [
            "redis://127.0.0.1?sharded_pubsub=true",
            "redis+sentinel://s1/m?sharded_pubsub=true",
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(
                err.to_string()
                    .contains("unknown parameter \"sharded_pubsub\""),
                "{err}"
            );
        }
    }

    #[test]
    fn parses_sentinel_urls() {
        let (config, prefix) = parse_url(
            "redis+sentinel://:datapw@s1,s2:26380,s3:26381/my%20master/2?sentinel_password=sentpw&connect_timeout=1s",
        )
        .unwrap();
        assert_eq!(prefix.prefix, DEFAULT_PREFIX);
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
            redact_url("redis+sentinel://:pw@a,b/m?x=1&sentinel_password=spw&y=2#f"),
            "redis+sentinel://:***@a,b/m?x=1&sentinel_password=***&y=2#f"
        );
        assert_eq!(
            redact_url("redis+sentinel://a/m?sentinel%5Fpassword=spw"),
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
            "rediss://:topsecret@h#insecure",
            "rediss://:topsecret@h?ca_file=/etc/hosts#insecure",
            "redis://:topsecret@h#frag",
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
