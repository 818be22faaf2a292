//! `redlock://` URLs and the builder.

use std::fmt;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lockkit_core::backend::{
    LeaseLock, MultiHostUrl, bool_param, check_timeout, host_list, redact_url, timeout_param,
};
use lockkit_core::{LockError, Result};
use lockkit_redis::{DEFAULT_PREFIX, RedisConfig, RedisInstance};
use tokio::time::Instant;

use crate::backend::{RedlockBackend, RedlockLock};
use crate::error::{BACKEND, unreachable_quorum};

/// Builds a [`RedlockLock`] over N independent Redis masters.
///
/// URL form: `redlock://[user:password@]host1:port1,host2:port2,…[/db][?param=value…]`
/// (IPv6 hosts in brackets; the port defaults to 6379). The credentials and the
/// database apply to every instance. Parameters:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | key prefix | `lockkit:` |
/// | `barging` | `true`: waiters of an exclusive lock ask again on the backoff, in no line, and a client that releases may take the lock straight back ([`barging`](RedlockLockBuilder::barging)) | `false` |
/// | `instance_timeout` | bound of each request to one instance | min(50 ms, ttl / 10) |
/// | `connect_timeout` | per instance | 2 s |
/// | `command_timeout` | per instance, for non-lock commands | 1 s |
///
/// ```
/// use std::time::Duration;
/// use lockkit_redlock::RedlockLockBuilder;
///
/// let builder = RedlockLockBuilder::from_url("redlock://:pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?prefix=app:")?
///     .instance_timeout(Duration::from_millis(20));
/// assert_eq!(builder.instances().len(), 3);
/// assert!(!format!("{builder:?}").contains("pw"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone)]
pub struct RedlockLockBuilder {
    instances: Vec<RedisConfig>,
    prefix: String,
    instance_timeout: Option<Duration>,
    barging: bool,
    redacted_url: String,
}

impl fmt::Debug for RedlockLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLockBuilder")
            .field("url", &self.redacted_url)
            .field("instances", &self.instances.len())
            .field("prefix", &self.prefix)
            .field("instance_timeout", &self.instance_timeout)
            .field("barging", &self.barging)
            .finish()
    }
}

impl RedlockLockBuilder {
    /// Builds from per-instance connection settings.
    pub fn new(instances: Vec<RedisConfig>) -> Self {
        let redacted_url = format!(
            "redlock://{}",
            instances
                .iter()
                .map(RedisConfig::address)
                .collect::<Vec<_>>()
                .join(",")
        );
        RedlockLockBuilder {
            instances,
            prefix: DEFAULT_PREFIX.to_owned(),
            instance_timeout: None,
            barging: false,
            redacted_url,
        }
    }

    /// Parses a `redlock://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        parse_url(url)
    }

    /// The key prefix (default `lockkit:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bounds every request to one instance (default min(50 ms, ttl / 10)).
    /// It must stay far below the TTL: a request that takes longer is counted
    /// as a missing vote.
    pub fn instance_timeout(mut self, timeout: Duration) -> Self {
        self.instance_timeout = Some(timeout);
        self
    }

    /// Lets the lock go to whoever asks first (default false; `barging=true`
    /// in the URL): this client's waiters of an exclusive lock take no
    /// place in the name's waiting line on any instance and hear no
    /// releases; they ask again on the backoff of their
    /// [`LockOptions`](lockkit_core::LockOptions), and take the lock
    /// whenever a quorum finds it free. Under many clients contending for
    /// one name, a client that releases and asks again at once then mostly
    /// takes the lock straight back (as `rslock` does): the most critical
    /// sections per second, at the price of order (a waiter may wait as
    /// long as others keep finding the lock free first) and of a handoff
    /// to a waiting client taking up to its backoff. Readers, semaphores
    /// and the clients that do not barge are unchanged.
    pub fn barging(mut self, barging: bool) -> Self {
        self.barging = barging;
        self
    }

    /// The instances' connection settings.
    pub fn instances(&self) -> &[RedisConfig] {
        &self.instances
    }

    /// Connects to every instance in parallel, each tried again within its
    /// connect timeout while it is not up yet. Once a quorum (N/2 + 1) is
    /// connected, the others get 200 ms more; those not connected by then
    /// are connected lazily and join when they come up. Fewer than a quorum
    /// gives `LockError::Unavailable`.
    pub async fn connect(self) -> Result<RedlockLock> {
        if self.instances.is_empty() {
            return Err(LockError::invalid_options(
                "Redlock needs at least one instance",
            ));
        }
        if let Some(timeout) = self.instance_timeout {
            check_timeout("instance_timeout", timeout)?;
        }
        let total = self.instances.len();
        let quorum = total / 2 + 1;
        // Each instance is tried within its connect timeout (a server still
        // starting is waited for); a quorum is enough to start, and the
        // instances not connected by then are made lazy.
        let configs: Vec<RedisConfig> = if self.barging {
            self.instances
                .into_iter()
                .map(RedisConfig::without_line)
                .collect()
        } else {
            self.instances
        };
        let mut attempts: FuturesUnordered<_> = configs
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, config)| async move { (i, RedisInstance::connect(config).await) })
            .collect();
        let mut instances = Vec::with_capacity(total);
        let mut failures = Vec::new();
        let mut settled = vec![false; total];
        // Past the quorum, the others get a short grace (instances that are
        // up connect within it, as eagerly as the quorum did), not the
        // whole connect timeout an instance that is down would take.
        let mut grace: Option<Instant> = None;
        while instances.len() + failures.len() < total {
            let next = match grace {
                None => attempts.next().await,
                Some(until) => match tokio::time::timeout_at(until, attempts.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            let Some((i, attempt)) = next else {
                break;
            };
            settled[i] = true;
            match attempt {
                Ok(instance) => instances.push(instance),
                Err(error) => failures.push((configs[i].clone(), error)),
            }
            if grace.is_none() && instances.len() >= quorum {
                grace = Some(Instant::now() + QUORUM_GRACE);
            }
        }
        drop(attempts);
        if instances.len() < quorum {
            // A configuration error (e.g. a wrong password everywhere) is
            // reported as itself rather than as an outage.
            if let Some((_, error)) = failures
                .iter()
                .find(|(_, e)| matches!(e, LockError::Backend { .. }))
                && failures
                    .iter()
                    .all(|(_, e)| matches!(e, LockError::Backend { .. }))
            {
                return Err(LockError::backend(BACKEND, error.to_string()));
            }
            let reasons: Vec<String> = failures.iter().map(|(_, e)| e.to_string()).collect();
            return Err(unreachable_quorum(instances.len(), total, quorum, &reasons));
        }
        for (config, error) in failures {
            tracing::warn!(redis.address = %config.address(), %error,
                "Redlock instance unreachable at connect; it joins when it comes up");
            instances.push(RedisInstance::connect_lazy(config)?);
        }
        for (config, _) in configs.into_iter().zip(settled).filter(|(_, s)| !s) {
            tracing::debug!(redis.address = %config.address(),
                "Redlock instance not connected when the quorum was; it connects on first use");
            instances.push(RedisInstance::connect_lazy(config)?);
        }
        let backend = RedlockBackend::new(instances, self.prefix, self.instance_timeout);
        Ok(LeaseLock::new(if self.barging {
            backend.barging()
        } else {
            backend
        }))
    }
}

/// How long `connect` waits for the other instances once a quorum is
/// connected.
const QUORUM_GRACE: Duration = Duration::from_millis(200);

pub(crate) fn parse_url(raw: &str) -> Result<RedlockLockBuilder> {
    let bad = |reason: String| LockError::invalid_url(raw, reason);
    let MultiHostUrl {
        userinfo,
        hosts,
        path,
        query,
    } = MultiHostUrl::parse(raw, "redlock").map_err(bad)?;
    let db = match path.trim_start_matches('/') {
        "" => None,
        db => Some(
            db.parse::<u32>()
                .map_err(|_| bad(format!("bad database {db:?}")))?,
        ),
    };

    let mut prefix = DEFAULT_PREFIX.to_owned();
    let mut instance_timeout = None;
    let mut barging = false;
    let mut passed_on = Vec::new();
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "prefix" => prefix = value.into_owned(),
            "barging" => barging = bool_param(&key, &value).map_err(bad)?,
            "instance_timeout" => {
                instance_timeout = Some(timeout_param(&key, &value).map_err(bad)?)
            }
            "connect_timeout" | "command_timeout" => {
                timeout_param(&key, &value).map_err(bad)?;
                passed_on.push(format!("{key}={value}"));
            }
            other => {
                return Err(bad(format!(
                    "unknown parameter {other:?} (known: prefix, barging, instance_timeout, connect_timeout, command_timeout)"
                )));
            }
        }
    }

    let mut instances = Vec::new();
    for (host, port) in host_list(hosts, 6379).map_err(bad)? {
        let mut url = String::from("redis://");
        if let Some(userinfo) = userinfo {
            url.push_str(userinfo);
            url.push('@');
        }
        url.push_str(&format!("{host}:{port}"));
        if let Some(db) = db {
            url.push_str(&format!("/{db}"));
        }
        if !passed_on.is_empty() {
            url.push('?');
            url.push_str(&passed_on.join("&"));
        }
        // Errors about one instance must not show its password either.
        let config = RedisConfig::from_url(&url).map_err(|e| match e {
            LockError::InvalidUrl { reason, .. } => bad(reason),
            other => other,
        })?;
        instances.push(config);
    }
    Ok(RedlockLockBuilder {
        instances,
        prefix,
        instance_timeout,
        barging,
        redacted_url: redact_url(raw),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_and_parameters() {
        let b = parse_url(
            "redlock://u:pw@a:1,b,[::1]:3/2?prefix=x%3A&instance_timeout=20ms&connect_timeout=300ms",
        )
        .unwrap();
        let addresses: Vec<String> = b.instances.iter().map(RedisConfig::address).collect();
        assert_eq!(addresses, ["a:1", "b:6379", "::1:3"]);
        assert_eq!(b.prefix, "x:");
        assert_eq!(b.instance_timeout, Some(Duration::from_millis(20)));
        assert!(
            b.instances
                .iter()
                .all(|c| c.connect_timeout() == Duration::from_millis(300))
        );
        assert!(!format!("{b:?}").contains("pw"));
        assert!(!b.barging);
        assert!(parse_url("redlock://a:1?barging=true").unwrap().barging);
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "redis://:secretpw@a:1",
            "redlock://:secretpw@",
            "redlock://:secretpw@a:1,,b:2",
            "redlock://:secretpw@a:1,a:1",
            "redlock://:secretpw@a:0",
            "redlock://:secretpw@a:99999",
            "redlock://:secretpw@a:x",
            "redlock://:secretpw@[::1:3",
            "redlock://:secretpw@a:1/db",
            "redlock://:secretpw@a:1?instance_timeout=0ms",
            "redlock://:secretpw@a:1?instance_timeout=soon",
            "redlock://:secretpw@a:1?prefx=typo",
            "redlock://:secretpw@a:1?barging=sometimes",
            "redlock://:secretpw@a:1#frag",
        ] {
            let err = parse_url(bad).map(|_| ()).unwrap_err();
            assert!(matches!(err, LockError::InvalidUrl { .. }), "{bad}: {err}");
            let text = format!("{err} {err:?}");
            assert!(!text.contains("secretpw"), "{text}");
        }
    }
}
