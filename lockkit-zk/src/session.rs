//! ZooKeeper sessions: one at a time per client, replaced after it ends, and
//! the lost signal for every lock held in a session that ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::backend::{LossNotifier, connect_retrying};
use lockkit_core::{LockError, LostReason, Result};
use zookeeper_client::{Acl, Acls, Client, Permission, SessionState};

use crate::error::{BACKEND, map_error};
use crate::settings::ZkSettings;

/// With credentials: the session's own identity may do everything, the world
/// may only read.
static DIGEST_ACLS: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// The client's sessions: the current one, and how to open the next.
pub(crate) struct Sessions {
    pub(crate) settings: ZkSettings,
    current: Mutex<Option<Arc<Session>>>,
    opening: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Opens the first session (eagerly, so that an unreachable ensemble is
    /// reported by `connect`).
    pub(crate) async fn connect(settings: ZkSettings) -> Result<Arc<Sessions>> {
        let sessions = Arc::new(Sessions {
            settings,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
        });
        sessions.session().await?;
        Ok(sessions)
    }

    fn live(&self) -> Option<Arc<Session>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|s| !s.has_ended())
            .cloned()
    }

    /// The live session, opening a new one if the last has ended.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let _opening = self.opening.lock().await;
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let session = Session::open(&self.settings).await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.clone());
        Ok(session)
    }
}

/// One ZooKeeper session and the locks held in it.
pub(crate) struct Session {
    pub(crate) client: Client,
    authenticated: bool,
    pub(crate) command_timeout: Duration,
    ended: AtomicBool,
    holdings: Mutex<HashMap<String, LossNotifier>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.client.session_id())
            .field("ended", &self.has_ended())
            .finish_non_exhaustive()
    }
}

impl Session {
    async fn open(settings: &ZkSettings) -> Result<Arc<Session>> {
        let what = format!("connect to {}", settings.cluster);
        let attempt = |left: Duration| {
            let mut connector = Client::connector()
                .with_session_timeout(settings.session_timeout)
                .with_connection_timeout(left)
                .with_fail_eagerly();
            if let Some(digest) = &settings.digest {
                connector = connector.with_auth("digest", digest.as_bytes());
            }
            let what = &what;
            async move {
                connector
                    .connect(&settings.cluster)
                    .await
                    .map_err(|error| map_error(what, error))
            }
        };
        // An ensemble still starting ("no available hosts" while its port
        // opens) is tried again within the connect timeout.
        let client = connect_retrying(BACKEND, &what, settings.connect_timeout, attempt).await?;
        let mut states = client.state_watcher();
        let session = Arc::new(Session {
            client,
            authenticated: settings.digest.is_some(),
            command_timeout: settings.command_timeout,
            ended: AtomicBool::new(false),
            holdings: Mutex::default(),
        });
        tracing::debug!(zk.session = ?session.client.session_id(), "session opened");
        let watched = Arc::downgrade(&session);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                match state {
                    SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                        if let Some(session) = watched.upgrade() {
                            session.end(state);
                        }
                        return;
                    }
                    SessionState::Disconnected => {
                        tracing::debug!("zookeeper session disconnected; not lost yet")
                    }
                    _ => {}
                }
            }
        });
        Ok(session)
    }

    /// Whether the session is over (expired, closed or refused).
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// The ACLs of the nodes this session creates.
    pub(crate) fn acls(&self) -> Acls<'static> {
        if self.authenticated {
            Acls::new(&DIGEST_ACLS)
        } else {
            Acls::anyone_all()
        }
    }

    /// Remembers a lock held in this session, to signal its loss.
    pub(crate) fn hold(&self, node: &str, lost: LossNotifier) {
        self.holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned(), lost);
    }

    /// Forgets a lock that is being released.
    pub(crate) fn forget(&self, node: &str) {
        self.holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node);
    }

    fn end(&self, state: SessionState) {
        self.ended.store(true, Ordering::SeqCst);
        let held: Vec<LossNotifier> = self
            .holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, lost)| lost)
            .collect();
        tracing::warn!(
            ?state,
            locks = held.len(),
            "zookeeper session ended; its locks are lost"
        );
        for lost in held {
            lost.mark_lost(LostReason::SessionExpired);
        }
    }

    /// Runs one request, bounded by the command timeout.
    pub(crate) async fn run<T>(
        &self,
        what: &str,
        request: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
    ) -> std::result::Result<T, RequestError> {
        match tokio::time::timeout(self.command_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(RequestError::Server(what.to_owned(), error)),
            Err(_) => Err(RequestError::TimedOut(
                what.to_owned(),
                self.command_timeout,
            )),
        }
    }
}

/// A failed request: the server's error (which callers may inspect, e.g.
/// `NoNode`), or no answer in time.
#[derive(Debug)]
pub(crate) enum RequestError {
    Server(String, zookeeper_client::Error),
    TimedOut(String, Duration),
}

impl RequestError {
    /// Whether the request may have reached the server without us seeing the answer.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            RequestError::TimedOut(..) => true,
            RequestError::Server(_, error) => crate::error::is_connection_failure(error),
        }
    }
}

impl From<RequestError> for LockError {
    fn from(error: RequestError) -> LockError {
        match error {
            RequestError::Server(what, error) => map_error(&what, error),
            RequestError::TimedOut(what, limit) => crate::error::timed_out(&what, limit),
        }
    }
}
