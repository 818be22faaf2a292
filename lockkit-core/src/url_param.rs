//! Helpers for backends that read options from URL query parameters.

use std::time::Duration;

/// The longest timeout a URL parameter may set.
pub const MAX_TIMEOUT_PARAM: Duration = Duration::from_secs(3600);

/// Parses a timeout given as a URL parameter (`500ms`, `2s`, `1m`): positive
/// and at most one hour. The error is a reason for
/// [`LockError::invalid_url`](crate::LockError::invalid_url).
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::timeout_param;
/// assert_eq!(timeout_param("connect_timeout", "250ms"), Ok(Duration::from_millis(250)));
/// assert!(timeout_param("connect_timeout", "0s").is_err());
/// assert!(timeout_param("connect_timeout", "soon").is_err());
/// ```
pub fn timeout_param(key: &str, value: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(value)
        .map_err(|e| format!("{key}={value:?} is not a duration like 500ms or 2s: {e}"))?;
    if parsed.is_zero() || parsed > MAX_TIMEOUT_PARAM {
        return Err(format!(
            "{key}={value:?} must be positive and at most one hour"
        ));
    }
    Ok(parsed)
}
