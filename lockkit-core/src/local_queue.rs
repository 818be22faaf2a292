//! A per-name FIFO inside one client, so that tasks of the same process queue
//! fairly instead of racing each other on the wire.
//!
//! Only the head of a name's local queue talks to the backend; the others wait
//! on a `tokio::sync::Mutex`, which hands over in FIFO order. A task that
//! releases and at once asks again therefore queues behind the tasks that were
//! already waiting, and the local handoff costs no backend round trip beyond
//! the next holder's own acquire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

type Slots = Arc<Mutex<HashMap<Box<str>, Arc<tokio::sync::Mutex<()>>>>>;

/// A per-name FIFO of the tasks of one client (see the module docs): only the
/// task holding a name's [`LocalSlot`] talks to the backend about that name.
/// For backend implementors; [`LeaseLock`](crate::LeaseLock) uses one.
#[derive(Debug, Default)]
pub struct LocalQueue {
    slots: Slots,
}

impl LocalQueue {
    fn entry(&self, name: &str) -> SlotEntry {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mutex = match slots.get(name) {
            Some(mutex) => mutex.clone(),
            None => {
                let mutex = Arc::new(tokio::sync::Mutex::new(()));
                slots.insert(name.into(), mutex.clone());
                mutex
            }
        };
        SlotEntry {
            slots: self.slots.clone(),
            name: name.into(),
            mutex,
        }
    }

    /// Waits for this client's turn on `name` (cancel-safe).
    pub async fn enter(&self, name: &str) -> LocalSlot {
        let entry = self.entry(name);
        let turn = entry.mutex.clone().lock_owned().await;
        LocalSlot {
            _turn: turn,
            _entry: entry,
        }
    }

    /// Takes this client's turn on `name` if nobody else in the client has it.
    pub fn try_enter(&self, name: &str) -> Option<LocalSlot> {
        let entry = self.entry(name);
        let turn = entry.mutex.clone().try_lock_owned().ok()?;
        Some(LocalSlot {
            _turn: turn,
            _entry: entry,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }
}

/// A reference to a name's queue; removes the queue once nobody uses it.
struct SlotEntry {
    slots: Slots,
    name: Box<str>,
    mutex: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for SlotEntry {
    fn drop(&mut self) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // Users clone the Arc under this lock, so the count cannot grow meanwhile:
        // 2 means only the map and this entry are left.
        if Arc::strong_count(&self.mutex) == 2 {
            slots.remove(&self.name);
        }
    }
}

/// This client's turn on a name. Field order matters: the turn is given up
/// before the entry checks whether the queue can be removed.
pub struct LocalSlot {
    _turn: OwnedMutexGuard<()>,
    _entry: SlotEntry,
}

impl std::fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSlot")
            .field("name", &self._entry.name)
            .finish()
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
