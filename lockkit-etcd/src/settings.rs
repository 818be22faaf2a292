//! What a client of one etcd cluster is configured with.

use std::time::Duration;

/// The key prefix when the URL names none (`etcd://h` is `etcd://h/lockkit`).
pub const DEFAULT_PREFIX: &str = "/lockkit";
/// Time to reach the cluster when connecting.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Time to wait for one request.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle connection sends an HTTP/2 ping (etcd's servers accept
/// one every 5 s at most, `--grpc-keepalive-min-time`); a ping unanswered
/// within the command timeout closes the connection.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// TLS to the members: which certificate authority to trust, and the
/// client's own certificate where the cluster asks for one.
#[derive(Clone, Default)]
pub(crate) struct EtcdTls {
    /// PEM of the authorities to trust; `None`: the system's roots.
    pub(crate) ca: Option<Vec<u8>>,
    /// PEM of the client certificate and of its private key.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key is a secret: only whether one is set.
        f.debug_struct("EtcdTls")
            .field(
                "ca",
                &self.ca.as_ref().map_or("system roots", |_| "ca_file"),
            )
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

/// The settings of one client.
#[derive(Clone)]
pub(crate) struct EtcdSettings {
    /// `http://host:port` (`https://` with TLS) of every member.
    pub(crate) endpoints: Vec<String>,
    /// TLS, when the URL asks for it.
    pub(crate) tls: Option<EtcdTls>,
    /// The key prefix, without a trailing `/`.
    pub(crate) prefix: String,
    pub(crate) user: Option<(String, String)>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) redacted_url: String,
}

impl std::fmt::Debug for EtcdSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSettings")
            .field("url", &self.redacted_url)
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}
