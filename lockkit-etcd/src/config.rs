//! `etcd://` URLs and the builder.

use lockkit_core::backend::{MultiHostUrl, check_timeout, host_list, redact_url, timeout_param};
use lockkit_core::{LockError, Result};

use crate::client::Etcd;
use crate::lock::{EtcdBackend, EtcdLock};
use crate::settings::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, EtcdSettings, EtcdTls,
};

/// Builds an [`EtcdLock`].
///
/// URL form: `etcd://[user:password@]host1:port1,host2:port2,…[/prefix][?param=value…]`
/// (the port defaults to 2379, the prefix to `/lockkit`). The prefix is the
/// URL's path as written, leading `/` included: the lock `name`'s keys live
/// under `<prefix>/<name>/` (see [`encode_name`](crate::encode_name)), as
/// `etcdctl lock <prefix>/<name>` lays them out, so `etcd://h:2379/locks`
/// and `etcdctl lock /locks/job` take the same lock `job`. With credentials the
/// client authenticates (etcd's user/password auth).
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `connect_timeout` | to reach the cluster | 2 s |
/// | `command_timeout` | per request | 2 s |
/// | `tls` | `true`: TLS to every member, trusting the system's roots | `false` |
/// | `ca_file` | a PEM file of the authorities to trust instead (implies `tls`) | |
/// | `cert_file`, `key_file` | PEM files of a client certificate and its key, for clusters that check clients (`--client-cert-auth`); both or neither (imply `tls`) | |
///
/// Certificates are always verified: there is no way to turn that off. The
/// files are read when the URL is parsed; a missing or unreadable one is
/// `InvalidUrl` naming the file.
///
/// ```
/// use std::time::Duration;
/// use lockkit_etcd::EtcdLockBuilder;
///
/// let builder = EtcdLockBuilder::from_url("etcd://app:pw@10.0.0.1:2379,10.0.0.2:2379/jobs?command_timeout=1s")?
///     .connect_timeout(Duration::from_secs(1));
/// assert_eq!(builder.prefix(), "/jobs");
/// assert!(!format!("{builder:?}").contains("pw"));
/// # Ok::<(), lockkit_core::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct EtcdLockBuilder {
    settings: EtcdSettings,
}

impl EtcdLockBuilder {
    /// Parses an `etcd://` URL.
    pub fn from_url(url: &str) -> Result<Self> {
        parse_url(url)
    }

    lockkit_core::timeout_setters!(
        settings,
        connect: "Time to reach the cluster when connecting (default 2 s).",
        command: "Time to wait for one request (default 2 s).",
    );

    /// The key prefix of the locks.
    pub fn prefix(&self) -> &str {
        &self.settings.prefix
    }

    /// Connects eagerly: a cluster that does not answer yet is tried again
    /// with backoff until the connect timeout, then gives
    /// `LockError::Unavailable`.
    pub async fn connect(self) -> Result<EtcdLock> {
        let settings = self.settings;
        check_timeout("connect_timeout", settings.connect_timeout)?;
        check_timeout("command_timeout", settings.command_timeout)?;
        let etcd = Etcd::connect(settings).await?;
        Ok(EtcdLock::new(EtcdBackend::new(etcd)))
    }
}

/// Checks a prefix (a URL path, with its leading `/`): no empty, `.` or
/// `..` segments, no control characters.
fn check_prefix(prefix: &str) -> std::result::Result<(), String> {
    for segment in prefix.trim_start_matches('/').split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(format!(
                "prefix {prefix:?} has an empty, '.' or '..' segment"
            ));
        }
        if segment.chars().any(char::is_control) {
            return Err(format!("prefix {prefix:?} has a control character"));
        }
    }
    Ok(())
}

pub(crate) fn parse_url(raw: &str) -> Result<EtcdLockBuilder> {
    let bad = |reason: String| LockError::invalid_url(raw, reason);
    let url = MultiHostUrl::parse(raw, "etcd").map_err(bad)?;
    let (hosts, path, query) = (url.hosts, url.path, url.query);
    let endpoints = host_list(hosts, 2379)
        .map_err(bad)?
        .iter()
        .map(|(host, port)| format!("http://{host}:{port}"))
        .collect();
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| bad("not valid UTF-8 after percent-decoding".into()))
    };
    let user = url.credentials().map_err(bad)?;
    // The path as written, leading `/` included: `etcd://h/locks` puts
    // `job` under `/locks/job/`, where `etcdctl lock /locks/job` puts it.
    let prefix = match decode(path)?.as_str() {
        "" | "/" => DEFAULT_PREFIX.to_owned(),
        prefix => {
            check_prefix(prefix).map_err(bad)?;
            prefix.to_owned()
        }
    };
    let mut settings = EtcdSettings {
        endpoints,
        tls: None,
        prefix,
        user,
        connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        command_timeout: DEFAULT_COMMAND_TIMEOUT,
        redacted_url: redact_url(raw),
    };
    let mut tls = false;
    let mut tls_files = EtcdTls::default();
    let (mut cert, mut key_file) = (None, None);
    let read = |param: &str, path: &str| {
        std::fs::read(path).map_err(|e| bad(format!("cannot read {param} {path:?}: {e}")))
    };
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let timeout = timeout_param(&key, &value);
        match &*key {
            "connect_timeout" => settings.connect_timeout = timeout.map_err(bad)?,
            "command_timeout" => settings.command_timeout = timeout.map_err(bad)?,
            "tls" => {
                tls = match &*value {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => return Err(bad(format!("tls {other:?} is not true or false"))),
                }
            }
            "ca_file" => tls_files.ca = Some(read("ca_file", &value)?),
            "cert_file" => cert = Some(read("cert_file", &value)?),
            "key_file" => key_file = Some(read("key_file", &value)?),
            other => {
                return Err(bad(format!(
                    "unknown parameter {other:?} (known: connect_timeout, command_timeout, tls, ca_file, cert_file, key_file)"
                )));
            }
        }
    }
    tls_files.identity = match (cert, key_file) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(bad("cert_file and key_file go together".into())),
    };
    if tls || tls_files.ca.is_some() || tls_files.identity.is_some() {
        for endpoint in &mut settings.endpoints {
            *endpoint = endpoint.replacen("http://", "https://", 1);
        }
        settings.tls = Some(tls_files);
    }
    Ok(EtcdLockBuilder { settings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_hosts_prefix_and_parameters() {
        let b = parse_url("etcd://u:p%40ss@a:1,b,[::1]:3/locks/app?command_timeout=3s").unwrap();
        assert_eq!(
            b.settings.endpoints,
            ["http://a:1", "http://b:2379", "http://[::1]:3"]
        );
        assert_eq!(b.settings.prefix, "/locks/app");
        assert_eq!(b.settings.user, Some(("u".to_owned(), "p@ss".to_owned())));
        assert_eq!(b.settings.command_timeout, Duration::from_secs(3));
        assert!(!format!("{b:?}").contains("p@ss"));
        assert_eq!(
            parse_url("etcd://h").unwrap().settings.prefix,
            DEFAULT_PREFIX
        );
        assert_eq!(
            parse_url("etcd://h/").unwrap().settings.prefix,
            DEFAULT_PREFIX
        );
    }

    #[test]
    fn tls_parameters_switch_to_https_and_keep_the_key_out_of_debug() {
        let dir = std::env::temp_dir().join(format!("lockkit-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let (ca, cert, key) = (
            file("ca.pem", "CA"),
            file("c.pem", "CERT"),
            file("k.pem", "SECRET-KEY-BYTES"),
        );
        let plain = parse_url("etcd://a:1,b:2").unwrap();
        assert!(plain.settings.tls.is_none());
        assert_eq!(plain.settings.endpoints, ["http://a:1", "http://b:2"]);
        let roots = parse_url("etcd://a:1?tls=true").unwrap();
        assert_eq!(roots.settings.endpoints, ["https://a:1"]);
        assert!(roots.settings.tls.as_ref().unwrap().ca.is_none());
        let b = parse_url(&format!(
            "etcd://a:1,b:2?ca_file={ca}&cert_file={cert}&key_file={key}"
        ))
        .unwrap();
        assert_eq!(b.settings.endpoints, ["https://a:1", "https://b:2"]);
        let tls = b.settings.tls.as_ref().unwrap();
        assert_eq!(tls.ca.as_deref(), Some(&b"CA"[..]));
        assert!(tls.identity.is_some());
        assert!(!format!("{b:?}").contains("SECRET"), "{b:?}");
        let half = parse_url(&format!("etcd://a?cert_file={cert}"))
            .map(|_| ())
            .unwrap_err();
        assert!(half.to_string().contains("together"), "{half}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_urls_without_leaking_the_password() {
        for bad in [
            "etcd://:secretpw@",
            "etcd://u:secretpw@h:0",
            "etcd://u:secretpw@h:1,h:1",
            "etcd://u:secretpw@h/a//b",
            "etcd://u:secretpw@h/a/../b",
            "etcd://u:secretpw@h/a/",
            "etcd://u:secretpw@h?command_timeout=never",
            "etcd://u:secretpw@h?comand_timeout=1s",
            "etcd://secretpw@h",
            "etcd://:secretpw@h",
            "etcds://u:secretpw@h",
            "etcd://u:secretpw@h?tls=maybe",
            "etcd://u:secretpw@h?ca_file=/nonexistent/ca.pem",
            "etcd://u:secretpw@h?cert_file=/nonexistent/c.pem",
        ] {
            let err = parse_url(bad).map(|_| ()).unwrap_err();
            assert!(matches!(err, LockError::InvalidUrl { .. }), "{bad}: {err}");
            let text = format!("{err} {err:?}");
            assert!(!text.contains("secretpw"), "{text}");
        }
    }
}
