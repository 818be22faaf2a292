//! Cases about the servers' wall clocks, on harnesses that can move them
//! ([`Disposable::shift_clock`](crate::Disposable::shift_clock)).

use std::time::Duration;

use lockkit_core::LockOptions;

use crate::Harness;
use crate::cases::{must_acquire, unique};

/// How far the clock leaps: far more than the case's leases.
const LEAP: Duration = Duration::from_secs(120);

/// A fencing token drawn after the server's clock went back is greater
/// than the token of a holding that was granted before the clock went back
/// and released after. (Tokens that start at the server's clock, as Redis's
/// do, must not follow it back while such a holder may still write.
/// Not asked: a token drawn after the clock went back and a holding released
/// *before* that, whose holder writes no more; see the Redis backend's
/// guide page.) Nothing to check where the harness cannot move the clock,
/// or the backend gives no tokens.
pub async fn fencing_tokens_keep_rising_when_the_server_clock_goes_back(h: &dyn Harness) {
    let mut server = h.disposable().await;
    if !server.shift_clock(Some(LEAP)).await {
        return;
    }
    let client = server.connect().await.expect("connect");
    let name = unique("clock-back");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let guard = must_acquire(client.as_ref(), &name, &opts).await;
    let Some(held) = guard.fencing_token() else {
        return;
    };
    server.shift_clock(None).await;
    guard
        .release()
        .await
        .expect("release after the clock went back");
    let guard = must_acquire(client.as_ref(), &name, &opts).await;
    let after = guard.fencing_token().expect("a token");
    guard.release().await.expect("release");
    assert!(
        after > held,
        "the token drawn after the clock went back, {after:?}, is not above {held:?}, drawn before"
    );
}
