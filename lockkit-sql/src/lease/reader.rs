//! A reader's attempt in `lease` mode, cancellation-safe: a token its
//! caller no longer takes leaves the group.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockkit_core::backend::Attempt;
use lockkit_core::{FencingToken, Result};

use super::rows::Rows;
use super::{LeaseDialect, LeaseRows};
use crate::finishing::Finishing;

/// A reader's token that no caller has taken yet: dropped, the reader
/// leaves its group (and gives up the identity record it took, if any).
struct Joined<D: LeaseDialect> {
    rows: Arc<Rows<D>>,
    name: String,
    token: Option<i64>,
    /// The identity record's row and stored owner, if this reader took it.
    record: Option<(String, String)>,
}

impl<D: LeaseDialect> Joined<D> {
    fn take(mut self) -> (i64, bool) {
        (
            self.token.take().unwrap_or_default(),
            self.record.take().is_some(),
        )
    }
}

impl<D: LeaseDialect> Drop for Joined<D> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (rows, name) = (self.rows.clone(), std::mem::take(&mut self.name));
        let record = self.record.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock.name = %name, "an abandoned shared acquire cannot be undone outside a runtime; its group ends with its TTL");
            return;
        };
        runtime.spawn(async move {
            if let Some((row, owner)) = record {
                let _ = rows.release_row(&row, &owner).await;
            }
            match rows.leave(&name, token).await {
                Ok(_) => tracing::debug!(lock.name = %name, "undid an abandoned shared acquire"),
                Err(error) => tracing::warn!(lock.name = %name, %error, "could not undo an abandoned shared acquire; its group ends with its TTL"),
            }
        });
    }
}

/// What a reader's attempt answers its caller.
enum Shared<D: LeaseDialect> {
    Joined(Joined<D>),
    Busy(Option<Duration>),
}

impl<D: LeaseDialect> LeaseRows<D> {
    /// A reader's attempt, cancellation-safe: an attempt its caller gives
    /// up on finishes in a task of its own, and a token its caller no
    /// longer takes leaves the group (a reader has no owner of its own in
    /// the row to undo by).
    /// A reader that records an identity (`record`: the record's row and
    /// the stored owner) then takes the record if no live reader has it.
    pub(super) async fn acquire_reader(
        &self,
        name: &str,
        waiting: &str,
        slot: &AtomicU64,
        ttl: Duration,
        record: Option<(&str, &str)>,
        recorded: &AtomicBool,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let (rows, name, waiting) = (self.rows.clone(), name.to_owned(), waiting.to_owned());
        let record = record.map(|(row, owner)| (row.to_owned(), owner.to_owned()));
        let join = async move {
            match rows.share_row(&name, &waiting, ttl).await? {
                Attempt::Acquired(token) => {
                    let mut joined = Joined {
                        rows: rows.clone(),
                        name,
                        token: Some(token.map_or(0, |t| t.get() as i64)),
                        record: None,
                    };
                    if let Some((row, owner)) = record {
                        // An error drops `joined`, which leaves the group.
                        if let Attempt::Acquired(_) = rows.acquire_row(&row, &owner, ttl).await? {
                            joined.record = Some((row, owner));
                        }
                    }
                    Ok(Shared::Joined(joined))
                }
                Attempt::Busy { retry_after } => Ok(Shared::Busy(retry_after)),
            }
        };
        // Given up, the attempt finishes in a task, where a `Joined` drops
        // and leaves.
        let answer = Finishing::new(join).await?;
        Ok(match answer {
            Shared::Joined(joined) => {
                let (token, took_record) = joined.take();
                recorded.store(took_record, Ordering::SeqCst);
                slot.store(token as u64, Ordering::SeqCst);
                Attempt::Acquired(Some(FencingToken::new(token as u64)))
            }
            Shared::Busy(retry_after) => Attempt::Busy { retry_after },
        })
    }
}
