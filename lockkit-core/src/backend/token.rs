//! Owner tokens.

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
        OwnerToken(uuid::Uuid::new_v4().hyphenated().to_string())
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

#[cfg(test)]
mod tests {
    use super::OwnerToken;

    #[test]
    fn tokens_are_unique_uuids() {
        let a = OwnerToken::new();
        let b = OwnerToken::new();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert!(uuid::Uuid::parse_str(a.as_str()).is_ok());
        assert_eq!(format!("{a:?}").len(), "OwnerToken(12345678…)".len());
    }
}
