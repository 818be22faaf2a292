//! Release notifications on PostgreSQL: one `LISTEN` connection per client.

use std::sync::Mutex;
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::task::AbortHandle;

use crate::settings::Settings;

/// One `LISTEN` connection per client, started on first use, that wakes the
/// waiters of a name when its holder's release sends `NOTIFY`. It comes from
/// a pool of its own, so that it never takes a connection from the
/// statements.
#[derive(Debug)]
pub(super) struct PgNotifications {
    options: PgConnectOptions,
    hub: NotifyHub,
    /// `true` once `LISTEN` is in place; the task behind it.
    state: Mutex<Option<(tokio::sync::watch::Receiver<bool>, AbortHandle)>>,
}

impl PgNotifications {
    pub(super) fn new(options: PgConnectOptions) -> Self {
        PgNotifications {
            options,
            hub: NotifyHub::new(),
            state: Mutex::new(None),
        }
    }

    /// A watch on `name`; inactive (the waiter falls back to backoff and the
    /// holder's expiry) when `LISTEN` cannot be set up in time.
    pub(super) async fn watch(
        &self,
        channel: &str,
        settings: &Settings,
        name: &str,
    ) -> ReleaseWatch {
        let mut listening = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let (listening, _) = state.get_or_insert_with(|| {
                let (tx, rx) = tokio::sync::watch::channel(false);
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(settings.connect_timeout)
                    .connect_lazy_with(self.options.clone());
                let task = tokio::spawn(listen(pool, channel.to_owned(), self.hub.clone(), tx));
                (rx, task.abort_handle())
            });
            listening.clone()
        };
        let (watch, _) = self.hub.watch(name);
        let ready = tokio::time::timeout(settings.command_timeout, listening.wait_for(|on| *on));
        match ready.await {
            Ok(Ok(_)) => watch,
            _ => {
                tracing::warn!(postgres.address = %settings.address, "LISTEN is not set up; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }
}

impl Drop for PgNotifications {
    fn drop(&mut self) {
        if let Some((_, task)) = self.state.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// The listener task: `LISTEN channel`, then dispatch each notification's
/// payload (the lock name). After a lost connection every waiter is woken, as
/// notifications may have been missed; sqlx reconnects and listens again.
async fn listen(
    pool: PgPool,
    channel: String,
    hub: NotifyHub,
    listening: tokio::sync::watch::Sender<bool>,
) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen(&channel).await {
            tracing::debug!(%error, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        listening.send_replace(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    hub.notify(notification.payload());
                }
                Ok(None) => {
                    // The connection was lost; the next call reconnects.
                    hub.notify_all();
                }
                Err(error) => {
                    tracing::debug!(%error, "the LISTEN connection failed; reconnecting");
                    hub.notify_all();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
