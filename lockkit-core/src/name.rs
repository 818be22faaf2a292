//! Lock-name rules shared by every backend.

use crate::error::{LockError, Result};

/// The longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Checks a lock name against the rules every backend keeps: 1..=255 bytes of
/// UTF-8 without control characters (Unicode category Cc).
///
/// Names are case-sensitive and otherwise free-form: `/`, `..`, `{}`, spaces and
/// non-ASCII text are all fine, and each backend maps them injectively into its
/// own keyspace.
///
/// ```
/// use lockkit_core::backend::validate_name;
/// assert!(validate_name("orders/2024 ünïcode {x}").is_ok());
/// assert!(validate_name("").is_err());
/// assert!(validate_name("tab\there").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "it is empty".to_owned()
    } else if name.len() > MAX_NAME_LEN {
        format!(
            "it is {} bytes long, the limit is {MAX_NAME_LEN}",
            name.len()
        )
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        format!("it contains the control character {c:?}")
    } else {
        return Ok(());
    };
    Err(LockError::InvalidName {
        name: display_name(name),
        reason,
    })
}

/// The name escaped and shortened so that it is safe to print.
pub(crate) fn display_name(name: &str) -> String {
    const SHOWN: usize = 64;
    let mut shown: String = name.chars().take(SHOWN).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    format!("{shown:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_limits() {
        assert!(validate_name("a").is_ok());
        assert!(validate_name(&"x".repeat(255)).is_ok());
        // 2-byte characters: 127 of them are 254 bytes.
        assert!(validate_name(&"é".repeat(127)).is_ok());
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            String::new(),
            "x".repeat(256),
            "é".repeat(128),
            "a\0b".to_owned(),
            "new\nline".to_owned(),
            "del\u{7f}".to_owned(),
            "c1\u{85}".to_owned(),
        ] {
            let err = validate_name(&bad).unwrap_err();
            assert!(matches!(err, LockError::InvalidName { .. }), "{bad:?}");
        }
    }

    #[test]
    fn message_is_escaped_and_short() {
        let err = validate_name(&format!("{}\n", "y".repeat(300))).unwrap_err();
        let text = err.to_string();
        assert!(!text.contains('\n'));
        assert!(text.len() < 200, "{text}");
    }
}
