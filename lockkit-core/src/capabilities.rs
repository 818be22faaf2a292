//! What a backend guarantees.

use std::fmt;

/// How a lock held by a client that crashed gets freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseOnCrash {
    /// When the lease's time-to-live runs out on the server.
    Ttl,
    /// When the client's session expires on the server (ZooKeeper).
    Session,
    /// When the server notices that the client's connection is gone (SQL session locks).
    Connection,
}

impl fmt::Display for ReleaseOnCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReleaseOnCrash::Ttl => "TTL",
            ReleaseOnCrash::Session => "session",
            ReleaseOnCrash::Connection => "connection",
        })
    }
}

/// What a backend guarantees; see [`DistributedLock::capabilities`](crate::DistributedLock::capabilities).
///
/// Build one with [`Capabilities::new`] and the `with_*` methods:
///
/// ```
/// use lockkit_core::{Capabilities, ReleaseOnCrash};
/// let caps = Capabilities::new(ReleaseOnCrash::Ttl).with_fencing(true);
/// assert!(caps.fencing && !caps.fifo);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// Guards carry a [`FencingToken`](crate::FencingToken) that strictly increases across holders.
    pub fencing: bool,
    /// How a crashed holder's lock is freed.
    pub release_on_crash: ReleaseOnCrash,
    /// Waiters are woken by a notification from the backend, not by polling alone.
    pub notified_wait: bool,
    /// Waiters acquire in the order they asked (across clients).
    pub fifo: bool,
    /// The lock stays safe and available while a minority of servers is down.
    pub survives_minority_failure: bool,
    /// Shared (reader) holdings: [`LockOptions::shared`](crate::LockOptions::shared).
    pub shared: bool,
    /// Counting semaphores: [`LockOptions::semaphore`](crate::LockOptions::semaphore).
    pub semaphore: bool,
    /// Holder identities recorded with the holding and read back by
    /// `status` ([`LockOptions::holder`](crate::LockOptions::holder)); what
    /// [`Election`](crate::Election) needs.
    pub holder: bool,
    /// The server keeps a name taken after an early release
    /// ([`LockOptions::min_hold`](crate::LockOptions::min_hold)), also when
    /// the client has exited.
    pub min_hold: bool,
    /// The server keeps a name taken after an unclean end
    /// ([`LockOptions::lock_delay`](crate::LockOptions::lock_delay)), also
    /// when the client has exited.
    pub lock_delay: bool,
}

impl Capabilities {
    /// Everything `false`, the crash behaviour as given.
    pub const fn new(release_on_crash: ReleaseOnCrash) -> Self {
        Capabilities {
            fencing: false,
            release_on_crash,
            notified_wait: false,
            fifo: false,
            survives_minority_failure: false,
            shared: false,
            semaphore: false,
            holder: false,
            min_hold: false,
            lock_delay: false,
        }
    }

    /// Sets [`fencing`](Self::fencing).
    pub const fn with_fencing(mut self, yes: bool) -> Self {
        self.fencing = yes;
        self
    }

    /// Sets [`notified_wait`](Self::notified_wait).
    pub const fn with_notified_wait(mut self, yes: bool) -> Self {
        self.notified_wait = yes;
        self
    }

    /// Sets [`fifo`](Self::fifo).
    pub const fn with_fifo(mut self, yes: bool) -> Self {
        self.fifo = yes;
        self
    }

    /// Sets [`survives_minority_failure`](Self::survives_minority_failure).
    pub const fn with_survives_minority_failure(mut self, yes: bool) -> Self {
        self.survives_minority_failure = yes;
        self
    }

    /// Sets [`shared`](Self::shared).
    pub const fn with_shared(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }

    /// Sets [`holder`](Self::holder).
    pub const fn with_holder(mut self, yes: bool) -> Self {
        self.holder = yes;
        self
    }

    /// Sets [`min_hold`](Self::min_hold) and [`lock_delay`](Self::lock_delay)
    /// both: what a backend whose server expires leases by itself can do.
    pub const fn with_server_bounds(mut self, yes: bool) -> Self {
        self.min_hold = yes;
        self.lock_delay = yes;
        self
    }

    /// Sets [`semaphore`](Self::semaphore).
    pub const fn with_semaphore(mut self, yes: bool) -> Self {
        self.semaphore = yes;
        self
    }

    /// A Markdown table with one row per `(backend, capabilities)` pair, as the guide's "Choosing a backend" shows it.
    ///
    /// ```
    /// use lockkit_core::{Capabilities, ReleaseOnCrash};
    /// let table = Capabilities::markdown_table(&[("memory", Capabilities::new(ReleaseOnCrash::Ttl))]);
    /// assert!(table.starts_with("| backend |"));
    /// ```
    pub fn markdown_table(rows: &[(&str, Capabilities)]) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let mut out = String::from(
            "| backend | fencing token | freed after a crash by | notified wait | FIFO | survives minority failure | shared (read) locks | semaphores | holder identity, elections | min_hold, lock_delay |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for (name, caps) in rows {
            out.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                yes_no(caps.fencing),
                caps.release_on_crash,
                yes_no(caps.notified_wait),
                yes_no(caps.fifo),
                yes_no(caps.survives_minority_failure),
                yes_no(caps.shared),
                yes_no(caps.semaphore),
                yes_no(caps.holder),
                match (caps.min_hold, caps.lock_delay) {
                    (true, true) => "yes",
                    (false, false) => "no",
                    (true, false) => "min_hold only",
                    (false, true) => "lock_delay only",
                },
            ));
        }
        out
    }
}
