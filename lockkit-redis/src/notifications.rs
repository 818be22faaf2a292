//! One shared subscriber connection per client that wakes the waiters of a
//! name when its holder publishes the release.
//!
//! The subscriber talks to one server: the single server; in Redis Cluster
//! with sharded pub/sub (`SSUBSCRIBE`, Redis 7) the master of each channel's
//! slot, through a cluster connection that follows the slots; in Redis
//! Cluster without it one of the seed nodes (a `PUBLISH` reaches every node
//! of a cluster), the next one after a failed subscription; with Sentinel
//! the current master, followed across failovers. Wherever it cannot
//! subscribe, waiters fall back to polling (backoff and the holder's TTL).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, PushInfo, PushKind, RedisError, Value};

use crate::sentinel::{MasterAddr, Resolver};

/// Where the subscriber connects.
pub(crate) enum Target {
    /// One server.
    Fixed(Box<Client>),
    /// Any of these cluster nodes, tried in turn.
    Seeds(Vec<Client>),
    /// The whole cluster, subscribed with `SSUBSCRIBE` on the master of each
    /// channel's slot (its client built with [`Notifications::new`]'s push
    /// sender).
    Shards(Box<ClusterClient>),
    /// The master the sentinels name (connection settings from the
    /// resolver, with RESP3).
    Sentinel(Arc<Resolver>),
}

/// The subscriber connection and what is subscribed on it; guarded by one
/// mutex, which also serialises SUBSCRIBE and UNSUBSCRIBE so that they reach
/// the server in the order the hub's topics were created and removed.
#[derive(Default)]
struct Subscriber {
    /// The connection and the target it goes to.
    conn: Option<(String, Subscription)>,
    /// Channels subscribed on the server (to subscribe again on a new target).
    channels: HashSet<String>,
    /// The next cluster seed to try.
    next_seed: usize,
}

/// The last message of each subscribed channel that said more than that
/// a release happened: a granted turn (see [`crate::turns`]), until its
/// waiter takes it. One per channel, dropped with the subscription.
type Mailbox = Arc<std::sync::Mutex<HashMap<String, String>>>;

/// The turn channels of the places in line kept for this client (see
/// `crate::places`), each with where to say that a message came on it:
/// the first message there, before an acquisition takes the place over,
/// is the place's turn (or its reservation), which the client then gives
/// up. An entry goes with its first message, or when the subscriber's
/// connection drops (a turn may have been missed).
type KeptTurns = Arc<std::sync::Mutex<HashMap<String, KeptTurn>>>;

/// Where [`KeptTurns`] says that a kept place's turn came: the place's lock key
/// is sent to its client's keeper.
pub(crate) struct KeptTurn {
    pub(crate) lock: String,
    pub(crate) tell: tokio::sync::mpsc::UnboundedSender<String>,
}

impl KeptTurn {
    /// Tells the keeper that this place's turn may have come.
    fn told(self) {
        let _ = self.tell.send(self.lock);
    }
}

pub(crate) struct Notifications {
    hub: NotifyHub,
    mailbox: Mailbox,
    kept: KeptTurns,
    subscriber: tokio::sync::Mutex<Subscriber>,
    target: Target,
    config: ConnectionManagerConfig,
    address: String,
    command_timeout: Duration,
    linger: Duration,
    /// The channels whose watchers are all gone, each with the instant its
    /// subscription may go (its last watcher's end plus `linger`): one
    /// task per channel waits for that instant, however often the channel
    /// goes idle and busy again meanwhile (see `unsubscribe_later`).
    lingering: std::sync::Mutex<HashMap<String, tokio::time::Instant>>,
}

/// The subscriber's connection: to one server, or to a cluster's shards.
#[derive(Clone)]
enum Subscription {
    Server(ConnectionManager),
    Shards(ClusterConnection),
}

impl Subscription {
    async fn subscribe(&mut self, channels: &[&str]) -> Result<(), RedisError> {
        match self {
            Subscription::Server(conn) => conn.subscribe(channels).await,
            Subscription::Shards(conn) => conn.ssubscribe(channels).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Subscription::Server(conn) => conn.unsubscribe(channel).await,
            Subscription::Shards(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// What the subscriber's connection hands each message to.
pub(crate) type PushSender =
    Arc<dyn Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync>;

impl Notifications {
    /// Sets up the subscriber; its connection opens on first use. With a
    /// Sentinel target (and a runtime), a task follows the master.
    /// `target` is given the function that every message pushed to the
    /// subscriber must reach, for a target whose client needs it.
    pub(crate) fn new(
        target: impl FnOnce(PushSender) -> lockkit_core::Result<Target>,
        config: ConnectionManagerConfig,
        address: String,
        command_timeout: Duration,
        linger: Duration,
    ) -> lockkit_core::Result<Arc<Self>> {
        let this: Arc<OnceLock<Weak<Notifications>>> = Arc::default();
        let hook_target = this.clone();
        let hub = NotifyHub::with_idle_hook(move |channel| {
            if let Some(notifications) = hook_target.get().and_then(Weak::upgrade) {
                notifications.unsubscribe_later(channel);
            }
        });
        let push_hub = hub.clone();
        let mailbox = Mailbox::default();
        let push_mailbox = mailbox.clone();
        let kept = KeptTurns::default();
        let push_kept = kept.clone();
        let push: PushSender = Arc::new(move |push: PushInfo| {
            dispatch(&push_hub, &push_mailbox, &push_kept, push);
            Ok(())
        });
        let target = target(push.clone())?;
        let config = config
            .set_push_sender(move |info: PushInfo| push(info))
            .set_automatic_resubscription();
        let notifications = Arc::new(Notifications {
            hub,
            mailbox,
            kept,
            subscriber: tokio::sync::Mutex::default(),
            target,
            config,
            address,
            command_timeout,
            linger,
            lingering: std::sync::Mutex::default(),
        });
        let _ = this.set(Arc::downgrade(&notifications));
        if let Target::Sentinel(resolver) = &notifications.target
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(follow_master(
                resolver.changes(),
                Arc::downgrade(&notifications),
            ));
        }
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
        let mut subscriber = self.subscriber.lock().await;
        let subscribed = tokio::time::timeout(self.command_timeout, async {
            let mut conn = self.connection(&mut subscriber).await?;
            conn.subscribe(&[channel]).await
        })
        .await;
        match subscribed {
            Ok(Ok(())) => {
                subscriber.channels.insert(channel.to_owned());
                pending.watch.take().unwrap_or_else(ReleaseWatch::none)
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no reply within {:?}", self.command_timeout),
                };
                if matches!(self.target, Target::Seeds(_)) {
                    // Try the next seed next time.
                    subscriber.conn = None;
                    subscriber.next_seed += 1;
                }
                tracing::warn!(redis.address = %self.address, error = %why,
                    "cannot subscribe to release notifications; waiting by polling");
                ReleaseWatch::none()
            }
        }
    }

    /// A watch of `channel` if the server has its subscription already (see
    /// `LeaseBackend::live_watch`); `None` when it has not, or while the
    /// subscriber is busy subscribing or unsubscribing.
    pub(crate) fn live_watch(&self, channel: &str) -> Option<ReleaseWatch> {
        let subscriber = self.subscriber.try_lock().ok()?;
        if !subscriber.channels.contains(channel) {
            return None;
        }
        // A subscribed channel's topic goes only under the subscriber's
        // lock (`unsubscribe_later`), so it is there.
        let (watch, new) = self.hub.watch(channel);
        (!new).then_some(watch)
    }

    /// The message `channel` left for its waiter, if any (see [`Mailbox`]).
    pub(crate) fn take_message(&self, channel: &str) -> Option<String> {
        lock(&self.mailbox).remove(channel)
    }

    /// As [`take_message`](Self::take_message), leaving the message
    /// where it is.
    pub(crate) fn message(&self, channel: &str) -> Option<String> {
        lock(&self.mailbox).get(channel).cloned()
    }

    /// Marks `channel` as the turn channel of a kept place (see
    /// [`KeptTurns`]); or, where the mailbox holds a message of that
    /// channel already (the place's turn came before it was marked), tells
    /// `turn` at once. Checked with the marks locked, and a message is in
    /// the mailbox before its channel's mark is looked up (see
    /// `dispatch`): a turn's message is told once, however the two meet.
    pub(crate) fn mark_kept(&self, channel: String, turn: KeptTurn) {
        let mut kept = lock(&self.kept);
        if lock(&self.mailbox).contains_key(&channel) {
            drop(kept);
            turn.told();
            return;
        }
        kept.insert(channel, turn);
    }

    /// Unmarks `channel` (see [`mark_kept`](Self::mark_kept)); false if it
    /// was no longer marked (its turn came, or the connection dropped).
    pub(crate) fn unmark_kept(&self, channel: &str) -> bool {
        lock(&self.kept).remove(channel).is_some()
    }

    /// The subscriber connection to the current target: the existing one,
    /// or a new one on which every known channel is subscribed again.
    async fn connection(&self, subscriber: &mut Subscriber) -> Result<Subscription, RedisError> {
        // Outside Sentinel (whose master may change) the connection stays
        // once made: it reconnects by itself, and a cluster connection
        // subscribes again on whichever node serves a slot after a change.
        // (A seed whose subscription failed is dropped in `watch`.)
        if !matches!(self.target, Target::Sentinel(_))
            && let Some((_, conn)) = &subscriber.conn
        {
            return Ok(conn.clone());
        }
        let (key, client) = match &self.target {
            Target::Fixed(client) => (String::new(), Client::clone(client)),
            Target::Shards(client) => {
                let conn = Subscription::Shards(client.get_async_connection().await?);
                subscriber.conn = Some((String::new(), conn.clone()));
                return Ok(conn);
            }
            Target::Seeds(clients) => {
                let index = subscriber.next_seed % clients.len();
                (format!("seed {index}"), clients[index].clone())
            }
            Target::Sentinel(resolver) => {
                let master = match resolver.known_master() {
                    Some(master) => master,
                    None => resolver.resolve().await?,
                };
                let key = master_key(&master);
                match &subscriber.conn {
                    Some((current, conn)) if *current == key => return Ok(conn.clone()),
                    _ => {}
                }
                let info = resolver.node_info(&master);
                let resp3 = info
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3);
                (key, Client::open(info.set_redis_settings(resp3))?)
            }
        };
        let conn = Subscription::Server(ConnectionManager::new_lazy_with_config(
            client,
            self.config.clone(),
        )?);
        subscriber.conn = Some((key, conn.clone()));
        if !subscriber.channels.is_empty() {
            let channels: Vec<&str> = subscriber.channels.iter().map(String::as_str).collect();
            let mut resubscribe = conn.clone();
            if let Err(error) = resubscribe.subscribe(&channels).await {
                tracing::warn!(redis.address = %self.address, %error,
                    "cannot subscribe again after a change of server; waiting by polling");
            }
            // Releases may have been missed meanwhile: let every waiter retry.
            self.hub.notify_all();
        }
        Ok(conn)
    }

    /// Moves the subscriptions to the master the sentinels name now.
    async fn retarget(&self) {
        let mut subscriber = self.subscriber.lock().await;
        if subscriber.conn.is_none() && subscriber.channels.is_empty() {
            return;
        }
        let _ = tokio::time::timeout(self.command_timeout, self.connection(&mut subscriber)).await;
    }

    /// Unsubscribes from `channel` once it has had no watcher for
    /// `linger`. Called whenever its last watcher goes: a waiter that
    /// acquires drops its watch, so on a busy name this happens at every
    /// grant. One task per channel waits (spawning one per call would cost
    /// a spawn, a timer and a wake-up of another worker thread per grant);
    /// a later call only moves the instant it waits for.
    fn unsubscribe_later(self: Arc<Self>, channel: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut at = tokio::time::Instant::now() + self.linger;
        {
            let mut lingering = lock(&self.lingering);
            if let Some(until) = lingering.get_mut(channel) {
                *until = at;
                return;
            }
            lingering.insert(channel.to_owned(), at);
        }
        let mut linger = Linger {
            notifications: Arc::downgrade(&self),
            channel: channel.to_owned(),
            waiting: true,
        };
        drop(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep_until(at).await;
                let Some(this) = linger.notifications.upgrade() else {
                    return;
                };
                let later = {
                    let mut lingering = lock(&this.lingering);
                    match lingering.get(&linger.channel) {
                        Some(&until) if until > at => Some(until),
                        _ => {
                            lingering.remove(&linger.channel);
                            None
                        }
                    }
                };
                match later {
                    Some(until) => at = until,
                    None => {
                        linger.waiting = false;
                        return this.unsubscribe_if_idle(&linger.channel).await;
                    }
                }
            }
        });
    }

    /// Unsubscribes from `channel` unless it has watchers again.
    async fn unsubscribe_if_idle(&self, channel: &str) {
        let mut subscriber = self.subscriber.lock().await;
        if self.hub.remove_if_idle(channel) {
            subscriber.channels.remove(channel);
            lock(&self.mailbox).remove(channel);
            if let Some((_, conn)) = &subscriber.conn {
                let mut conn = conn.clone();
                let _ = tokio::time::timeout(self.command_timeout, conn.unsubscribe(channel)).await;
            }
        }
    }
}

/// The task of a lingering channel (see `Notifications::unsubscribe_later`).
/// Dropped while it waits (its runtime shut down), it takes the channel's
/// entry with it, so that the channel's next idle time starts a task again.
struct Linger {
    notifications: Weak<Notifications>,
    channel: String,
    waiting: bool,
}

impl Drop for Linger {
    fn drop(&mut self) {
        if self.waiting
            && let Some(notifications) = self.notifications.upgrade()
        {
            lock(&notifications.lingering).remove(&self.channel);
        }
    }
}

fn master_key(master: &MasterAddr) -> String {
    format!("{}:{}", master.0, master.1)
}

/// Follows the sentinels' master: on every change, the subscriptions move.
async fn follow_master(
    mut changes: tokio::sync::watch::Receiver<Option<MasterAddr>>,
    notifications: Weak<Notifications>,
) {
    while changes.changed().await.is_ok() {
        let Some(notifications) = notifications.upgrade() else {
            return;
        };
        notifications.retarget().await;
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

/// Locks `mutex`, also when a thread panicked while it held it (what it
/// guards is left consistent at every step).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wakes the watchers of a message's channel, after leaving a message with
/// more to say than "released" in the mailbox (of a subscribed channel
/// only: the mailbox stays as bounded as the subscriptions).
fn dispatch(hub: &NotifyHub, mailbox: &Mailbox, kept: &KeptTurns, push: PushInfo) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(channel)) = push.data.first()
                && let Ok(channel) = std::str::from_utf8(channel)
            {
                match push.data.get(1) {
                    // In the mailbox before the waiter wakes, and out again
                    // if nobody watches the channel.
                    Some(Value::BulkString(message)) if !message.is_empty() => {
                        let message = String::from_utf8_lossy(message).into_owned();
                        lock(mailbox).insert(channel.to_owned(), message);
                        if !hub.notify(channel) {
                            lock(mailbox).remove(channel);
                        }
                    }
                    _ => {
                        hub.notify(channel);
                    }
                }
                // After the mailbox: a keeper that gives the turn up takes
                // its message out (see `crate::places`).
                if let Some(turn) = lock(kept).remove(channel) {
                    turn.told();
                }
            }
        }
        // Messages may have been missed while disconnected: let every waiter
        // retry, and give up the kept places, whose turns may have come.
        PushKind::Disconnection => {
            for (_, turn) in lock(kept).drain() {
                turn.told();
            }
            hub.notify_all();
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notifications whose subscriber never connects (nothing here
    /// subscribes on a server), lingering `linger`.
    fn notifications(linger: Duration) -> Arc<Notifications> {
        Notifications::new(
            |_| {
                Ok(Target::Fixed(Box::new(
                    Client::open("redis://127.0.0.1:1").expect("a client"),
                )))
            },
            ConnectionManagerConfig::new(),
            "127.0.0.1:1".to_owned(),
            Duration::from_secs(1),
            linger,
        )
        .expect("notifications")
    }

    fn lingers(notifications: &Notifications, channel: &str) -> bool {
        lock(&notifications.lingering).contains_key(channel)
    }

    /// A channel that goes idle at every grant has one task waiting to
    /// unsubscribe it, not one per grant; the wait counts from the last
    /// time it went idle, and then the channel goes.
    #[tokio::test(start_paused = true)]
    async fn one_task_waits_per_idle_channel_from_its_last_idle_time() {
        let notifications = notifications(Duration::from_secs(10));
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        for _ in 0..100 {
            let (watch, _) = notifications.hub.watch("c");
            drop(watch);
        }
        assert_eq!(tasks(), before + 1, "one task for the channel");
        assert!(lingers(&notifications, "c"));

        tokio::time::sleep(Duration::from_secs(6)).await;
        let (watch, new) = notifications.hub.watch("c");
        assert!(!new, "the topic is still there");
        drop(watch);
        // Past the first idle time's linger, within the last one's.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(lingers(&notifications, "c"));
        assert_eq!(notifications.hub.len(), 1, "the topic is still there");

        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!lingers(&notifications, "c"));
        assert!(notifications.hub.is_empty(), "the idle topic went");
        assert_eq!(tasks(), before, "the task ended");
    }

    /// A turn's message on `channel`, as the subscriber hands it over.
    fn message(channel: &str, text: &str) -> PushInfo {
        PushInfo {
            kind: PushKind::Message,
            data: vec![
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::BulkString(text.as_bytes().to_vec()),
            ],
        }
    }

    /// A kept place's turn channel, marked for `lock`: what its keeper is told.
    fn kept_turn(lock: &str) -> (KeptTurn, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (tell, told) = tokio::sync::mpsc::unbounded_channel();
        let turn = KeptTurn {
            lock: lock.to_owned(),
            tell,
        };
        (turn, told)
    }

    /// A kept place's turn is told to its keeper once, with its message in
    /// the mailbox by then, whether the message comes after the place's
    /// channel was marked or before (a release that came before the
    /// releasing client had marked its place): a turn the keeper is not
    /// told of would hold the lock until its lease ran out.
    #[tokio::test]
    async fn a_kept_turn_is_told_once_whenever_its_message_came() {
        let n = notifications(Duration::from_secs(10));
        let (_watch, _) = n.hub.watch("turn");

        let (turn, mut told) = kept_turn("lock");
        n.mark_kept("turn".to_owned(), turn);
        dispatch(&n.hub, &n.mailbox, &n.kept, message("turn", "1|0|o"));
        assert_eq!(told.try_recv().ok().as_deref(), Some("lock"));
        assert_eq!(n.message("turn").as_deref(), Some("1|0|o"));
        assert!(!n.unmark_kept("turn"), "told, and unmarked");

        n.take_message("turn");
        dispatch(&n.hub, &n.mailbox, &n.kept, message("turn", "2|0|p"));
        let (turn, mut told) = kept_turn("lock");
        n.mark_kept("turn".to_owned(), turn);
        assert_eq!(told.try_recv().ok().as_deref(), Some("lock"));
        assert!(!n.unmark_kept("turn"), "told at once, never marked");
        dispatch(&n.hub, &n.mailbox, &n.kept, message("turn", "3|0|q"));
        assert!(told.try_recv().is_err(), "told once");

        n.take_message("turn");
        let (turn, mut told) = kept_turn("lock");
        n.mark_kept("turn".to_owned(), turn);
        assert!(told.try_recv().is_err(), "no message, nothing told");
        assert!(n.unmark_kept("turn"), "still marked");
    }

    /// A channel watched again when its wait ends stays, and its next idle
    /// time starts a wait of its own.
    #[tokio::test(start_paused = true)]
    async fn a_channel_watched_again_stays_and_lingers_anew() {
        let notifications = notifications(Duration::from_secs(10));
        let (watch, _) = notifications.hub.watch("c");
        drop(watch);
        let (kept, _) = notifications.hub.watch("c");
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(!lingers(&notifications, "c"));
        assert_eq!(notifications.hub.len(), 1, "a watched topic stays");
        drop(kept);
        assert!(lingers(&notifications, "c"));
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(notifications.hub.is_empty());
    }
}
