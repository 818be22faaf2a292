//! Owner tokens, and the holder identity stored beside them.

use std::borrow::Cow;
use std::fmt;

/// The random 128-bit token (a UUID v4) that identifies one holding of a lock.
///
/// Release and extend compare it atomically on the server, so a client can never
/// remove or prolong a lease that is not its own. The token is not a secret, but
/// it is also not printed in full: `Debug` shows its first 8 characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(String);

impl OwnerToken {
    /// A fresh random token.
    pub fn new() -> Self {
        // Written into a buffer of its own: `to_string` would go through
        // the formatting machinery, on every acquire.
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
        OwnerToken((*text).to_owned())
    }

    /// Moves the token out, leaving an empty one (which no holding has) in
    /// its place.
    pub(crate) fn take(&mut self) -> OwnerToken {
        OwnerToken(std::mem::take(&mut self.0))
    }

    /// The token as a 36-character lowercase hyphenated UUID.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for OwnerToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({}…)", &self.0[..8])
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Between the owner token and the holder identity in a stored owner (a
/// control character, which identities never contain).
pub const HOLDER_SEPARATOR: char = '\x1f';

/// What a backend stores as the owner of a holding: the owner token, then
/// [`HOLDER_SEPARATOR`] and the holder identity where one is recorded. Owner
/// comparisons on the server compare this whole value.
pub fn stored_owner<'a>(owner: &'a str, holder: Option<&str>) -> Cow<'a, str> {
    match holder {
        Some(holder) => Cow::Owned(format!("{owner}{HOLDER_SEPARATOR}{holder}")),
        None => Cow::Borrowed(owner),
    }
}

/// The holder identity in a stored owner (see [`stored_owner`]), if it
/// records one.
pub fn holder_of(stored: &str) -> Option<&str> {
    stored
        .split_once(HOLDER_SEPARATOR)
        .map(|(_, holder)| holder)
}

#[cfg(test)]
mod tests {
    use super::{OwnerToken, holder_of, stored_owner};

    #[test]
    fn holder_identities_round_trip_through_the_stored_owner() {
        let owner = OwnerToken::new();
        assert_eq!(stored_owner(owner.as_str(), None), owner.as_str());
        assert_eq!(holder_of(owner.as_str()), None);
        let stored = stored_owner(owner.as_str(), Some("host-a:17"));
        assert_eq!(holder_of(&stored), Some("host-a:17"));
        assert!(stored.starts_with(owner.as_str()));
    }

    #[test]
    fn tokens_are_unique_uuids() {
        let a = OwnerToken::new();
        let b = OwnerToken::new();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        let parsed = uuid::Uuid::parse_str(a.as_str()).expect("a UUID");
        assert_eq!(a.as_str(), parsed.hyphenated().to_string());
        assert_eq!(format!("{a:?}").len(), "OwnerToken(12345678…)".len());
    }
}
