//! ZooKeeper sessions: one at a time per client, replaced after it ends, and
//! the lost signal for every lock held in a session that ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

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
    /// Nodes of holdings given up while the connection was gone (their
    /// session may still live): deleted once it is back.
    orphans: Mutex<Vec<String>>,
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
        let (client, connection_timeout) =
            connect_retrying(BACKEND, &what, settings.connect_timeout, |left| {
                let connected = attempt(left);
                async move { connected.await.map(|client| (client, left)) }
            })
            .await?;
        let states = client.state_watcher();
        let trust = trust_after_disconnection(client.session_timeout(), connection_timeout);
        let session = Arc::new(Session {
            client,
            authenticated: settings.digest.is_some(),
            command_timeout: settings.command_timeout,
            ended: AtomicBool::new(false),
            holdings: Mutex::default(),
            orphans: Mutex::default(),
        });
        tracing::debug!(zk.session = ?session.client.session_id(), ?trust, "session opened");
        tokio::spawn(watch_states(Arc::downgrade(&session), states, trust));
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

    /// Tells every lock held that it is at risk (the session is
    /// disconnected: Curator's SUSPENDED) or confirmed again.
    fn set_at_risk(&self, on: bool) {
        let held = self.holdings.lock().unwrap_or_else(|p| p.into_inner());
        for lost in held.values() {
            lost.set_at_risk(on);
        }
    }

    /// Signals the loss of every lock held; returns their nodes.
    fn lose_holdings(&self) -> Vec<String> {
        let held: Vec<(String, LossNotifier)> = self
            .holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        held.into_iter()
            .map(|(node, lost)| {
                lost.mark_lost(LostReason::SessionExpired);
                node
            })
            .collect()
    }

    /// Ends the session once (its state watcher, or a request answered
    /// "session expired", whichever tells first).
    fn end(&self, state: SessionState) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        let lost = self.lose_holdings();
        tracing::warn!(
            ?state,
            locks = lost.len(),
            "zookeeper session ended; its locks are lost"
        );
    }

    /// Out of touch so long that the servers may have expired the session
    /// (and granted its locks to others): its holders are told now, and
    /// their nodes are deleted if the session comes back.
    fn give_up_holdings(&self, disconnected_for: Duration) {
        let lost = self.lose_holdings();
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            zk.session = ?self.client.session_id(),
            locks = lost.len(),
            ?disconnected_for,
            "zookeeper connection lost for so long that the session may have expired; its locks are lost"
        );
        self.orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(lost);
    }

    /// Deletes the nodes of holdings given up while disconnected, now that
    /// the session is back (a failed delete is tried again at the next
    /// reconnection; the session's end removes them anyway).
    async fn delete_orphans(&self) {
        let orphans = std::mem::take(&mut *self.orphans.lock().unwrap_or_else(|p| p.into_inner()));
        let mut left = Vec::new();
        for node in orphans {
            match self
                .run(
                    "delete a given-up lock node",
                    self.client.delete(&node, None),
                )
                .await
            {
                Ok(()) | Err(RequestError::Server(_, zookeeper_client::Error::NoNode)) => {
                    tracing::debug!(zk.path = %node, "deleted the node of a given-up lock");
                }
                Err(error) => {
                    tracing::warn!(zk.path = %node, ?error, "could not delete the node of a given-up lock");
                    left.push(node);
                }
            }
        }
        self.orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(left);
    }

    /// Runs one request, bounded by the command timeout.
    pub(crate) async fn run<T>(
        &self,
        what: &str,
        request: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
    ) -> std::result::Result<T, RequestError> {
        match tokio::time::timeout(self.command_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                // The client may answer so before its state watcher says so:
                // the session is over now, for the next acquire too.
                if error == zookeeper_client::Error::SessionExpired {
                    self.end(SessionState::Expired);
                }
                Err(RequestError::Server(what.to_owned(), error))
            }
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

/// How long after zookeeper-client reports a lost connection the session can
/// still be counted on. The servers expire a session `session_timeout` after
/// they last heard from it; zookeeper-client reports the loss once it has
/// heard nothing for 8 ticks, checking every tick (a tick is a twentieth of
/// the session timeout, or an eighth of the connection timeout when that is
/// under three fifths of it: zookeeper-client 0.11's `calc_tick_timeout`). So
/// the session may be gone `session_timeout - 9 ticks` after the report; one
/// tick less leaves room for the servers' own clock.
pub(crate) fn trust_after_disconnection(
    session_timeout: Duration,
    connection_timeout: Duration,
) -> Duration {
    let tick = if connection_timeout.is_zero() || connection_timeout > session_timeout * 3 / 5 {
        session_timeout / 20
    } else {
        connection_timeout / 8
    }
    .max(Duration::from_millis(1));
    session_timeout.saturating_sub(tick * 10)
}

/// Follows a session's states: its end signals every lock's loss; a lost
/// connection that is not back within `trust` gives the locks up (ZooKeeper
/// may have expired the session meanwhile; a client cut off can only tell by
/// its clock), and their nodes are deleted when it is back.
async fn watch_states(
    watched: std::sync::Weak<Session>,
    mut states: zookeeper_client::StateWatcher,
    trust: Duration,
) {
    let mut disconnected: Option<Instant> = None;
    loop {
        let state = match disconnected {
            Some(since) => match tokio::time::timeout_at(since + trust, states.changed()).await {
                Ok(state) => state,
                Err(_) => {
                    let Some(session) = watched.upgrade() else {
                        return;
                    };
                    session.give_up_holdings(since.elapsed());
                    // Given up once per disconnection.
                    disconnected = None;
                    continue;
                }
            },
            None => states.changed().await,
        };
        let Some(session) = watched.upgrade() else {
            return;
        };
        match state {
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                session.end(state);
                return;
            }
            SessionState::Disconnected => {
                tracing::debug!(?trust, "zookeeper session disconnected; not lost yet");
                disconnected.get_or_insert_with(Instant::now);
                session.set_at_risk(true);
            }
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                disconnected = None;
                session.set_at_risk(false);
                tokio::spawn(async move { session.delete_orphans().await });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_ends_before_the_servers_can_expire_the_session() {
        let ms = Duration::from_millis;
        // Tick = session timeout / 20 (a long connection timeout).
        assert_eq!(trust_after_disconnection(ms(2_000), ms(10_000)), ms(1_000));
        // Tick = connection timeout / 8.
        assert_eq!(trust_after_disconnection(ms(10_000), ms(4_000)), ms(5_000));
        // At three fifths of the session timeout, detection takes most of it.
        assert_eq!(trust_after_disconnection(ms(10_000), ms(6_000)), ms(2_500));
        assert_eq!(trust_after_disconnection(ms(1), ms(0)), Duration::ZERO);
    }
}
