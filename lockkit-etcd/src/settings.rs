//! What a client of one etcd cluster is configured with.

use std::time::Duration;

/// The key prefix when the URL names none (`etcd://h` is `etcd://h/lockkit`).
pub const DEFAULT_PREFIX: &str = "/lockkit";
/// Time to reach the cluster when connecting.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Time to wait for one request.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The settings of one client.
#[derive(Clone)]
pub(crate) struct EtcdSettings {
    /// `http://host:port` of every member.
    pub(crate) endpoints: Vec<String>,
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
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}
