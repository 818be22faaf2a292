//! Panics anywhere in the test process, counted: a panic in a task that a
//! driver or lockkit spawned is caught by the runtime and would otherwise go
//! unseen by the case that caused it.

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static PANICS: AtomicU64 = AtomicU64::new(0);
static HOOK: Once = Once::new();

/// How many panics the process has had since the first call (which installs
/// the counting hook, in front of the hook that was there).
pub(crate) fn count() -> u64 {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
    PANICS.load(Ordering::SeqCst)
}
