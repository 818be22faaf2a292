//! The rule every store keeps, and the input it accepts.

use lockkit_core::FencingToken;

use crate::error::{FenceError, Result};

/// The longest resource name, in bytes (the SQL column is `VARCHAR(255)`).
pub const MAX_RESOURCE_LEN: usize = 255;

/// The largest token a SQL store keeps (its column is a signed `BIGINT`).
pub const MAX_SQL_TOKEN: u64 = i64::MAX as u64;

/// Checks a resource name: 1 to [`MAX_RESOURCE_LEN`] bytes, no control
/// characters.
///
/// ```
/// assert!(lockkit_fence::check_resource("reports/2026-11").is_ok());
/// assert!(lockkit_fence::check_resource("").is_err());
/// assert!(lockkit_fence::check_resource(&"x".repeat(256)).is_err());
/// ```
pub fn check_resource(resource: &str) -> Result<()> {
    let reason = if resource.is_empty() {
        "it is empty"
    } else if resource.len() > MAX_RESOURCE_LEN {
        "it is longer than 255 bytes"
    } else if resource.chars().any(char::is_control) {
        "it holds a control character"
    } else {
        return Ok(());
    };
    Err(invalid(resource, reason))
}

pub(crate) fn invalid(resource: &str, reason: &'static str) -> FenceError {
    FenceError::InvalidResource {
        resource: resource.chars().take(64).collect(),
        reason,
    }
}

/// The token as the signed `BIGINT` that `lockkit_fence` takes, for a
/// statement that carries the fence itself; [`FenceError::TokenOutOfRange`]
/// above [`MAX_SQL_TOKEN`].
///
/// ```
/// use lockkit_fence::{FencingToken, bigint};
/// assert_eq!(bigint(FencingToken::new(42)).unwrap(), 42);
/// assert!(bigint(FencingToken::new(u64::MAX)).is_err());
/// ```
pub fn bigint(token: FencingToken) -> Result<i64> {
    sql_token(token, "sql")
}

/// The token as a SQL store's signed `BIGINT`.
#[allow(dead_code)] // not every store feature uses it
pub(crate) fn sql_token(token: FencingToken, store: &'static str) -> Result<i64> {
    i64::try_from(token.get()).map_err(|_| FenceError::TokenOutOfRange {
        token,
        store,
        max: MAX_SQL_TOKEN,
    })
}

/// The greatest token in a stale refusal's message: its last word.
#[allow(dead_code)] // not every store feature uses it
pub(crate) fn greatest_in(message: &str) -> Option<u64> {
    message
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|word| !word.is_empty())
        .and_then(|word| word.parse().ok())
}
