//! How lock names map into the Redis keyspace.

use lockkit_core::{LockError, Result, validate_name};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lockkit:";

/// The Redis keys of one lock name.
///
/// * lock key: `<prefix><name>`, holding the owner token (so with an empty
///   prefix it is the plain key that redis-py's `Lock`, redsync and node-redlock use);
/// * fence counter: `{<prefix><name>}:fence` (same cluster slot as the lock key
///   when the name has no braces);
/// * release channel: `{<prefix><name>}:released`.
///
/// Names are UTF-8 and Redis keys are binary-safe, so prefixing is injective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// The lock key.
    pub lock: String,
    /// The fencing counter.
    pub fence: String,
    /// The pub/sub channel that announces releases.
    pub channel: String,
}

impl Keys {
    /// The keys of `name` under `prefix`. Checks the name: the general rules, and
    /// that its lock key cannot be mistaken for another lock's fence counter.
    pub fn new(prefix: &str, name: &str) -> Result<Keys> {
        validate_name(name)?;
        let lock = format!("{prefix}{name}");
        // Another name's fence key is `{<prefix><other>}:fence`; refuse names
        // whose lock key has that shape (possible only with an empty prefix, or
        // one made of braces).
        if lock.starts_with(&format!("{{{prefix}")) && lock.ends_with("}:fence") {
            return Err(LockError::InvalidName {
                name: format!("{name:?}"),
                reason: format!(
                    "with the key prefix {prefix:?} its key would be the fencing counter of another lock"
                ),
            });
        }
        Ok(Keys {
            fence: format!("{{{lock}}}:fence"),
            channel: format!("{{{lock}}}:released"),
            lock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let keys = Keys::new("lockkit:", "orders/42").unwrap();
        assert_eq!(keys.lock, "lockkit:orders/42");
        assert_eq!(keys.fence, "{lockkit:orders/42}:fence");
        assert_eq!(keys.channel, "{lockkit:orders/42}:released");
        assert_eq!(Keys::new("", "job").unwrap().lock, "job");
    }

    #[test]
    fn fence_lookalikes_are_refused_only_where_they_collide() {
        assert!(Keys::new("", "{job}:fence").is_err());
        assert!(Keys::new("lockkit:", "{lockkit:job}:fence").is_ok());
        assert!(Keys::new("lockkit:", "{job}:fence").is_ok());
    }
}
