//! What a waiter hears when its turn grants it the lease (see
//! [`Waiting::Turn`](crate::Waiting::Turn)): the stamp its attempt carried,
//! read back as the instant that attempt was sent, and the fencing token the
//! release drew for it.

use std::sync::LazyLock;
use std::time::Duration;

use lockkit_core::backend::OwnerToken;
use tokio::time::Instant;

/// The turn a kept place in line is to grant (see `crate::places`): a
/// lease of `ttl` for `owner` (`stored` as the lock key holds it), its
/// record stamped `stamp` (see [`stamp`]); the place at `place` (µs since
/// the Unix epoch by the client's clock, see
/// `RedisInstance::release_keeping_place`) or at the server's clock.
pub(crate) struct NextTurn {
    pub(crate) owner: OwnerToken,
    pub(crate) stored: String,
    pub(crate) ttl: Duration,
    pub(crate) stamp: u64,
    pub(crate) place: Option<u64>,
}

/// The instant stamps count from: the first one this process needed.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Now, as a stamp (µs since the first stamp this process took, rounded
/// down; see [`turn_instant`](crate::turn_instant)): taken before the
/// attempt that carries it is sent, so that its instant is no later than
/// the sending.
pub fn stamp() -> u64 {
    u64::try_from(EPOCH.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The instant of a stamp this process took.
pub fn instant_of(stamp: u64) -> Instant {
    *EPOCH + Duration::from_micros(stamp)
}

/// A granted turn's message, `<stamp>|<token>|<owner>` (see `RELEASE` in
/// the scripts), if it grants `owner`: its stamp and its token (0 without
/// fencing). `None` for another owner's (an acquisition of this client that
/// ended before its message came) or a message of another form.
pub(crate) fn read(message: &str, owner: &str) -> Option<(u64, u64)> {
    let (stamp, rest) = message.split_once('|')?;
    let (token, granted) = rest.split_once('|')?;
    if granted != owner {
        return None;
    }
    Some((stamp.parse().ok()?, token.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_read_for_its_owner_only() {
        assert_eq!(read("12|34|own\x1fer|x", "own\x1fer|x"), Some((12, 34)));
        assert_eq!(read("12|0|owner", "owner"), Some((12, 0)));
        assert_eq!(read("12|34|other", "owner"), None);
        assert_eq!(read("", "owner"), None);
        assert_eq!(read("x|34|owner", "owner"), None);
        assert_eq!(read("12|owner", "owner"), None);
    }

    #[test]
    fn a_stamp_reads_back_no_later_than_it_was_taken() {
        let before = Instant::now();
        let stamp = stamp();
        assert!(instant_of(stamp) <= Instant::now());
        assert!(instant_of(stamp) + Duration::from_micros(1) >= before);
    }
}
