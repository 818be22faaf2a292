//! One shared subscriber connection per client that wakes the waiters of a
//! name when its holder publishes the release.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use lockkit_core::{NotifyHub, ReleaseWatch};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, PushInfo, PushKind, RedisError, Value};

pub(crate) struct Notifications {
    hub: NotifyHub,
    conn: ConnectionManager,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE so that they reach the server in the
    /// order the hub's topics were created and removed.
    serial: tokio::sync::Mutex<()>,
    address: String,
    command_timeout: Duration,
    linger: Duration,
}

impl Notifications {
    /// Sets up the subscriber; its connection opens on first use.
    pub(crate) fn new(
        resp3_client: Client,
        config: ConnectionManagerConfig,
        address: String,
        command_timeout: Duration,
        linger: Duration,
    ) -> Result<Arc<Self>, RedisError> {
        let this: Arc<OnceLock<Weak<Notifications>>> = Arc::default();
        let hook_target = this.clone();
        let hub = NotifyHub::with_idle_hook(move |channel| {
            if let Some(notifications) = hook_target.get().and_then(Weak::upgrade) {
                notifications.unsubscribe_later(channel);
            }
        });
        let push_hub = hub.clone();
        let config = config
            .set_push_sender(move |push: PushInfo| {
                dispatch(&push_hub, push);
                Ok::<(), std::convert::Infallible>(())
            })
            .set_automatic_resubscription();
        let conn = ConnectionManager::new_lazy_with_config(resp3_client, config)?;
        let notifications = Arc::new(Notifications {
            hub,
            conn,
            serial: tokio::sync::Mutex::new(()),
            address,
            command_timeout,
            linger,
        });
        let _ = this.set(Arc::downgrade(&notifications));
        Ok(notifications)
    }

    /// A watch on `channel`, subscribing on the server if this is its first
    /// watcher. Cancel-safe: a subscription that did not complete is forgotten,
    /// so that the next waiter subscribes again.
    pub(crate) async fn watch(&self, channel: &str) -> ReleaseWatch {
        let (watch, new) = self.hub.watch(channel);
        if !new {
            return watch;
        }
        let mut pending = PendingTopic {
            hub: &self.hub,
            channel,
            watch: Some(watch),
        };
        let _serial = self.serial.lock().await;
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.command_timeout, conn.subscribe(channel)).await {
            Ok(Ok(())) => pending.watch.take().unwrap_or_else(ReleaseWatch::none),
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no reply within {:?}", self.command_timeout),
                };
                tracing::warn!(redis.address = %self.address, error = %why,
                    "cannot subscribe to release notifications; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }

    fn unsubscribe_later(self: Arc<Self>, channel: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let channel = channel.to_owned();
        let weak = Arc::downgrade(&self);
        drop(self);
        runtime.spawn(async move {
            let linger = match weak.upgrade() {
                Some(this) => this.linger,
                None => return,
            };
            tokio::time::sleep(linger).await;
            let Some(this) = weak.upgrade() else { return };
            let _serial = this.serial.lock().await;
            if this.hub.remove_if_idle(&channel) {
                let mut conn = this.conn.clone();
                let _ =
                    tokio::time::timeout(this.command_timeout, conn.unsubscribe(&channel)).await;
            }
        });
    }
}

/// A topic whose server subscription is not confirmed yet: unless its watch is
/// taken out, dropping it forgets the topic again.
struct PendingTopic<'a> {
    hub: &'a NotifyHub,
    channel: &'a str,
    watch: Option<ReleaseWatch>,
}

impl Drop for PendingTopic<'_> {
    fn drop(&mut self) {
        if self.watch.take().is_some() {
            self.hub.remove_if_idle(self.channel);
        }
    }
}

fn dispatch(hub: &NotifyHub, push: PushInfo) {
    match push.kind {
        PushKind::Message => {
            if let Some(Value::BulkString(channel)) = push.data.first()
                && let Ok(channel) = std::str::from_utf8(channel)
            {
                hub.notify(channel);
            }
        }
        // Messages may have been missed while disconnected: let every waiter retry.
        PushKind::Disconnection => hub.notify_all(),
        _ => {}
    }
}
