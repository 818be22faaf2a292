//! Where a lock's keys live.

use lockkit_core::Result;
use lockkit_core::backend::validate_name;

/// The directory of the lock `name` under `prefix`: `<prefix>/<name>/`,
/// with `name` as [`encode_name`] writes it. Every contender's key is this
/// directory followed by its lease id in lower-case hex, as in etcd's own
/// lock recipe.
pub(crate) fn lock_dir(prefix: &str, name: &str) -> Result<String> {
    validate_name(name)?;
    Ok(format!("{prefix}/{}/", encode_name(name)))
}

/// A lock name as a single segment of an etcd key: `%` and `/` are
/// percent-encoded (`%25`, `%2F`), everything else is kept, so the
/// directories of `a` and `a/b` never overlap. A name without either is
/// used as it is: `etcdctl lock <prefix>/<name>` takes the same lock.
///
/// ```
/// assert_eq!(lockkit_etcd::encode_name("nightly-report"), "nightly-report");
/// assert_eq!(lockkit_etcd::encode_name("orders/42"), "orders%2F42");
/// assert_eq!(lockkit_etcd::encode_name("100%"), "100%25");
/// ```
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The directory of the semaphore `name`: `<prefix>/%semaphores/<name>/`.
/// Encoded names never hold a bare `%`, so no lock's directory is there.
pub(crate) fn semaphore_dir(prefix: &str, name: &str) -> Result<String> {
    validate_name(name)?;
    Ok(format!("{prefix}/{SEMAPHORES}/{}/", encode_name(name)))
}

/// The segment under the prefix where semaphores live.
pub const SEMAPHORES: &str = "%semaphores";

/// What starts a reader's key after the directory: writers' keys (and
/// those of `etcdctl lock`) are a lease id in hex, which never does.
pub(crate) const READER_MARK: &str = "r-";

/// A contender's key: the directory, [`READER_MARK`] for a reader, and its
/// lease id in hex.
pub(crate) fn contender_key(dir: &str, reader: bool, lease: i64) -> String {
    let mark = if reader { READER_MARK } else { "" };
    format!("{dir}{mark}{lease:x}")
}

/// Whether `key` (of the directory `dir`) is a reader's.
pub(crate) fn is_reader(dir: &str, key: &[u8]) -> bool {
    key.strip_prefix(dir.as_bytes())
        .is_some_and(|rest| rest.starts_with(READER_MARK.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_never_nest() {
        let a = lock_dir("lockkit", "a").unwrap();
        let ab = lock_dir("lockkit", "a/b").unwrap();
        assert_eq!(a, "lockkit/a/");
        assert!(!ab.starts_with(&a), "{ab}");
        assert_eq!(
            contender_key(&a, false, 0x694d_a210_aee8_ac0b),
            "lockkit/a/694da210aee8ac0b"
        );
        let reader = contender_key(&a, true, 0x1f);
        assert_eq!(reader, "lockkit/a/r-1f");
        assert!(is_reader(&a, reader.as_bytes()) && !is_reader(&a, b"lockkit/a/1f"));
        let sem = semaphore_dir("lockkit", "a").unwrap();
        assert!(!sem.starts_with(&a) && !a.starts_with(&sem), "{sem}");
        assert_ne!(sem, lock_dir("lockkit", "%semaphores/a").unwrap());
        assert!(lock_dir("lockkit", "").is_err());
    }
}
