//! The resolved settings of a ZooKeeper client; the session layer reads them.

use std::fmt;
use std::time::Duration;

/// Default ZooKeeper session timeout.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time to establish a session.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time to wait for the answer to one request.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Default root node of the locks.
pub const DEFAULT_ROOT: &str = "/lockkit";

/// The resolved settings of a ZooKeeper client, as the URL and the builder
/// left them. `Debug` hides the credentials.
#[derive(Clone)]
pub(crate) struct ZkSettings {
    pub(crate) cluster: String,
    pub(crate) root: String,
    pub(crate) digest: Option<String>,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) redacted_url: String,
}

impl fmt::Debug for ZkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSettings")
            .field("url", &self.redacted_url)
            .field("root", &self.root)
            .field("digest_auth", &self.digest.is_some())
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}
