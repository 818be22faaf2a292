//! The lock node behind a guard: its check and its release.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::Lease;
use zookeeper_client::Error as ZkError;

use crate::error::BACKEND;
use crate::node::Removal;
use crate::session::{RequestError, Session};

/// The lock node behind a guard.
#[derive(Debug)]
pub(crate) struct ZkLease {
    pub(crate) session: Arc<Session>,
    pub(crate) path: String,
    /// The owner prefix, when a retried create may have left a twin node.
    pub(crate) twins: Option<String>,
}

impl ZkLease {
    fn dir(&self) -> String {
        self.path
            .rsplit_once('/')
            .map_or("", |(dir, _)| dir)
            .to_owned()
    }
}

#[lockkit_core::async_trait]
impl Lease for ZkLease {
    fn backend_name(&self) -> &'static str {
        BACKEND
    }

    /// Re-validates that our node still exists in our session (ZooKeeper keeps
    /// the lock as long as the session lives; the TTL is the client's bound).
    async fn extend(&self, _ttl: Duration) -> Result<bool> {
        if self.session.has_ended() {
            return Ok(false);
        }
        let stat = self
            .session
            .run(
                "check the lock node",
                self.session.client.check_stat(&self.path),
            )
            .await?;
        Ok(stat.is_some_and(|stat| stat.ephemeral_owner == self.session.client.session_id().0))
    }

    async fn release(&self) -> Result<bool> {
        self.session.forget(&self.path);
        if self.session.has_ended() {
            return Ok(false);
        }
        let deleted = self
            .session
            .run(
                "delete the lock node",
                self.session.client.delete(&self.path, None),
            )
            .await;
        if self.twins.is_some() || deleted.is_err() {
            // Twins, or a failed delete: keep at it in the background, as a
            // node left behind would block the queue.
            tokio::spawn(
                Removal {
                    session: self.session.clone(),
                    dir: self.dir(),
                    path: Some(self.path.clone()),
                    prefix: self.twins.clone(),
                }
                .run(),
            );
        }
        match deleted {
            Ok(()) => Ok(true),
            Err(RequestError::Server(_, ZkError::NoNode)) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }
}
