//! The `lockkit.acquire` span that every backend records its acquires under.

use std::future::Future;

use futures_util::FutureExt as _;
use tracing::Instrument;

use crate::error::{LockError, Result};

/// Runs one acquire (`op` is `"acquire"` or `"try_acquire"`) inside a
/// `lockkit.acquire` span that carries the lock name and the backend, and
/// records its outcome there: `acquired`, `busy` (where `acquired` says
/// `false`), `timeout` or `error`; with the `metrics` feature, it also
/// counts the acquire and records its duration ([`crate::metrics`]). For
/// backend implementors, so that every backend's traces look alike.
///
/// The returned future holds `acquire` once: an `async fn` would keep the
/// argument and the instrumented future it is moved into side by side,
/// doubling what every acquisition allocates.
pub fn traced_acquire<T>(
    op: &'static str,
    name: &str,
    backend: &'static str,
    acquire: impl Future<Output = Result<T>>,
    acquired: impl FnOnce(&T) -> bool,
) -> impl Future<Output = Result<T>> {
    let span = tracing::debug_span!(
        "lockkit.acquire",
        op,
        lock.name = %name,
        lock.backend = backend,
        outcome = tracing::field::Empty,
    );
    let started = tokio::time::Instant::now();
    acquire.instrument(span.clone()).map(move |result| {
        let outcome = match &result {
            Ok(value) if acquired(value) => "acquired",
            Ok(_) => "busy",
            Err(LockError::Timeout { .. }) => "timeout",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        crate::metrics::acquire(backend, op, outcome, started.elapsed());
        result
    })
}
