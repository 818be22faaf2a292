//! A per-name FIFO inside one client, so that tasks of the same process queue
//! fairly instead of racing each other on the wire.
//!
//! Only the head of a name's local queue talks to the backend; the others wait
//! for the queue's one permit (a `tokio::sync::Semaphore`, which hands it over
//! in FIFO order). A task that
//! releases and at once asks again therefore queues behind the tasks that were
//! already waiting, and the local handoff costs no backend round trip beyond
//! the next holder's own acquire.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The queues by name; an entry's name is shared with its users' entries.
type Slots = Arc<Mutex<HashMap<Arc<str>, Arc<Queue>>>>;

/// A holding passed from one task of a client to the next, in a
/// [`LocalHandle`]: whatever the backend needs to adopt it.
pub type Baton = Box<dyn Any + Send>;

/// One name's queue inside a client. A client holding many names keeps
/// one per name, so it is a single allocation.
struct Queue {
    /// Whose turn it is: one permit, taken by the turn (and forgotten) and
    /// added back when the turn ends ([`LocalSlot`]'s drop). Never closed.
    turn: tokio::sync::Semaphore,
    /// Tasks waiting for their turn.
    waiting: AtomicUsize,
    /// Consecutive turns that passed the holding on without releasing it.
    passes: AtomicU32,
    handover: Mutex<Handover>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            turn: tokio::sync::Semaphore::new(1),
            waiting: AtomicUsize::new(0),
            passes: AtomicU32::new(0),
            handover: Mutex::default(),
        }
    }
}

/// What one turn leaves for the next.
#[derive(Default)]
struct Handover {
    /// A holding left by the previous turn for the next one.
    baton: Option<Baton>,
    /// When the last turn ended while tasks waited: where the next turn's
    /// hand-over started (for the handoff metric).
    ended: Option<tokio::time::Instant>,
}

/// A per-name FIFO of the tasks of one client (see the module docs): only the
/// task holding a name's [`LocalSlot`] talks to the backend about that name.
/// For backend implementors; [`LeaseLock`](crate::backend::LeaseLock) uses one.
#[derive(Debug, Default)]
pub struct LocalQueue {
    slots: Slots,
}

impl LocalQueue {
    fn entry(&self, name: &str) -> SlotEntry {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let (name, queue) = match slots.get_key_value(name) {
            Some((name, queue)) => (name.clone(), queue.clone()),
            None => {
                let (name, queue): (Arc<str>, _) = (name.into(), Arc::new(Queue::default()));
                slots.insert(name.clone(), queue.clone());
                (name, queue)
            }
        };
        SlotEntry {
            slots: self.slots.clone(),
            name,
            queue,
        }
    }

    /// Waits for this client's turn on `name` (cancel-safe).
    pub async fn enter(&self, name: &str) -> LocalSlot {
        let entry = self.entry(name);
        let waiting = Waiting::new(&entry.queue);
        // Never closed, so never an error; the permit is the turn's until
        // the slot's drop adds it back (nothing awaits in between).
        if let Ok(permit) = entry.queue.turn.acquire().await {
            permit.forget();
        }
        drop(waiting);
        LocalSlot { entry }
    }

    /// Takes this client's turn on `name` if nobody else in the client has it.
    pub fn try_enter(&self, name: &str) -> Option<LocalSlot> {
        let entry = self.entry(name);
        entry.queue.turn.try_acquire().ok()?.forget();
        Some(LocalSlot { entry })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }
}

/// Counts a task as waiting while it exists.
struct Waiting<'a>(&'a Queue);

impl<'a> Waiting<'a> {
    fn new(queue: &'a Queue) -> Self {
        queue.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(queue)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A reference to a name's queue; removes the queue once nobody uses it
/// (dropping a baton nobody took, which releases it).
struct SlotEntry {
    slots: Slots,
    name: Arc<str>,
    queue: Arc<Queue>,
}

impl Drop for SlotEntry {
    fn drop(&mut self) {
        let removed = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            // Users clone the Arc under this lock, so the count cannot grow
            // meanwhile: 2 means only the map and this entry are left.
            if Arc::strong_count(&self.queue) == 2 {
                slots.remove(&self.name)
            } else {
                None
            }
        };
        // Outside the lock: a baton's drop may start a release.
        drop(removed);
    }
}

/// This client's turn on a name: the queue's permit, given back by its drop
/// before the entry checks whether the queue can be removed.
pub struct LocalSlot {
    entry: SlotEntry,
}

impl LocalSlot {
    /// A handle on this name's queue that outlives the turn: what the holding
    /// uses, when it ends, to pass itself on to the next task in line.
    pub fn handle(&self) -> LocalHandle {
        LocalHandle(Arc::downgrade(&self.entry.queue))
    }

    /// Takes the holding the previous turn passed on, if it left one.
    pub fn take_baton(&self) -> Option<Baton> {
        self.entry.queue.take_baton()
    }

    /// When the previous turn ended, if this turn waited for it: the start
    /// of a hand-over inside the client. Taken once.
    pub fn take_handoff_start(&self) -> Option<tokio::time::Instant> {
        self.entry.queue.handover().ended.take()
    }
}

impl Drop for LocalSlot {
    /// Notes when the turn ended if a task waits for the next one, and
    /// gives the turn to it (the entry drops afterwards).
    fn drop(&mut self) {
        let queue = &self.entry.queue;
        queue.handover().ended =
            (queue.waiting.load(Ordering::SeqCst) > 0).then(tokio::time::Instant::now);
        queue.turn.add_permits(1);
    }
}

impl std::fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSlot")
            .field("name", &self.entry.name)
            .finish()
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.waiting.load(Ordering::SeqCst))
            .field("passes", &self.passes.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Queue {
    fn handover(&self) -> std::sync::MutexGuard<'_, Handover> {
        self.handover.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_baton(&self) -> Option<Baton> {
        self.handover().baton.take()
    }
}

/// A name's queue inside a client, seen by the holding of the current turn;
/// see [`LocalSlot::handle`]. For backend implementors: a holding that ends
/// while tasks of the same client wait can be passed straight to the next
/// one ([`put_baton`](Self::put_baton)), which takes it when its turn comes
/// ([`LocalSlot::take_baton`]) instead of asking the server. A baton nobody
/// takes is dropped with the queue. The handle does not keep the queue
/// alive: once no task uses the name, the queue goes and the handle sees
/// nobody waiting.
#[derive(Clone)]
pub struct LocalHandle(Weak<Queue>);

impl std::fmt::Debug for LocalHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalHandle")
            .field("waiting", &self.waiting())
            .field("passes", &self.passes())
            .finish()
    }
}

impl LocalHandle {
    /// Tasks of this client waiting for their turn on the name.
    pub fn waiting(&self) -> usize {
        self.0
            .upgrade()
            .map_or(0, |queue| queue.waiting.load(Ordering::SeqCst))
    }

    /// Leaves `baton` for the next turn (replacing any earlier one, which is
    /// dropped). With the queue gone, the baton is dropped at once.
    pub fn put_baton(&self, baton: Baton) {
        let Some(queue) = self.0.upgrade() else {
            return;
        };
        let old = queue.handover().baton.replace(baton);
        drop(old);
    }

    /// Takes the baton back (the pass did not happen).
    pub fn take_baton(&self) -> Option<Baton> {
        self.0.upgrade()?.take_baton()
    }

    /// How many turns in a row passed the holding on without releasing it.
    pub fn passes(&self) -> u32 {
        self.0
            .upgrade()
            .map_or(0, |queue| queue.passes.load(Ordering::SeqCst))
    }

    /// Counts one more pass.
    pub fn count_pass(&self) {
        if let Some(queue) = self.0.upgrade() {
            queue.passes.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The holding was released to the server: the count starts afresh.
    pub fn reset_passes(&self) {
        if let Some(queue) = self.0.upgrade() {
            queue.passes.store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn hands_over_in_fifo_order_and_cleans_up() {
        let queue = Arc::new(LocalQueue::default());
        let first = queue.enter("a").await;
        assert!(queue.try_enter("a").is_none());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (queue, order) = (queue.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = queue.enter("a").await;
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(slot);
            }));
            // Let each task queue up before the next one starts.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(queue.len(), 0, "idle queues are removed");
    }

    #[tokio::test]
    async fn a_handle_does_not_keep_the_queue() {
        let queue = LocalQueue::default();
        let slot = queue.enter("c").await;
        let handle = slot.handle();
        drop(slot);
        assert_eq!(queue.len(), 0, "the holding's handle outlives the turn");
        assert_eq!(handle.waiting(), 0);
        handle.put_baton(Box::new(1_u8));
        assert!(handle.take_baton().is_none());
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_no_entry() {
        let queue = LocalQueue::default();
        let held = queue.enter("b").await;
        let waiting = tokio::time::timeout(Duration::from_millis(5), queue.enter("b")).await;
        assert!(waiting.is_err());
        drop(held);
        assert_eq!(queue.len(), 0);
        assert!(queue.try_enter("b").is_some());
        assert_eq!(queue.len(), 0);
    }
}
