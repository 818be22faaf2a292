//! Waiting for a condition in tests, with a deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Awaits `check` every 50 ms until it answers `true` (then `true`), or
/// until `timeout` has passed (then `false`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
///
/// let ready = lockkit_testkit::eventually(Duration::from_secs(1), || async { true }).await;
/// assert!(ready);
/// # }
/// ```
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
