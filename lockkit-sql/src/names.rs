//! How lock names and table names reach the database: lock names only ever as
//! bound parameters, as hexadecimal literals (MySQL and MariaDB, see
//! `hex_literal`), or through the documented derivations below; table names
//! validated as plain identifiers before they are written into SQL.

use std::borrow::Cow;

use lockkit_core::{LockError, Result};
use sha2::{Digest, Sha256};

/// The default name of the lease table.
pub const DEFAULT_TABLE: &str = "lockkit_locks";

/// The longest table name accepted: room for the `_fence_seq` / `_fence`
/// suffixes of the counter objects within Postgres's 63-byte identifiers.
pub const MAX_TABLE_LEN: usize = 48;

/// The longest MySQL/MariaDB named lock used verbatim, in characters.
const NAMED_LOCK_MAX_CHARS: usize = 64;
/// MariaDB's limit on a named lock, in bytes.
const NAMED_LOCK_MAX_BYTES: usize = 192;

/// A lock name as a MySQL/MariaDB hexadecimal literal of its UTF-8 bytes
/// (`X'6a6f6273'` for `jobs`), for statements sent several in one message,
/// where nothing can be bound: the text written into the SQL is hex digits
/// alone, whatever the name holds.
#[cfg(feature = "mysql")]
pub(crate) fn hex_literal(name: &str) -> String {
    use std::fmt::Write as _;
    let mut literal = String::with_capacity(3 + 2 * name.len());
    literal.push_str("X'");
    for byte in name.bytes() {
        let _ = write!(literal, "{byte:02x}");
    }
    literal.push('\'');
    literal
}

/// The Postgres advisory-lock key of a lock name: the first 8 bytes of the
/// SHA-256 of the name's UTF-8 bytes, read as a big-endian `i64`.
///
/// It is the `bigint` passed to `pg_advisory_lock`, so another client can take
/// the same lock by hand: `SELECT pg_advisory_lock(<key>)`. In `pg_locks` the
/// key shows as `classid` (high 32 bits) and `objid` (low 32 bits) with
/// `objsubid = 1`. Two names share a key only on a 64-bit hash collision
/// (about one chance in 10⁹ among 190 000 names in use at once).
///
/// ```
/// assert_eq!(lockkit_sql::advisory_key("job"), lockkit_sql::advisory_key("job"));
/// assert_ne!(lockkit_sql::advisory_key("job"), lockkit_sql::advisory_key("Job"));
/// ```
pub fn advisory_key(name: &str) -> i64 {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The most permits of a semaphore in the SQL modes that have them: each
/// permit is a slot of its own (an advisory key, a `GET_LOCK` name, a lease
/// row), tried in turn while all are taken.
pub const MAX_SLOT_PERMITS: u32 = 256;

/// `Unsupported` for a semaphore of more than [`MAX_SLOT_PERMITS`] permits.
pub(crate) fn check_slot_permits(backend: &'static str, permits: u32) -> Result<()> {
    if permits > MAX_SLOT_PERMITS {
        return Err(LockError::Unsupported {
            backend,
            operation: "hold a semaphore of more than 256 permits (one slot per permit)",
        });
    }
    Ok(())
}

/// The Postgres advisory-lock key of permit slot `slot` (0-based) of the
/// semaphore `name`: [`advisory_key`] of the name, a NUL byte and the slot
/// in decimal. Lock names cannot contain NUL, so slot keys are apart from
/// every lock's key (but for 64-bit hash collisions). A holder of permit
/// slot 2 of `jobs` holds `pg_advisory_lock(<key>)` exclusively, so another
/// client can take a permit by hand by taking one of the slots' keys.
///
/// ```
/// use lockkit_sql::{advisory_key, semaphore_slot_key};
/// assert_ne!(semaphore_slot_key("jobs", 0), semaphore_slot_key("jobs", 1));
/// assert_ne!(semaphore_slot_key("jobs", 0), advisory_key("jobs"));
/// ```
pub fn semaphore_slot_key(name: &str, slot: u32) -> i64 {
    advisory_key(&format!("{name}\0{slot}"))
}

/// The MySQL/MariaDB `GET_LOCK` name of permit slot `slot` (0-based) of the
/// semaphore `name` in `named` mode: `SEM#`, the first 20 bytes of the
/// SHA-256 of the name in RFC 4648 base32 (no padding), `#` and the slot in
/// decimal. `SEM#` is neither a verbatim name (those are lower case) nor
/// `LK#`, so slot names are apart from every lock's name; at most 47
/// characters. A holder of slot 2 of `jobs` holds
/// `GET_LOCK(semaphore_slot_name("jobs", 2), …)`.
///
/// ```
/// use lockkit_sql::{named_lock_name, semaphore_slot_name};
/// let slot = semaphore_slot_name("jobs", 2);
/// assert!(slot.starts_with("SEM#") && slot.ends_with("#2"));
/// assert_ne!(slot, named_lock_name("jobs"));
/// ```
pub fn semaphore_slot_name(name: &str, slot: u32) -> String {
    let digest = Sha256::digest(name.as_bytes());
    format!(
        "SEM#{}#{slot}",
        data_encoding::BASE32_NOPAD.encode(&digest[..20])
    )
}

/// The MySQL/MariaDB `GET_LOCK` name of a lock name.
///
/// A name of at most 64 characters (and at most 192 bytes, MariaDB's limit)
/// that lower-casing leaves unchanged is used verbatim, so `GET_LOCK('job', 0)`
/// in any other client is the same lock. Every other name becomes `LK#`
/// followed by the RFC 4648 base32 (no padding) of its SHA-256: MySQL compares
/// lock names case-insensitively and limits them to 64 characters, and the
/// upper-case `LK#` form can never collide with a verbatim name.
///
/// ```
/// use lockkit_sql::named_lock_name;
/// assert_eq!(named_lock_name("nightly-job"), "nightly-job");
/// assert!(named_lock_name("Nightly-Job").starts_with("LK#"));
/// assert_eq!(named_lock_name(&"x".repeat(65)).len(), 55);
/// ```
pub fn named_lock_name(name: &str) -> Cow<'_, str> {
    let verbatim = name.chars().count() <= NAMED_LOCK_MAX_CHARS
        && name.len() <= NAMED_LOCK_MAX_BYTES
        && is_lowercase(name);
    if verbatim {
        Cow::Borrowed(name)
    } else {
        let digest = Sha256::digest(name.as_bytes());
        Cow::Owned(format!(
            "LK#{}",
            data_encoding::BASE32_NOPAD.encode(&digest)
        ))
    }
}

/// Whether `text` is its own lowercase (`text.to_lowercase() == text`),
/// without building the lowercase: each character maps to itself alone.
/// (`str::to_lowercase` differs from the characters' own mapping only for
/// a capital sigma, which maps to another character either way.)
fn is_lowercase(text: &str) -> bool {
    if text.is_ascii() {
        return !text.bytes().any(|b| b.is_ascii_uppercase());
    }
    text.chars().all(|c| {
        let mut lower = c.to_lowercase();
        lower.next() == Some(c) && lower.next().is_none()
    })
}

/// Checks a table name: an ASCII letter or `_`, then letters, digits or `_`,
/// at most [`MAX_TABLE_LEN`] bytes. Only such names are ever written into SQL.
pub fn validate_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if first_ok && rest_ok && table.len() <= MAX_TABLE_LEN {
        Ok(())
    } else {
        Err(LockError::invalid_options(format!(
            "table name {table:?} must be a plain SQL identifier: an ASCII letter or '_', then letters, digits or '_', at most {MAX_TABLE_LEN} characters"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "mysql")]
    #[test]
    fn a_hex_literal_is_hex_digits_whatever_the_name_holds() {
        assert_eq!(hex_literal("jobs"), "X'6a6f6273'");
        assert_eq!(hex_literal(""), "X''");
        let literal = hex_literal("a'; DROP TABLE t; -- é?");
        let digits = &literal[2..literal.len() - 1];
        assert!(digits.bytes().all(|b| b.is_ascii_hexdigit()), "{literal}");
        assert_eq!(digits.len(), 2 * "a'; DROP TABLE t; -- é?".len());
    }

    #[test]
    fn advisory_key_is_the_documented_hash() {
        // SHA-256("job") = 0x3a7a5b...; the key is its first 8 bytes.
        let digest = Sha256::digest(b"job");
        let expected = i64::from_be_bytes(digest[..8].try_into().unwrap());
        assert_eq!(advisory_key("job"), expected);
        assert_ne!(advisory_key("a"), advisory_key("b"));
    }

    #[test]
    fn named_locks_verbatim_or_hashed() {
        assert_eq!(named_lock_name("job"), "job");
        assert_eq!(named_lock_name(&"a".repeat(64)), "a".repeat(64));
        assert_eq!(named_lock_name("ünïcödé"), "ünïcödé");
        for hashed in [
            "Job".to_owned(),
            "a".repeat(65),
            // A title-case letter is not upper case, but lower-casing changes it.
            "ǅ".to_owned(),
            // 64 characters but 256 bytes: over MariaDB's limit.
            "😀".repeat(64),
        ] {
            let mapped = named_lock_name(&hashed);
            assert!(mapped.starts_with("LK#"), "{hashed:?} -> {mapped}");
            assert_eq!(mapped.len(), 3 + 52);
            assert!(mapped.chars().count() <= 64);
        }
        assert_ne!(named_lock_name("Job"), named_lock_name("JOB"));
        // A verbatim name never looks like a hashed one.
        assert!(named_lock_name("lk#abc").starts_with("lk#"));
    }

    #[test]
    fn the_lowercase_check_agrees_with_to_lowercase() {
        let agrees = |text: &str| is_lowercase(text) == (text.to_lowercase() == text);
        for text in [
            "", "job", "Job", "ß", "ẞ", "σς", "Σ", "aΣ", "aΣb", "İ", "ǅ", "ᾳ", "ᾼ",
        ] {
            assert!(agrees(text), "{text:?}");
        }
        for c in (0..=0x10_FFFF).filter_map(char::from_u32) {
            let mut buf = [0; 4];
            assert!(agrees(c.encode_utf8(&mut buf)), "{c:?}");
        }
    }

    #[test]
    fn table_names() {
        for ok in ["lockkit_locks", "_t", "T1", &"a".repeat(MAX_TABLE_LEN)] {
            validate_table(ok).unwrap();
        }
        for bad in [
            "",
            "1t",
            "t-1",
            "t;drop table x",
            "a.b",
            "\"t\"",
            "tä",
            &"a".repeat(MAX_TABLE_LEN + 1),
        ] {
            assert!(
                matches!(validate_table(bad), Err(LockError::InvalidOptions { .. })),
                "{bad:?}"
            );
        }
    }
}
