//! Connection settings and `redis://` URL parsing.

use std::fmt;
use std::time::Duration;

use lockkit_core::{LeaseLock, LockError, Result, redact_url, timeout_param};
use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::backend::{RedisBackend, RedisLock};
use crate::instance::RedisInstance;
use crate::keys::DEFAULT_PREFIX;

/// Default time to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time to wait for the reply to one command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a pub/sub subscription is kept after its last waiter is gone.
pub const DEFAULT_SUBSCRIPTION_LINGER: Duration = Duration::from_secs(10);

/// Settings of one Redis server connection. `Debug` hides the password.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) info: ConnectionInfo,
    pub(crate) redacted_url: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) subscription_linger: Duration,
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("subscription_linger", &self.subscription_linger)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "set"))
            .finish()
    }
}

impl RedisConfig {
    /// Parses the connection part of a `redis://` or `rediss://` URL (see
    /// [`RedisLockBuilder`] for the parameters). `prefix` belongs to a lock,
    /// not to a connection, and is refused here.
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

    /// The server address as `host:port` (never with credentials).
    pub fn address(&self) -> String {
        self.info.addr().to_string()
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted_url
    }
}

/// Builds a [`RedisLock`]: from a URL, then adjusted in code.
///
/// URL form: `redis://[user:password@]host[:port][/db][?param=value…]`, or
/// `rediss://` for TLS (`#insecure` skips certificate verification). Parameters
/// (percent-decoded):
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | key prefix; empty for plain keys that other libraries share | `lockkit:` |
/// | `connect_timeout` | e.g. `500ms`, `2s` | 2 s |
/// | `command_timeout` | per command | 1 s |
/// | `ca_file` | PEM file of the CA that signed the server's certificate (`rediss://`) | system roots |
/// | `protocol` | `resp2` or `resp3` for the command connection | `resp2` |
///
/// ```
/// use std::time::Duration;
/// use lockkit_redis::RedisLockBuilder;
///
/// let builder = RedisLockBuilder::from_url("redis://:s3cret@127.0.0.1:6379/0?prefix=app:")?
///     .command_timeout(Duration::from_millis(500));
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisLockBuilder {
    config: RedisConfig,
    prefix: String,
}

impl RedisLockBuilder {
    /// Parses a `redis://` or `rediss://` URL.
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

    /// The connection settings so far.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Connects (eagerly: an unreachable server gives `LockError::Unavailable`
    /// within the connect timeout) and loads the scripts.
    pub async fn connect(self) -> Result<RedisLock> {
        check_timeout("connect_timeout", self.config.connect_timeout)?;
        check_timeout("command_timeout", self.config.command_timeout)?;
        let instance = RedisInstance::connect(self.config).await?;
        Ok(LeaseLock::new(RedisBackend::new(instance, self.prefix)))
    }
}

fn check_timeout(what: &str, value: Duration) -> Result<()> {
    if value.is_zero() || value > lockkit_core::MAX_TIMEOUT_PARAM {
        Err(LockError::invalid_options(format!(
            "{what} {value:?} must be positive and at most one hour"
        )))
    } else {
        Ok(())
    }
}

/// Parses a redis URL into connection settings and the key prefix.
pub(crate) fn parse_url(raw: &str) -> Result<(RedisConfig, String)> {
    let bad = |reason: String| LockError::invalid_url(raw, reason);
    let mut url = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(bad(format!(
            "scheme {:?} is not redis:// or rediss://",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("missing host".into()));
    }
    if url.port() == Some(0) {
        return Err(bad("port 0 is not a server's port".into()));
    }
    let mut prefix = DEFAULT_PREFIX.to_owned();
    let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
    let mut command_timeout = DEFAULT_COMMAND_TIMEOUT;
    let mut tls_root_cert = None;
    let mut passed_on = Vec::new();
    for (key, value) in url.query_pairs() {
        match &*key {
            "prefix" => prefix = value.into_owned(),
            "connect_timeout" => connect_timeout = timeout_param(&key, &value).map_err(bad)?,
            "command_timeout" => command_timeout = timeout_param(&key, &value).map_err(bad)?,
            "ca_file" => {
                let pem = std::fs::read(&*value)
                    .map_err(|e| bad(format!("cannot read ca_file {value:?}: {e}")))?;
                tls_root_cert = Some(pem);
            }
            "protocol" => match &*value {
                "resp2" | "resp3" | "2" | "3" => {
                    passed_on.push((key.into_owned(), value.into_owned()))
                }
                other => return Err(bad(format!("protocol {other:?} is not resp2 or resp3"))),
            },
            other => {
                return Err(bad(format!(
                    "unknown parameter {other:?} (known: prefix, connect_timeout, command_timeout, ca_file, protocol)"
                )));
            }
        }
    }
    if passed_on.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(passed_on);
    }
    if tls_root_cert.is_some() && url.scheme() != "rediss" {
        return Err(bad("ca_file needs a rediss:// URL".into()));
    }
    let info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| bad(e.to_string()))?;
    let config = RedisConfig {
        info,
        redacted_url: redact_url(raw),
        connect_timeout,
        command_timeout,
        subscription_linger: DEFAULT_SUBSCRIPTION_LINGER,
        tls_root_cert,
    };
    Ok((config, prefix))
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
        assert_eq!(parse_url("redis://h?prefix=").unwrap().1, "");
        assert_eq!(parse_url("redis://h").unwrap().1, DEFAULT_PREFIX);
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
            "redis://:topsecret@",
            "http://:topsecret@h",
            "redis//:topsecret@h",
        ] {
            let err = parse_url(bad).map(|_| ()).unwrap_err();
            assert!(matches!(err, LockError::InvalidUrl { .. }), "{bad}: {err}");
            let text = format!("{err} {err:?}");
            assert!(!text.contains("topsecret"), "{text}");
        }
    }
}
