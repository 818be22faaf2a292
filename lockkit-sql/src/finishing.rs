//! Statements that must not be cut off halfway, without a task each.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

/// A future that, dropped before it is done, finishes in a task of its own
/// (its output dropped there): a caller that gives up does not cut a
/// statement off halfway, and a caller that waits costs no task.
pub(crate) struct Finishing<F: Future<Output: Send> + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future<Output: Send> + Send + 'static> Finishing<F> {
    pub(crate) fn new(future: F) -> Self {
        Finishing(Some(Box::pin(future)))
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for Finishing<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.0.as_mut() else {
            panic!("a finished future polled again");
        };
        let output = ready!(future.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for Finishing<F> {
    fn drop(&mut self) {
        let Some(future) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move { drop(future.await) })),
            Err(_) => tracing::warn!(
                "a statement given up outside a runtime cannot finish; what it wrote ends with its TTL"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_future_given_up_finishes_in_a_task() {
        let finished = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let attempt = Finishing::new({
            let finished = finished.clone();
            async move {
                let _ = wait.await;
                finished.store(true, Ordering::SeqCst);
            }
        });
        let given_up = tokio::time::timeout(Duration::from_millis(1), attempt).await;
        assert!(given_up.is_err(), "the future waits for `go`");
        go.send(()).unwrap();
        let done = async {
            while !finished.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), done)
            .await
            .expect("the future given up never finished");
    }

    #[tokio::test]
    async fn a_future_awaited_answers_its_caller() {
        assert_eq!(Finishing::new(async { 7 }).await, 7);
    }
}
