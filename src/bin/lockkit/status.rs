//! `lockkit status`: who holds a lock.

use lockkit::LockKind;

use crate::args::StatusArgs;
use crate::exit::{Exit, report};

pub(crate) async fn run(url: &str, args: StatusArgs) -> Exit {
    let locks = match lockkit::connect(url).await {
        Ok(locks) => locks,
        Err(error) => return report("connect", &error),
    };
    let (kind, what) = if args.semaphore {
        // Any number of permits: a status does not depend on it.
        (LockKind::Semaphore { permits: 1 }, "semaphore")
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
