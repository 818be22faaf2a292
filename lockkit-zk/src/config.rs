//! `zk://` URLs and the builder.

use std::time::Duration;

use lockkit_core::backend::{MultiHostUrl, check_timeout, host_list, redact_url, timeout_param};
use lockkit_core::{LockError, Result};

use crate::lock::{ZkBackend, ZkLock};
use crate::session::Sessions;
use crate::settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT,
    ZkSettings,
};

/// Builds a [`ZkLock`].
///
/// URL form: `zk://[user:password@]host1:port1,host2:port2,…[/root][?param=value…]`
/// (the port defaults to 2181, the root to `/lockkit`). Lock `name` lives at
/// `/root/<name>` (see [`encode_name`](crate::encode_name)). With credentials,
/// the client authenticates with the `digest` scheme and creates its nodes so
/// that only clients with the same credentials may change or delete them.
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `session_timeout` | the session timeout to negotiate; a crashed holder's lock is freed after it | 10 s |
/// | `connect_timeout` | to establish a session | 2 s |
/// | `command_timeout` | per request | 2 s |
///
/// ```
/// use std::time::Duration;
/// use lockkit_zk::ZkLockBuilder;
///
/// let builder = ZkLockBuilder::from_url("zk://app:pw@10.0.0.1:2181,10.0.0.2:2181/jobs?session_timeout=6s")?
///     .command_timeout(Duration::from_secs(1));
/// assert_eq!(builder.root(), "/jobs");
/// assert!(!format!("{builder:?}").contains("pw"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ZkLockBuilder {
    settings: ZkSettings,
}

impl ZkLockBuilder {
    /// Parses a `zk://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        parse_url(url)
    }

    /// The session timeout to negotiate (default 10 s; the server clamps it to
    /// its `minSessionTimeout..=maxSessionTimeout`).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.session_timeout = timeout;
        self
    }

    lockkit_core::timeout_setters!(
        settings,
        connect: "Time to establish a session (default 2 s).",
        command: "Time to wait for one request (default 2 s).",
    );

    /// The root node of the locks.
    pub fn root(&self) -> &str {
        &self.settings.root
    }

    /// Connects eagerly: an ensemble that does not serve yet is tried again
    /// with backoff until the connect timeout, then gives
    /// `LockError::Unavailable`. A new session is
    /// opened on first use after the current one expires.
    pub async fn connect(self) -> Result<ZkLock> {
        let settings = self.settings;
        check_timeout("session_timeout", settings.session_timeout)?;
        check_timeout("connect_timeout", settings.connect_timeout)?;
        check_timeout("command_timeout", settings.command_timeout)?;
        let sessions = Sessions::connect(settings).await?;
        Ok(ZkLock::new(ZkBackend::new(sessions)))
    }
}

/// Checks a root path: absolute, no empty, `.` or `..` segments, no trailing `/`.
fn check_root(root: &str) -> std::result::Result<(), String> {
    if root == "/" {
        return Ok(());
    }
    if root.ends_with('/') {
        return Err(format!("root {root:?} must not end with '/'"));
    }
    for segment in root.split('/').skip(1) {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!("root {root:?} has an empty, '.' or '..' segment"));
        }
        if segment.chars().any(|c| c.is_control()) {
            return Err(format!("root {root:?} has a control character"));
        }
    }
    Ok(())
}

pub(crate) fn parse_url(raw: &str) -> Result<ZkLockBuilder> {
    let bad = |reason: String| LockError::invalid_url(raw, reason);
    let url = MultiHostUrl::parse(raw, "zk").map_err(bad)?;
    let (hosts, path, query) = (url.hosts, url.path, url.query);
    let hosts = host_list(hosts, 2181).map_err(bad)?;
    let cluster = hosts
        .iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| bad("not valid UTF-8 after percent-decoding".into()))
    };
    let digest = url
        .credentials()
        .map_err(bad)?
        .map(|(user, password)| format!("{user}:{password}"));
    let root = match decode(path)?.as_str() {
        "" => DEFAULT_ROOT.to_owned(),
        "/" => String::new(),
        root => {
            check_root(root).map_err(bad)?;
            root.to_owned()
        }
    };
    let mut settings = ZkSettings {
        cluster,
        root,
        digest,
        session_timeout: DEFAULT_SESSION_TIMEOUT,
        connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        command_timeout: DEFAULT_COMMAND_TIMEOUT,
        redacted_url: redact_url(raw),
    };
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let timeout = timeout_param(&key, &value);
        match &*key {
            "session_timeout" => settings.session_timeout = timeout.map_err(bad)?,
            "connect_timeout" => settings.connect_timeout = timeout.map_err(bad)?,
            "command_timeout" => settings.command_timeout = timeout.map_err(bad)?,
            other => {
                return Err(bad(format!(
                    "unknown parameter {other:?} (known: session_timeout, connect_timeout, command_timeout)"
                )));
            }
        }
    }
    Ok(ZkLockBuilder { settings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_root_and_parameters() {
        let b = parse_url("zk://u:p%40ss@a:1,b,[::1]:3/locks/app?session_timeout=3s").unwrap();
        assert_eq!(b.settings.cluster, "a:1,b:2181,[::1]:3");
        assert_eq!(b.settings.root, "/locks/app");
        assert_eq!(b.settings.digest.as_deref(), Some("u:p@ss"));
        assert_eq!(b.settings.session_timeout, Duration::from_secs(3));
        assert!(!format!("{b:?}").contains("p@ss"));
        assert_eq!(parse_url("zk://h").unwrap().settings.root, DEFAULT_ROOT);
        assert_eq!(parse_url("zk://h/").unwrap().settings.root, "");
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "zk://:secretpw@",
            "zk://u:secretpw@h:0",
            "zk://u:secretpw@h:1,h:1",
            "zk://u:secretpw@h/a//b",
            "zk://u:secretpw@h/a/../b",
            "zk://u:secretpw@h/a/",
            "zk://u:secretpw@h?session_timeout=never",
            "zk://u:secretpw@h?sesion_timeout=1s",
            "zk://secretpw@h",
            "zk://:secretpw@h",
            "zookeeper://u:secretpw@h",
        ] {
            let err = parse_url(bad).map(|_| ()).unwrap_err();
            assert!(matches!(err, LockError::InvalidUrl { .. }), "{bad}: {err}");
            let text = format!("{err} {err:?}");
            assert!(!text.contains("secretpw"), "{text}");
        }
    }
}
