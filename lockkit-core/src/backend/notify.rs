//! Release notifications: how a waiter learns that a lock was released.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;

use tokio::sync::watch;

/// A subscription to the release notifications of one lock name.
///
/// [`changed`](Self::changed) resolves when the backend reports a release (or
/// anything else that makes a new attempt worthwhile, such as a reconnect after
/// which messages may have been missed). A watch without a source never resolves,
/// so waiting falls back on the holder's expiry and the backoff.
pub struct ReleaseWatch {
    sources: Vec<watch::Receiver<u64>>,
    _registrations: Vec<Registration>,
    /// Whether it tells its waiter when its turn has come (see
    /// [`telling_turns`](ReleaseWatch::telling_turns)).
    turns: bool,
    /// What [`close`](ReleaseWatch::close) awaits.
    closings: Vec<Closing>,
}

/// A backend's clean-up that a waiter that gives up awaits (see
/// [`ReleaseWatch::closing_with`]).
type Closing = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

impl ReleaseWatch {
    /// A watch that never fires, for backends without notifications.
    pub fn none() -> Self {
        ReleaseWatch {
            sources: Vec::new(),
            _registrations: Vec::new(),
            turns: false,
            closings: Vec::new(),
        }
    }

    /// A watch that fires whenever the sender's value changes.
    pub fn from_receiver(rx: watch::Receiver<u64>) -> Self {
        ReleaseWatch {
            sources: vec![rx],
            _registrations: Vec::new(),
            turns: false,
            closings: Vec::new(),
        }
    }

    /// One watch that fires when any of `watches` does (e.g. the release
    /// channels of several servers that hold the same lock).
    pub fn merge(watches: impl IntoIterator<Item = ReleaseWatch>) -> Self {
        let mut merged = ReleaseWatch::none();
        for watch in watches {
            merged.sources.extend(watch.sources);
            merged._registrations.extend(watch._registrations);
            merged.turns |= watch.turns;
            merged.closings.extend(watch.closings);
        }
        merged
    }

    /// The same watch, marked as one that tells its waiter when its turn
    /// has come: the server keeps a line of waiting clients, hands a
    /// released lock to the first of them and wakes that one alone, and a
    /// refused attempt says how long the waiter's place lasts. After such a
    /// refusal the waiter sleeps until a notification or that time, rather
    /// than asking again on the backoff meanwhile: asking out of turn is
    /// refused anyway, and with many waiters it is most of the server's
    /// work.
    pub fn telling_turns(mut self) -> Self {
        self.turns = self.is_active();
        self
    }

    /// The same watch, with `close` run by [`close`](Self::close) once the
    /// watch has stopped: the backend's clean-up that a waiter that gives
    /// up awaits before its `acquire` returns (a place in a line on the
    /// server left, say), where dropping the watch would only start it. A
    /// watch that is just dropped (its waiter was granted, or cancelled)
    /// runs none. `close` should be bounded in time.
    pub fn closing_with<F, Fut>(mut self, close: F) -> Self
    where
        F: FnOnce() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.closings.push(Box::new(move || Box::pin(close())));
        self
    }

    /// Stops the watch, then awaits the clean-ups given with
    /// [`closing_with`](Self::closing_with), in order.
    pub async fn close(self) {
        let ReleaseWatch {
            sources,
            _registrations,
            closings,
            ..
        } = self;
        drop(sources);
        drop(_registrations);
        for closing in closings {
            closing().await;
        }
    }

    /// Whether the watch tells its waiter when its turn has come (see
    /// [`telling_turns`](Self::telling_turns)).
    pub fn tells_turns(&self) -> bool {
        self.turns
    }

    /// Whether notifications can arrive at all.
    pub fn is_active(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Waits for the next notification from any source (cancel-safe). Sources
    /// that close never fire; with none left it waits forever.
    pub async fn changed(&mut self) {
        if let [only] = self.sources.as_mut_slice() {
            if only.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            return;
        }
        let mut waiting: Vec<_> = self
            .sources
            .iter_mut()
            .map(|rx| Some(Box::pin(rx.changed())))
            .collect();
        std::future::poll_fn(|cx| {
            for slot in &mut waiting {
                if let Some(changed) = slot {
                    match changed.as_mut().poll(cx) {
                        Poll::Ready(Ok(())) => return Poll::Ready(()),
                        // Closed: this source never fires again.
                        Poll::Ready(Err(_)) => *slot = None,
                        Poll::Pending => {}
                    }
                }
            }
            Poll::Pending
        })
        .await
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("active", &self.is_active())
            .field("turns", &self.turns)
            .finish()
    }
}

type IdleHook = Box<dyn Fn(&str) + Send + Sync>;

struct HubInner {
    topics: Mutex<HashMap<Box<str>, Topic>>,
    on_idle: Option<IdleHook>,
}

struct Topic {
    tx: watch::Sender<u64>,
    watchers: usize,
}

/// A registry of release notifications by key, shared by a client's waiters.
///
/// A backend calls [`watch`](Self::watch) for each waiter, and [`notify`](Self::notify)
/// when its server reports a release. With an idle hook, topics nobody watches
/// stay registered until the backend calls [`remove_if_idle`](Self::remove_if_idle),
/// so that it can keep a server-side subscription open for a while (Redis).
#[derive(Clone)]
pub struct NotifyHub {
    inner: Arc<HubInner>,
}

impl Default for NotifyHub {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for NotifyHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyHub")
            .field("topics", &self.len())
            .finish()
    }
}

impl NotifyHub {
    /// A hub that forgets a topic as soon as nobody watches it.
    pub fn new() -> Self {
        NotifyHub {
            inner: Arc::new(HubInner {
                topics: Mutex::default(),
                on_idle: None,
            }),
        }
    }

    /// A hub that calls `on_idle(key)` when the last watcher of `key` goes away
    /// and keeps the topic until [`remove_if_idle`](Self::remove_if_idle).
    /// The hook runs synchronously in `Drop`: keep it short (e.g. spawn a task).
    pub fn with_idle_hook(on_idle: impl Fn(&str) + Send + Sync + 'static) -> Self {
        NotifyHub {
            inner: Arc::new(HubInner {
                topics: Mutex::default(),
                on_idle: Some(Box::new(on_idle)),
            }),
        }
    }

    fn topics(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Topic>> {
        self.inner.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `key`. The flag is true when the topic is new, i.e. the backend
    /// should subscribe on the server before relying on notifications.
    pub fn watch(&self, key: &str) -> (ReleaseWatch, bool) {
        let mut topics = self.topics();
        let (rx, new) = match topics.get_mut(key) {
            Some(topic) => {
                topic.watchers += 1;
                (topic.tx.subscribe(), false)
            }
            None => {
                let (tx, rx) = watch::channel(0);
                topics.insert(key.into(), Topic { tx, watchers: 1 });
                (rx, true)
            }
        };
        let watch = ReleaseWatch {
            sources: vec![rx],
            _registrations: vec![Registration {
                hub: Arc::downgrade(&self.inner),
                key: key.into(),
            }],
            turns: false,
            closings: Vec::new(),
        };
        (watch, new)
    }

    /// Wakes the watchers of `key`; false if nobody watches it.
    pub fn notify(&self, key: &str) -> bool {
        match self.topics().get(key) {
            Some(topic) => {
                topic.tx.send_modify(|n| *n = n.wrapping_add(1));
                true
            }
            None => false,
        }
    }

    /// Whether anyone watches `key` now (a topic kept after its last
    /// watcher went, see [`with_idle_hook`](Self::with_idle_hook), is not
    /// watched).
    pub fn watched(&self, key: &str) -> bool {
        self.topics().get(key).is_some_and(|t| t.watchers > 0)
    }

    /// Wakes every watcher (e.g. after a reconnect, when messages may have been missed).
    pub fn notify_all(&self) {
        for topic in self.topics().values() {
            topic.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Removes `key` if nobody watches it; true if it was removed.
    pub fn remove_if_idle(&self, key: &str) -> bool {
        let mut topics = self.topics();
        if topics.get(key).is_some_and(|t| t.watchers == 0) {
            topics.remove(key);
            true
        } else {
            false
        }
    }

    /// The number of registered topics.
    pub fn len(&self) -> usize {
        self.topics().len()
    }

    /// Whether no topic is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Registration {
    hub: Weak<HubInner>,
    key: Box<str>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let idle = {
            let mut topics = hub.topics.lock().unwrap_or_else(|p| p.into_inner());
            let Some(topic) = topics.get_mut(&self.key) else {
                return;
            };
            topic.watchers -= 1;
            if topic.watchers > 0 {
                false
            } else if hub.on_idle.is_none() {
                topics.remove(&self.key);
                false
            } else {
                true
            }
        };
        if idle && let Some(hook) = &hub.on_idle {
            hook(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn notify_wakes_watchers_of_that_key_only() {
        let hub = NotifyHub::new();
        let (mut a, new_a) = hub.watch("a");
        let (mut b, _) = hub.watch("b");
        let (mut a2, new_a2) = hub.watch("a");
        assert!(new_a && !new_a2);
        assert!(hub.notify("a"));
        tokio::time::timeout(Duration::from_secs(1), a.changed())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), a2.changed())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), b.changed())
                .await
                .is_err()
        );
        drop((a, a2, b));
        assert!(hub.is_empty());
        assert!(!hub.notify("a"));
    }

    #[tokio::test]
    async fn notification_before_waiting_is_not_lost() {
        let hub = NotifyHub::new();
        let (mut w, _) = hub.watch("k");
        hub.notify("k");
        tokio::time::timeout(Duration::from_secs(1), w.changed())
            .await
            .unwrap();
    }

    #[test]
    fn idle_hook_keeps_topic_until_removed() {
        let idle = Arc::new(Mutex::new(Vec::new()));
        let seen = idle.clone();
        let hub = NotifyHub::with_idle_hook(move |key| seen.lock().unwrap().push(key.to_owned()));
        let (w, _) = hub.watch("x");
        assert!(hub.watched("x"));
        drop(w);
        assert_eq!(*idle.lock().unwrap(), ["x"]);
        assert_eq!(hub.len(), 1);
        assert!(!hub.watched("x"), "a lingering topic is not watched");
        let (w, new) = hub.watch("x");
        assert!(!new, "a lingering topic is reused");
        assert!(hub.watched("x"));
        assert!(!hub.remove_if_idle("x"));
        drop(w);
        assert!(hub.remove_if_idle("x"));
        assert!(hub.is_empty());
    }

    #[tokio::test]
    async fn close_stops_the_watch_then_awaits_its_clean_ups() {
        let idle = Arc::new(Mutex::new(Vec::new()));
        let seen = idle.clone();
        let hub = NotifyHub::with_idle_hook(move |key| seen.lock().unwrap().push(key.to_owned()));
        let order = Arc::new(Mutex::new(Vec::new()));
        let watch = |key: &'static str| {
            let (order, idle) = (order.clone(), idle.clone());
            hub.watch(key).0.closing_with(move || async move {
                tokio::task::yield_now().await;
                // The watch stopped before its clean-up ran.
                let stopped = idle.lock().unwrap().contains(&key.to_owned());
                order.lock().unwrap().push((key, stopped));
            })
        };
        let merged = ReleaseWatch::merge([watch("a"), watch("b")]).telling_turns();
        merged.close().await;
        assert_eq!(*order.lock().unwrap(), [("a", true), ("b", true)]);
        // Dropped, a watch runs no clean-up.
        drop(watch("c"));
        assert_eq!(order.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn merged_watch_fires_on_any_source() {
        let (one, two) = (NotifyHub::new(), NotifyHub::new());
        let mut merged =
            ReleaseWatch::merge([one.watch("k").0, two.watch("k").0, ReleaseWatch::none()]);
        assert!(merged.is_active());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), merged.changed())
                .await
                .is_err()
        );
        two.notify("k");
        tokio::time::timeout(Duration::from_secs(1), merged.changed())
            .await
            .unwrap();
        one.notify("k");
        tokio::time::timeout(Duration::from_secs(1), merged.changed())
            .await
            .unwrap();
        drop(merged);
        assert!(
            one.is_empty() && two.is_empty(),
            "registrations go with the merged watch"
        );
    }

    #[tokio::test]
    async fn inactive_watch_never_fires() {
        let mut none = ReleaseWatch::none();
        assert!(!none.is_active());
        assert!(
            tokio::time::timeout(Duration::from_millis(10), none.changed())
                .await
                .is_err()
        );
    }
}
