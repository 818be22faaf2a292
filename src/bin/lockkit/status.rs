//! `lockkit status`: who holds a lock.

use lockkit::LockKind;

use crate::args::StatusArgs;
use crate::exit::{Exit, report};

/// The most permits a slotted semaphore has (`lockkit::sql::MAX_SLOT_PERMITS`;
/// a unit test keeps the two equal where the SQL backends are compiled in).
const SLOTS_WITHOUT_A_COUNT: u32 = 256;

pub(crate) async fn run(url: &str, args: StatusArgs) -> Exit {
    let locks = match lockkit::connect(url).await {
        Ok(locks) => locks,
        Err(error) => return report("connect", &error),
    };
    let (kind, what) = if let Some(permits) = args.permits {
        (LockKind::Semaphore { permits }, "semaphore")
    } else if args.semaphore {
        // Backends that keep permits in slots (the SQL modes) look at the
        // first `permits` slots: without a count, at every slot any backend
        // allows, so that a permit held in a later one is seen.
        (
            LockKind::Semaphore {
                permits: SLOTS_WITHOUT_A_COUNT,
            },
            "semaphore",
        )
    } else {
        (LockKind::Exclusive, "lock")
    };
    let status = match locks.status_of(&args.name, kind).await {
        Ok(status) => status,
        Err(error) => return report(&format!("status of {what} {:?}", args.name), &error),
    };
    if args.json {
        let json = serde_json::json!({
            "name": args.name,
            "held": status.held,
            "fencing_token": status.fencing_token.map(|t| t.get()),
            // Unknown, or a key without expiry (the text form says which).
            "remaining_ms": status
                .remaining
                .filter(|left| *left != std::time::Duration::MAX)
                .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            "waiters": status.waiters,
            "holders": status.holders,
            "holder": status.holder,
        });
        println!("{json}");
    } else {
        println!("{}: {status}", args.name);
    }
    Exit::Child(0)
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
mod tests {
    #[test]
    fn a_status_without_a_count_looks_at_every_slot() {
        assert_eq!(super::SLOTS_WITHOUT_A_COUNT, lockkit::sql::MAX_SLOT_PERMITS);
    }
}
