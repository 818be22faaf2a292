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

/// A contender's key: the lock's directory and its lease id in hex.
pub(crate) fn contender_key(dir: &str, lease: i64) -> String {
    format!("{dir}{lease:x}")
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
            contender_key(&a, 0x694d_a210_aee8_ac0b),
            "lockkit/a/694da210aee8ac0b"
        );
        assert!(lock_dir("lockkit", "").is_err());
    }
}
