//! Connecting to a server that is still starting: [`connect_retrying`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Backoff, LockError, Result};

/// The delays between connect attempts: from 10 ms, doubling up to 500 ms,
/// each drawn at random below its ceiling (the shared [`Backoff`]).
pub const CONNECT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// Makes connect attempts until one succeeds, one fails with anything but
/// [`LockError::Unavailable`] (a wrong password, say: trying again will not
/// help), or `limit` (the connect timeout) is spent, waiting
/// [`CONNECT_BACKOFF`] between them. A server that is still starting (its
/// port not open yet, or open but not serving) is waited for within the
/// connect timeout, as services that an orchestrator starts together need.
///
/// Each attempt is given the time left, to bound its own requests by, and
/// is cut off when it runs out. The error is the last attempt's that
/// ended (or, when the first attempt is cut off, `Unavailable`: "`what`:
/// no answer within `limit`"), with the number of attempts added to its
/// message.
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::LockError;
/// use lockkit_core::backend::connect_retrying;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let mut calls = 0;
/// let answer = connect_retrying("example", "connect", Duration::from_secs(2), |_left| {
///     calls += 1;
///     let starting = calls < 3;
///     async move {
///         if starting {
///             Err(LockError::unavailable("example", "connection refused"))
///         } else {
///             Ok("connected")
///         }
///     }
/// })
/// .await;
/// assert_eq!(answer.unwrap(), "connected");
/// assert_eq!(calls, 3);
/// # });
/// ```
pub async fn connect_retrying<T, F, Fut>(
    backend: &'static str,
    what: &str,
    limit: Duration,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let deadline = started + limit;
    let mut delays = CONNECT_BACKOFF.delays();
    let mut attempts = 0u32;
    let mut last: Option<LockError> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        attempts += 1;
        let error = match tokio::time::timeout(left, attempt(left)).await {
            Ok(Ok(connected)) => {
                if attempts > 1 {
                    tracing::debug!(
                        backend,
                        attempts,
                        waited = ?started.elapsed(),
                        "connected after the server came up"
                    );
                }
                return Ok(connected);
            }
            Ok(Err(error @ LockError::Unavailable { .. })) => error,
            Ok(Err(error)) => return Err(error),
            // Cut off by the deadline: the previous attempt's error says
            // more than the cut-off does.
            Err(_) => {
                let error = last.take().unwrap_or_else(|| {
                    LockError::unavailable(backend, format!("{what}: no answer within {limit:?}"))
                });
                return Err(with_attempts(error, attempts, limit));
            }
        };
        let wake = Instant::now() + delays.next().unwrap_or(CONNECT_BACKOFF.max());
        if wake >= deadline {
            return Err(with_attempts(error, attempts, limit));
        }
        tracing::debug!(backend, %error, attempts, "connect failed; retrying within the connect timeout");
        last = Some(error);
        tokio::time::sleep_until(wake).await;
    }
}

/// `error` (an `Unavailable`) with how many attempts were made.
fn with_attempts(error: LockError, attempts: u32, limit: Duration) -> LockError {
    match error {
        LockError::Unavailable {
            backend,
            message,
            source,
        } if attempts > 1 => LockError::Unavailable {
            backend,
            message: format!("{message} (after {attempts} connect attempts within {limit:?})"),
            source,
        },
        error => error,
    }
}

/// The `connect_timeout` and `command_timeout` setters of a backend's
/// builder, written once: `$holder` is the builder's field whose
/// `connect_timeout` and `command_timeout` they set, and the two strings
/// say what each bounds on that backend, with its default.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Default)]
/// struct Settings {
///     connect_timeout: Duration,
///     command_timeout: Duration,
/// }
///
/// /// A builder.
/// #[derive(Default)]
/// pub struct Builder {
///     settings: Settings,
/// }
///
/// impl Builder {
///     lockkit_core::timeout_setters!(
///         settings,
///         connect: "Time to reach the server when connecting (default 2 s).",
///         command: "Time to wait for one request (default 1 s).",
///     );
/// }
///
/// let builder = Builder::default().command_timeout(Duration::from_millis(500));
/// assert_eq!(builder.settings.command_timeout, Duration::from_millis(500));
/// ```
#[macro_export]
macro_rules! timeout_setters {
    ($holder:ident, connect: $connect:literal, command: $command:literal $(,)?) => {
        #[doc = $connect]
        pub fn connect_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.$holder.connect_timeout = timeout;
            self
        }

        #[doc = $command]
        pub fn command_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.$holder.command_timeout = timeout;
            self
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn gives_up_when_the_timeout_is_spent() {
        let started = Instant::now();
        let mut calls = 0;
        let error = connect_retrying::<(), _, _>("test", "connect", Duration::from_secs(1), |_| {
            calls += 1;
            async { Err(LockError::unavailable("test", "connection refused")) }
        })
        .await
        .unwrap_err();
        assert!(matches!(error, LockError::Unavailable { .. }), "{error}");
        assert!(calls > 3, "{calls} attempts");
        let message = error.to_string();
        assert!(
            message.contains("connection refused") && message.contains("connect attempts"),
            "{message}"
        );
        assert!(
            started.elapsed() <= Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_end_at_once() {
        let mut calls = 0;
        let error = connect_retrying::<(), _, _>("test", "connect", Duration::from_secs(1), |_| {
            calls += 1;
            async { Err(LockError::backend("test", "wrong password")) }
        })
        .await
        .unwrap_err();
        assert!(matches!(error, LockError::Backend { .. }), "{error}");
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_off_attempt_keeps_the_previous_error() {
        let mut calls = 0;
        let error =
            connect_retrying::<(), _, _>("test", "connect", Duration::from_secs(1), |left| {
                calls += 1;
                let first = calls == 1;
                async move {
                    if first {
                        Err(LockError::unavailable(
                            "test",
                            "no sentinel knows the master",
                        ))
                    } else {
                        tokio::time::sleep(left * 2).await;
                        Ok(())
                    }
                }
            })
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("no sentinel knows the master"),
            "{message}"
        );
        assert!(message.contains("after 2 connect attempts"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_attempt_is_cut_off_at_the_limit() {
        let started = Instant::now();
        let error = connect_retrying::<(), _, _>(
            "test",
            "connect",
            Duration::from_millis(300),
            |left| async move {
                tokio::time::sleep(left * 10).await;
                Ok(())
            },
        )
        .await
        .unwrap_err();
        assert!(
            error.to_string().contains("no answer within 300ms"),
            "{error}"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(300));
    }
}
