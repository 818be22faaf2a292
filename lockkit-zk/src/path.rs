//! Lock names as ZooKeeper paths, and the lock nodes under them.

use lockkit_core::Result;
use lockkit_core::backend::validate_name;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but `[A-Za-z0-9_.-]` is percent-encoded.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-');

/// The node name of a lock: the name itself when it is made only of
/// `[A-Za-z0-9_.-]` (and is not `.` or `..`), so that simple names stay
/// readable and shared with other clients; otherwise every byte outside that
/// set, `%` included, is percent-encoded (`.` and `..` entirely). Verbatim
/// names contain no `%` and encoded ones always do, so the mapping is injective.
///
/// ```
/// use lockkit_zk::encode_name;
/// assert_eq!(encode_name("nightly-report_v2.1"), "nightly-report_v2.1");
/// assert_eq!(encode_name("a/b"), "a%2Fb");
/// assert_eq!(encode_name("50%"), "50%25");
/// assert_eq!(encode_name(".."), "%2E%2E");
/// ```
pub fn encode_name(name: &str) -> String {
    match name {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => utf8_percent_encode(name, ENCODED).to_string(),
    }
}

/// The znode path of lock `name` under `root` (which has no trailing `/`,
/// and is empty for the root node itself).
pub(crate) fn lock_dir(root: &str, name: &str) -> Result<String> {
    validate_name(name)?;
    Ok(format!("{root}/{}", encode_name(name)))
}

/// The node under `root` that holds the semaphores: `%semaphores`, which no
/// lock name encodes to (`%` is followed by two hex digits in every encoded
/// name), so semaphores are a namespace of their own.
pub const SEMAPHORES: &str = "%semaphores";

/// The znode path of semaphore `name` under `root`: `<root>/%semaphores/<encoded
/// name>`, with Curator `InterProcessSemaphoreV2`'s `locks` and `leases`
/// children under it, so that a Curator client given this path shares the
/// semaphore.
pub(crate) fn semaphore_dir(root: &str, name: &str) -> Result<String> {
    validate_name(name)?;
    Ok(format!("{root}/{SEMAPHORES}/{}", encode_name(name)))
}

/// The prefix of our lock node: Curator's protected-mode form,
/// `_c_<owner uuid>-lock-`, to which ZooKeeper appends a 10-digit sequence.
pub(crate) fn node_prefix(owner: &str) -> String {
    format!("_c_{owner}-lock-")
}

/// The prefix of our node as a reader: `_c_<owner uuid>-read-lock-`. It
/// ends in `lock-` like a writer's, so Curator's `InterProcessMutex` (and
/// lockkit's writers) see readers as contenders to wait for.
pub(crate) fn reader_prefix(owner: &str) -> String {
    format!("_c_{owner}-read-lock-")
}

/// The prefix of our lease node of a semaphore: Curator's `_c_<owner uuid>-lease-`.
pub(crate) fn lease_prefix(owner: &str) -> String {
    format!("_c_{owner}-lease-")
}

/// Whether a contender's node is a reader's.
pub(crate) fn is_reader(node: &str) -> bool {
    node.contains("-read-lock-")
}

/// The sequence number of a contender's node: the digits after the last
/// `lock-` (Curator and lockkit) or `__lock__` (kazoo). Other children are
/// not contenders.
pub(crate) fn sequence(node: &str) -> Option<i64> {
    let digits = match (node.rfind("lock-"), node.rfind("__lock__")) {
        (Some(a), Some(b)) if b + 3 > a => &node[b + 8..],
        (Some(a), _) => &node[a + 5..],
        (None, Some(b)) => &node[b + 8..],
        (None, None) => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The contenders among `children`, in the order they queued.
pub(crate) fn contenders(children: Vec<String>) -> Vec<(i64, String)> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|child| sequence(&child).map(|seq| (seq, child)))
        .collect();
    queue.sort();
    queue
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_injective_on_tricky_names() {
        let names = [
            "a", "A", "a/b", "a%2Fb", "a%252Fb", "a_2Fb", ".", "..", "%2E", "a b", "ü", "%C3%BC",
            "-lock-", "__lock__", "x.y", "..a",
        ];
        let encoded: std::collections::HashSet<String> =
            names.iter().map(|n| encode_name(n)).collect();
        assert_eq!(encoded.len(), names.len());
        assert!(
            encoded
                .iter()
                .all(|e| !e.contains('/') && e != "." && e != "..")
        );
    }

    #[test]
    fn sequences_of_curator_lockkit_and_kazoo_nodes() {
        assert_eq!(sequence("_c_0f2e-uuid-lock-0000000042"), Some(42));
        assert_eq!(sequence("3f9b2a__lock__0000000007"), Some(7));
        assert_eq!(sequence("lock-0000000001"), Some(1));
        assert_eq!(sequence("some-other-node"), None);
        assert_eq!(sequence("_c_x-lock-"), None);
        assert_eq!(sequence("_c_x-lock-12a"), None);
        let reader = format!("{}0000000009", reader_prefix("u"));
        assert_eq!(sequence(&reader), Some(9));
        assert!(is_reader(&reader) && !is_reader("_c_u-lock-0000000001"));
    }

    #[test]
    fn semaphores_are_apart_from_every_lock() {
        assert_eq!(semaphore_dir("/l", "jobs").unwrap(), "/l/%semaphores/jobs");
        for name in ["%semaphores", "%25semaphores", "semaphores"] {
            assert_ne!(lock_dir("/l", name).unwrap(), format!("/l/{SEMAPHORES}"));
        }
    }

    #[test]
    fn contenders_are_ordered_by_sequence_not_name() {
        let queue = contenders(vec![
            "_c_b-lock-0000000003".into(),
            "zz__lock__0000000001".into(),
            "readme".into(),
            "_c_a-lock-0000000002".into(),
        ]);
        let order: Vec<i64> = queue.iter().map(|(s, _)| *s).collect();
        assert_eq!(order, [1, 2, 3]);
    }
}
