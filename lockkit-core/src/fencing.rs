//! Fencing tokens.

use std::fmt;

/// A number that strictly increases from one holder of a lock to the next.
///
/// Pass it with every write to the resource the lock protects, and let the
/// resource reject a write whose token is lower than the last one it accepted.
/// That keeps a holder that was paused past its lease (GC, swap, a stopped VM)
/// from overwriting the work of the holder that came after it — something a lock
/// alone cannot prevent.
///
/// ```
/// use lockkit_core::FencingToken;
/// let older = FencingToken::new(41);
/// let newer = FencingToken::new(42);
/// assert!(older < newer);
/// assert_eq!(newer.get(), 42);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
