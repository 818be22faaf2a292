//! A contender's node in a lock's queue: our place until granted, and its
//! removal when the attempt ends without the lock.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::Backoff;
use zookeeper_client::Error as ZkError;

use crate::session::{RequestError, Session};

/// Between the retries of a lock node's delete while its session lives.
const DELETE_RETRY: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));

/// Our lock node.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) path: String,
    pub(crate) name: String,
    pub(crate) czxid: i64,
    /// A create was retried after an unknown outcome: a second node of ours
    /// may exist, and leaving must remove it too.
    pub(crate) in_doubt: bool,
}

impl Node {
    /// The node a create of `<path>` (`path` is `<dir>/<prefix>`) made, from
    /// its answer.
    pub(crate) fn created(
        path: &str,
        prefix: &str,
        stat: &zookeeper_client::Stat,
        sequence: zookeeper_client::CreateSequence,
        in_doubt: bool,
    ) -> Node {
        Node {
            path: format!("{path}{sequence}"),
            name: format!("{prefix}{sequence}"),
            czxid: stat.czxid,
            in_doubt,
        }
    }
}

/// Our place in the queue until the lock is granted: unless granted, it is
/// removed when the attempt ends — at once on timeout, in the background if
/// the acquire future is dropped. Before the node's path is known (the create
/// is in flight, or its outcome was lost), every node with our owner prefix is
/// removed; ZooKeeper answers one session's requests in order, so the cleanup
/// sees the create.
pub(crate) struct Queued {
    session: Arc<Session>,
    dir: String,
    prefix: String,
    path: Option<String>,
    in_doubt: bool,
    armed: bool,
}

impl Queued {
    pub(crate) fn new(session: Arc<Session>, dir: &str, prefix: &str) -> Self {
        Queued {
            session,
            dir: dir.to_owned(),
            prefix: prefix.to_owned(),
            path: None,
            in_doubt: true,
            armed: true,
        }
    }

    pub(crate) fn created(&mut self, node: &Node) {
        self.path = Some(node.path.clone());
        self.in_doubt = node.in_doubt;
    }

    /// The create failed for certain: there is nothing to remove.
    pub(crate) fn none_created(&mut self) {
        self.armed = false;
    }

    /// The lock is ours; returns the owner prefix if a twin node may exist.
    pub(crate) fn granted(&mut self) -> Option<String> {
        self.armed = false;
        self.in_doubt.then(|| self.prefix.clone())
    }

    fn cleanup(&mut self) -> Option<Removal> {
        if !std::mem::take(&mut self.armed) {
            return None;
        }
        let prefix = (self.in_doubt || self.path.is_none()).then(|| self.prefix.clone());
        Some(Removal {
            session: self.session.clone(),
            dir: self.dir.clone(),
            path: self.path.take(),
            prefix,
        })
    }

    pub(crate) async fn leave(&mut self) {
        if let Some(removal) = self.cleanup() {
            removal.run().await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(removal) = self.cleanup()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(removal.run());
        }
    }
}

/// Nodes of ours to delete: `path`, and with `prefix` every other node whose
/// name starts with it.
pub(crate) struct Removal {
    pub(crate) session: Arc<Session>,
    pub(crate) dir: String,
    pub(crate) path: Option<String>,
    pub(crate) prefix: Option<String>,
}

impl Removal {
    /// Deletes the nodes, retrying until they are gone or the session has
    /// ended: a node left behind would hold up the whole queue until the
    /// session expires.
    pub(crate) async fn run(self) {
        let Removal {
            session,
            dir,
            path,
            prefix,
        } = self;
        let mut paths: Vec<String> = path.into_iter().collect();
        if let Some(prefix) = prefix
            && let Ok(children) = session
                .run(
                    "list the lock's contenders",
                    session.client.list_children(&dir),
                )
                .await
        {
            for child in children.into_iter().filter(|c| c.starts_with(&prefix)) {
                let child = format!("{dir}/{child}");
                if !paths.contains(&child) {
                    paths.push(child);
                }
            }
        }
        for path in paths {
            let mut delays = DELETE_RETRY.delays();
            while !session.has_ended() {
                match session
                    .run("delete the lock node", session.client.delete(&path, None))
                    .await
                {
                    Ok(()) | Err(RequestError::Server(_, ZkError::NoNode)) => break,
                    Err(error) => {
                        tracing::warn!(zk.path = %path, ?error, "could not delete a lock node; retrying");
                        tokio::time::sleep(delays.next().unwrap_or(DELETE_RETRY.max())).await;
                    }
                }
            }
        }
    }
}
