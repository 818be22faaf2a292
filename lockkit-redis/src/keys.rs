//! How lock names map into the Redis keyspace.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::validate_name;
use lockkit_core::{LockError, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lockkit:";

/// The suffixes of the keys derived from a lock key (`{<lock key>}:<suffix>`).
/// None ends another one after a `:`, so derived keys of different kinds
/// never collide.
const DERIVED: [&str; 8] = [
    "fence",
    "readers",
    "writer-waiting",
    "semaphore",
    "semaphore-fence",
    "queue",
    "queue-deadlines",
    "line",
];

/// How long a waiter of a fair lock keeps its place in the queue (and a
/// waiter of another lock its place in the line) without asking again; it
/// asks at least twice as often. A waiter of a fair lock that vanished (its
/// process died) holds up the queue this long at most.
pub const QUEUE_PLACE: Duration = Duration::from_secs(2);

/// How long a released lock stays reserved for the head of its waiting
/// line (see [`Keys::line`]) while that waiter is woken and asks for it,
/// unless set otherwise ([`RedisLockBuilder::turn`](crate::RedisLockBuilder::turn)).
/// A waiter that vanished holds the lock up this long, once.
pub const TURN: Duration = Duration::from_millis(100);

/// The waiting line of a fair lock (see
/// [`RedisLockBuilder::fair`](crate::RedisLockBuilder::fair)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// `{<prefix><name>}:queue`: waiter ids by arrival (server time, µs).
    pub order: String,
    /// `{<prefix><name>}:queue-deadlines`: waiter ids by the end of their
    /// place (server time, ms).
    pub deadlines: String,
    /// The id this client waits under: one per client, whose tasks queue
    /// among themselves first.
    pub waiter: Arc<str>,
    /// `{<prefix><name>}:released:<waiter>`: where this client hears that
    /// its turn may have come (a release wakes the head of the queue only).
    pub channel: String,
}

/// The Redis keys of one lock name.
///
/// * lock key: `<prefix><name>`, holding the exclusive holder's owner token
///   (so with an empty prefix it is the plain key that redis-py's `Lock`,
///   redsync and node-redlock use);
/// * fence counter: `{<prefix><name>}:fence`, one sequence for writers and
///   readers;
/// * readers: `{<prefix><name>}:readers`, a sorted set of the shared
///   holders' owner tokens scored by the end of their leases (server time,
///   ms);
/// * waiting writer: `{<prefix><name>}:writer-waiting`, the owner token of a
///   writer that waits for the readers to leave (new readers wait behind
///   it), with an expiry;
/// * the waiting line: `{<prefix><name>}:line`, the clients waiting for the
///   lock by arrival (server time, µs), derived when needed
///   ([`Keys::line`]), and its turns, `{<prefix><name>}:turns`, the lease
///   each waiting client of lockkit's Redis backend is to get on its turn
///   ([`Keys::turns`]); for a fair lock, its queue instead:
///   `{<prefix><name>}:queue` and `{<prefix><name>}:queue-deadlines`
///   ([`Queue`]);
/// * release channel: `{<prefix><name>}:released`.
///
/// Every key of a name, and its channel, hashes to the lock key's slot when
/// the lock key has no `}`. In Redis Cluster mode ([`Keys::for_cluster`]) a
/// lock key with a `}` may hash elsewhere (a script touching both would fail
/// with `CROSSSLOT`, and one publishing on a sharded channel of another slot
/// too), so its derived keys and channel are
/// `{<tag>}:<suffix>:<prefix><name>` instead, where `<tag>` is the lock
/// key's own hash tag or, when it has none, a short tag chosen to hash to
/// the lock key's slot.
///
/// Names are UTF-8 and Redis keys are binary-safe, so prefixing is injective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// The lock key.
    pub lock: String,
    /// The fencing counter.
    pub fence: String,
    /// The sorted set of shared holders.
    pub readers: String,
    /// The waiting writer's record.
    pub writer_waiting: String,
    /// The pub/sub channel that announces releases.
    pub channel: String,
    /// The holder identity a holding of these keys records, if any (see
    /// [`RedisKey::with_holder`](crate::RedisKey::with_holder)).
    pub holder: Option<Arc<str>>,
    /// The waiting line, for a fair lock (boxed: a held lease keeps its
    /// keys, and most locks are not fair).
    pub queue: Option<Box<Queue>>,
}

impl Keys {
    /// The keys of `name` under `prefix`. Checks the name: the general rules, and
    /// that its lock key cannot be mistaken for a key derived from another.
    pub fn new(prefix: &str, name: &str) -> Result<Keys> {
        Layout::new(prefix, name, false).map(Layout::lock_keys)
    }

    /// The keys of `name` under `prefix` for Redis Cluster: every key of the
    /// name is in one hash slot (see [`Keys`]). Besides the checks of
    /// [`Keys::new`], refuses names whose lock key would have the shape of a
    /// cluster key derived from another (possible only with an empty prefix,
    /// or one that starts with `{`).
    pub fn for_cluster(prefix: &str, name: &str) -> Result<Keys> {
        Layout::new(prefix, name, true).map(Layout::lock_keys)
    }

    /// The keys of a fair lock `name` under `prefix` (laid out for Redis
    /// Cluster when `cluster`), whose client waits in its queue as `waiter`.
    pub fn fair(prefix: &str, name: &str, cluster: bool, waiter: Arc<str>) -> Result<Keys> {
        let layout = Layout::new(prefix, name, cluster)?;
        let queue = Queue {
            order: layout.derived("queue"),
            deadlines: layout.derived("queue-deadlines"),
            channel: format!("{}:{waiter}", layout.channel("released")),
            waiter,
        };
        let mut keys = layout.lock_keys();
        keys.queue = Some(Box::new(queue));
        Ok(keys)
    }
}

impl Keys {
    /// The key of the lock's waiting line: a sorted set of the waiter ids
    /// of the clients waiting for it, by arrival (server time, µs). A
    /// release reserves the lock for the head of the line for [`TURN`] and
    /// wakes that client alone (on [`turn_channel`](Self::turn_channel)),
    /// instead of every waiting client.
    ///
    /// Derived from the readers' key when needed, not kept: a held lease
    /// keeps its keys, and only waits and releases need this one.
    pub fn line(&self) -> String {
        self.sibling("line")
    }

    /// The key of the line's turns: a hash of the waiter ids in the
    /// [`line`](Self::line) whose turn is to grant them a lease, each with
    /// the lease it asked for (see `ACQUIRE` in the scripts). Derived as the
    /// line is.
    pub fn turns(&self) -> String {
        self.sibling("turns")
    }

    /// The key `suffix` beside the readers' key, in its layout.
    fn sibling(&self, suffix: &str) -> String {
        let readers = &self.readers;
        match readers.strip_suffix("readers") {
            // `{<lock key>}:readers`.
            Some(head) if head.len() == self.lock.len() + 3 => [head, suffix].concat(),
            // `{<tag>}:readers:<lock key>`, the tag without a `}`.
            _ => match readers.split_once("}:readers:") {
                Some((tag, lock)) => [tag, "}:", suffix, ":", lock].concat(),
                None => [readers, ":", suffix].concat(),
            },
        }
    }

    /// Where the waiter `waiter` of this lock hears that its turn came:
    /// `<release channel>:<waiter>`.
    pub fn turn_channel(&self, waiter: &str) -> String {
        [self.channel.as_str(), ":", waiter].concat()
    }
}

/// The Redis keys of one semaphore name (a namespace of its own: the
/// semaphore `jobs` and the lock `jobs` share no key).
///
/// * permits: `{<prefix><name>}:semaphore`, a sorted set of the permit
///   holders' owner tokens scored by the end of their leases (server time, ms);
/// * fence counter: `{<prefix><name>}:semaphore-fence`;
/// * release channel: `{<prefix><name>}:semaphore-released`.
///
/// In Redis Cluster mode, as for [`Keys`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreKeys {
    /// The sorted set of permit holders.
    pub permits: String,
    /// The fencing counter.
    pub fence: String,
    /// The pub/sub channel that announces returned permits.
    pub channel: String,
    /// The holder identity a permit records, if any.
    pub holder: Option<Arc<str>>,
}

impl SemaphoreKeys {
    /// The keys of the semaphore `name` under `prefix`; the checks of [`Keys::new`].
    pub fn new(prefix: &str, name: &str) -> Result<SemaphoreKeys> {
        Layout::new(prefix, name, false).map(Layout::semaphore_keys)
    }

    /// As [`Keys::for_cluster`], for a semaphore.
    pub fn for_cluster(prefix: &str, name: &str) -> Result<SemaphoreKeys> {
        Layout::new(prefix, name, true).map(Layout::semaphore_keys)
    }
}

/// A sorted set of leases (a lock's readers, a semaphore's permits) and the
/// keys its scripts touch with it.
#[derive(Clone, Copy, Debug)]
pub struct LeaseSet<'k> {
    /// The sorted set.
    pub set: &'k str,
    /// Its fencing counter.
    pub fence: &'k str,
    /// The lock key whose holder shares the counter (a semaphore has none).
    pub lock: Option<&'k str>,
    /// The channel its releases are published on.
    pub channel: &'k str,
}

impl Keys {
    /// The readers' set.
    pub fn reader_set(&self) -> LeaseSet<'_> {
        LeaseSet {
            set: &self.readers,
            fence: &self.fence,
            lock: Some(&self.lock),
            channel: &self.channel,
        }
    }
}

impl SemaphoreKeys {
    /// The permits' set.
    pub fn permit_set(&self) -> LeaseSet<'_> {
        LeaseSet {
            set: &self.permits,
            fence: &self.fence,
            lock: None,
            channel: &self.channel,
        }
    }
}

/// A checked lock key and how keys are derived from it.
struct Layout {
    lock: String,
    /// The hash tag of derived keys in Redis Cluster when the lock key has a `}`.
    tag: Option<String>,
}

impl Layout {
    fn new(prefix: &str, name: &str, cluster: bool) -> Result<Layout> {
        validate_name(name)?;
        let lock = [prefix, name].concat();
        let refuse = |what: &str| LockError::InvalidName {
            name: format!("{name:?}"),
            reason: format!("with the key prefix {prefix:?} its key would be {what}"),
        };
        // Another name's derived keys are `{<prefix><other>}:<suffix>`;
        // refuse names whose lock key has that shape (possible only with an
        // empty prefix, or one made of braces).
        if lock
            .strip_prefix('{')
            .is_some_and(|rest| rest.starts_with(prefix))
            && let Some(suffix) = DERIVED.iter().find(|s| lock.ends_with(&format!("}}:{s}")))
        {
            return Err(refuse(&format!("the {suffix} key of another lock")));
        }
        if cluster && let Some(suffix) = cluster_derived_shape(&lock, prefix) {
            return Err(refuse(&format!(
                "the {suffix} key of another lock in Redis Cluster"
            )));
        }
        let tag = (cluster && lock.contains('}')).then(|| match hash_tag(lock.as_bytes()) {
            // The tag has no `}`: `{tag}` is a hash tag again.
            Some(tag) => String::from_utf8_lossy(tag).into_owned(),
            None => slot_tag(key_slot(lock.as_bytes())).to_owned(),
        });
        Ok(Layout { lock, tag })
    }

    // Keys are joined with `concat`, which allocates their exact length
    // once: a held lease keeps them (`format!` grows its buffer as it
    // writes, to up to twice the length).
    fn derived(&self, suffix: &str) -> String {
        match &self.tag {
            None => ["{", &self.lock, "}:", suffix].concat(),
            Some(tag) => ["{", tag, "}:", suffix, ":", &self.lock].concat(),
        }
    }

    /// A channel hashes to the lock key's slot as the derived keys do, so
    /// that a script may `SPUBLISH` on it (sharded pub/sub in Redis Cluster).
    fn channel(&self, suffix: &str) -> String {
        self.derived(suffix)
    }

    fn lock_keys(self) -> Keys {
        Keys {
            fence: self.derived("fence"),
            readers: self.derived("readers"),
            writer_waiting: self.derived("writer-waiting"),
            channel: self.channel("released"),
            lock: self.lock,
            holder: None,
            queue: None,
        }
    }

    fn semaphore_keys(self) -> SemaphoreKeys {
        SemaphoreKeys {
            permits: self.derived("semaphore"),
            fence: self.derived("semaphore-fence"),
            channel: self.channel("semaphore-released"),
            holder: None,
        }
    }
}

/// Which derived key `lock` looks like in Redis Cluster, if it has the
/// shape `{<tag>}:<suffix>:<prefix>…}…` of [`Layout::derived`].
fn cluster_derived_shape(lock: &str, prefix: &str) -> Option<&'static str> {
    let after = lock.strip_prefix('{')?.split_once('}')?.1;
    DERIVED.iter().copied().find(|suffix| {
        after
            .strip_prefix(':')
            .and_then(|rest| rest.strip_prefix(suffix))
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(|inner| inner.starts_with(prefix) && inner.contains('}'))
    })
}

/// The number of hash slots of Redis Cluster.
const SLOTS: u16 = 16384;

/// The part of `key` Redis Cluster hashes: the content of the first `{…}`
/// when it is not empty, else `None` (the whole key is hashed).
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// The hash slot of `key`, as `CLUSTER KEYSLOT` computes it.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    crc16_xmodem(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), Redis Cluster's key hash.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A short alphanumeric string (no braces) that hashes to `slot`; the table
/// is built on first use (a few hundred thousand CRCs, once).
fn slot_tag(slot: u16) -> &'static str {
    static TABLE: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let mut table = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut candidate = Vec::new();
        // Strings in order of length, then of the alphabet: short tags first.
        'lengths: for len in 1..=4 {
            let mut digits = vec![0_usize; len];
            loop {
                candidate.clear();
                candidate.extend(digits.iter().map(|&d| ALPHABET[d]));
                let entry = &mut table[usize::from(crc16_xmodem(&candidate) % SLOTS)];
                if entry.is_empty() {
                    *entry = String::from_utf8_lossy(&candidate).into_owned();
                    missing -= 1;
                    if missing == 0 {
                        break 'lengths;
                    }
                }
                // The next combination, like an odometer.
                let mut i = len;
                loop {
                    if i == 0 {
                        continue 'lengths;
                    }
                    i -= 1;
                    digits[i] += 1;
                    if digits[i] < ALPHABET.len() {
                        break;
                    }
                    digits[i] = 0;
                }
            }
        }
        table
    });
    &TABLE[usize::from(slot % SLOTS)]
}

/// Between the owner token and the holder identity in a stored value; the
/// same for every backend.
pub use lockkit_core::backend::{HOLDER_SEPARATOR, holder_of};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let keys = Keys::new("lockkit:", "orders/42").unwrap();
        assert_eq!(keys.lock, "lockkit:orders/42");
        assert_eq!(keys.fence, "{lockkit:orders/42}:fence");
        assert_eq!(keys.channel, "{lockkit:orders/42}:released");
        assert_eq!(keys.readers, "{lockkit:orders/42}:readers");
        assert_eq!(keys.writer_waiting, "{lockkit:orders/42}:writer-waiting");
        assert_eq!(keys.line(), "{lockkit:orders/42}:line");
        assert_eq!(keys.turns(), "{lockkit:orders/42}:turns");
        assert_eq!(keys.turn_channel("w"), "{lockkit:orders/42}:released:w");
        // A lock key that looks like a derived key's start.
        let odd = Keys::new("", "a}:readers").unwrap();
        assert_eq!(odd.line(), "{a}:readers}:line");
        assert_eq!(odd.turns(), "{a}:readers}:turns");
        assert_eq!(Keys::new("", "job").unwrap().lock, "job");
        let sem = SemaphoreKeys::new("lockkit:", "orders/42").unwrap();
        assert_eq!(sem.permits, "{lockkit:orders/42}:semaphore");
        assert_eq!(sem.fence, "{lockkit:orders/42}:semaphore-fence");
        assert_eq!(sem.channel, "{lockkit:orders/42}:semaphore-released");
    }

    #[test]
    fn key_slots_match_redis() {
        // Values of `CLUSTER KEYSLOT` on a real server.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn every_slot_has_a_tag() {
        for slot in 0..SLOTS {
            let tag = slot_tag(slot);
            assert!(!tag.is_empty() && tag.len() <= 4, "slot {slot}: {tag:?}");
            assert_eq!(key_slot(tag.as_bytes()), slot);
        }
    }

    #[test]
    fn cluster_keys_share_a_slot() {
        for name in [
            "job",
            "{a}",
            "a{b}c",
            "}",
            "{",
            "{}",
            "a}b",
            "x{}y}",
            "{a}:fence",
            "ü}",
            "}{a}",
        ] {
            for prefix in ["lockkit:", "", "{p}"] {
                let Ok(keys) = Keys::for_cluster(prefix, name) else {
                    continue;
                };
                assert_eq!(keys.lock, format!("{prefix}{name}"));
                let sem = SemaphoreKeys::for_cluster(prefix, name).unwrap();
                let slot = key_slot(keys.lock.as_bytes());
                for derived in [
                    &keys.line(),
                    &keys.turns(),
                    &keys.fence,
                    &keys.readers,
                    &keys.writer_waiting,
                    &sem.permits,
                    &sem.fence,
                ] {
                    assert_eq!(
                        slot,
                        key_slot(derived.as_bytes()),
                        "{prefix:?} {name:?}: {derived:?}"
                    );
                }
                if !keys.lock.contains('}') {
                    assert_eq!(keys, Keys::new(prefix, name).unwrap());
                }
            }
        }
        let keys = Keys::for_cluster("lockkit:", "a}b").unwrap();
        assert!(keys.fence.ends_with(":fence:lockkit:a}b"), "{keys:?}");
        assert!(keys.line().ends_with(":line:lockkit:a}b"), "{keys:?}");
        assert!(keys.turns().ends_with(":turns:lockkit:a}b"), "{keys:?}");
        assert_eq!(
            Keys::for_cluster("lockkit:", "x{tag}y").unwrap().fence,
            "{tag}:fence:lockkit:x{tag}y"
        );
    }

    #[test]
    fn cluster_fence_lookalikes_are_refused() {
        let fence = Keys::for_cluster("", "a}b").unwrap().fence;
        assert!(Keys::for_cluster("", &fence).is_err());
        assert!(Keys::new("", &fence).is_ok());
        assert!(Keys::for_cluster("lockkit:", &fence).is_ok());
    }

    #[test]
    fn fence_lookalikes_are_refused_only_where_they_collide() {
        assert!(Keys::new("", "{job}:fence").is_err());
        assert!(Keys::new("", "{job}:readers").is_err());
        assert!(Keys::new("", "{job}:line").is_err());
        assert!(SemaphoreKeys::new("", "{job}:semaphore").is_err());
        assert!(Keys::for_cluster("", "{t}:readers:a}b").is_err());
        assert!(Keys::new("lockkit:", "{lockkit:job}:fence").is_ok());
        assert!(Keys::new("lockkit:", "{job}:fence").is_ok());
    }
}
