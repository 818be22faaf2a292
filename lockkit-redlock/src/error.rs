//! Quorum errors.

use lockkit_core::LockError;

pub(crate) const BACKEND: &str = "redlock";

/// `Unavailable`: too few instances answered to decide.
pub(crate) fn unreachable_quorum(
    answered: usize,
    total: usize,
    quorum: usize,
    reasons: &[String],
) -> LockError {
    let mut message = format!("{answered} of {total} Redis instances answered, quorum is {quorum}");
    append_reasons(&mut message, reasons);
    LockError::unavailable(BACKEND, message)
}

/// `Unavailable` for an acquire: how many answered, how many granted the lock.
pub(crate) fn no_quorum(
    answered: usize,
    granted: usize,
    total: usize,
    quorum: usize,
    reasons: &[String],
) -> LockError {
    let mut message = format!(
        "{answered} of {total} Redis instances answered ({granted} granted the lock), quorum is {quorum}"
    );
    append_reasons(&mut message, reasons);
    LockError::unavailable(BACKEND, message)
}

fn append_reasons(message: &mut String, reasons: &[String]) {
    const SHOWN: usize = 3;
    for reason in reasons.iter().take(SHOWN) {
        message.push_str("; ");
        message.push_str(reason);
    }
    if reasons.len() > SHOWN {
        message.push_str(&format!("; and {} more", reasons.len() - SHOWN));
    }
}

/// `Unavailable` for a status read whose answers fit both a held and a free
/// lock: an owner seen on fewer than `quorum` of the instances that answered
/// may hold a quorum with those that did not.
pub(crate) fn unsure_status(
    answered: usize,
    total: usize,
    quorum: usize,
    reasons: &[String],
) -> LockError {
    let mut message = format!(
        "{answered} of {total} Redis instances answered, quorum is {quorum}, and a holder seen on fewer than a quorum of them may hold one with those that did not"
    );
    append_reasons(&mut message, reasons);
    LockError::unavailable(BACKEND, message)
}
