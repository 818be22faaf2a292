//! HTTP services: a [`tower`](https://docs.rs/tower) layer that refuses a
//! request whose `Fencing-Token` header is stale for its resource.
//!
//! The caller says which resource a request writes ([`FenceLayer::new`]'s
//! function, from the method, path or anything else; `None` lets the
//! request through unfenced). For a fenced request the layer reads the
//! `Fencing-Token` header (a decimal number) and answers:
//!
//! * **409 Conflict** when a greater token was admitted for the resource,
//!   with a JSON body naming the resource, the token and the greatest
//!   admitted token; the inner service never sees the request;
//! * **428 Precondition Required** when the header is missing, **400 Bad
//!   Request** when it is not a number or the resource name is invalid;
//! * otherwise it records the token and passes the request on, holding the
//!   resource until the inner service has answered, so that requests to one
//!   resource are served one at a time, in the order their tokens were
//!   admitted.
//!
//! The tokens live in the [`Fences`] the layer was given, in this process:
//! one entry per resource ever fenced. A service run as several replicas
//! fences in the store they share instead (SQL, Redis, etcd).
//!
//! ```
//! # async fn f() {
//! use lockkit_fence::http::{FenceLayer, Fences};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! let fences = Fences::new();
//! let service = ServiceBuilder::new()
//!     .layer(FenceLayer::new(fences.clone(), |request: &http::Request<String>| {
//!         Some(request.uri().path().to_owned())
//!     }))
//!     .service_fn(|_request: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("written")))
//!     });
//! let request = http::Request::put("/reports/daily")
//!     .header("Fencing-Token", "42")
//!     .body(String::new())
//!     .unwrap();
//! let response = service.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), http::StatusCode::OK);
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode, header};
use lockkit_core::FencingToken;
use tokio::sync::OwnedMutexGuard;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{FenceError, Result};
use crate::resource::check_resource;

/// The header that carries the writer's fencing token.
pub const FENCING_TOKEN: &str = "fencing-token";

/// One resource: its greatest admitted token, and the gate that requests
/// for it pass one at a time.
#[derive(Default)]
struct Slot {
    gate: Arc<tokio::sync::Mutex<()>>,
    greatest: Mutex<Option<u64>>,
}

impl Slot {
    fn greatest(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.greatest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The greatest admitted token of every resource, in this process. Cheap to
/// clone; clones share the tokens.
#[derive(Clone, Default)]
pub struct Fences {
    slots: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
}

impl fmt::Debug for Fences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fences")
            .field("resources", &self.slots().len())
            .finish()
    }
}

/// An admitted token: the resource stays held, and later tokens for it wait,
/// until this is dropped.
#[derive(Debug)]
pub struct Admitted {
    _held: OwnedMutexGuard<()>,
}

impl Fences {
    /// No fences yet.
    pub fn new() -> Fences {
        Fences::default()
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, resource: &str) -> Arc<Slot> {
        let mut slots = self.slots();
        if let Some(slot) = slots.get(resource) {
            return Arc::clone(slot);
        }
        let slot = Arc::new(Slot::default());
        slots.insert(resource.to_owned(), Arc::clone(&slot));
        slot
    }

    /// Admits `token` for `resource` (waiting while an earlier admitted
    /// request for it is served), or refuses it as stale.
    pub async fn admit(&self, resource: &str, token: FencingToken) -> Result<Admitted> {
        check_resource(resource)?;
        let slot = self.slot(resource);
        let held = Arc::clone(&slot.gate).lock_owned().await;
        let mut greatest = slot.greatest();
        match *greatest {
            Some(greatest) if token.get() < greatest => {
                Err(FenceError::stale(resource, token, greatest))
            }
            _ => {
                *greatest = Some(token.get());
                Ok(Admitted { _held: held })
            }
        }
    }

    /// The greatest token admitted for `resource`, if any.
    pub fn greatest(&self, resource: &str) -> Option<FencingToken> {
        let slot = self.slots().get(resource).cloned()?;
        let greatest = *slot.greatest();
        greatest.map(FencingToken::new)
    }
}

/// The layer: see the module docs.
pub struct FenceLayer<F> {
    fences: Fences,
    resource_of: Arc<F>,
}

impl<F> FenceLayer<F> {
    /// Fences the requests for which `resource_of` names a resource, in
    /// `fences`.
    pub fn new(fences: Fences, resource_of: F) -> FenceLayer<F> {
        FenceLayer {
            fences,
            resource_of: Arc::new(resource_of),
        }
    }
}

impl<F> Clone for FenceLayer<F> {
    fn clone(&self) -> Self {
        FenceLayer {
            fences: self.fences.clone(),
            resource_of: Arc::clone(&self.resource_of),
        }
    }
}

impl<F> fmt::Debug for FenceLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceLayer")
            .field("fences", &self.fences)
            .finish_non_exhaustive()
    }
}

impl<S, F> Layer<S> for FenceLayer<F> {
    type Service = FenceService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            fences: self.fences.clone(),
            resource_of: Arc::clone(&self.resource_of),
        }
    }
}

/// The service [`FenceLayer`] wraps around another.
pub struct FenceService<S, F> {
    inner: S,
    fences: Fences,
    resource_of: Arc<F>,
}

impl<S: Clone, F> Clone for FenceService<S, F> {
    fn clone(&self) -> Self {
        FenceService {
            inner: self.inner.clone(),
            fences: self.fences.clone(),
            resource_of: Arc::clone(&self.resource_of),
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for FenceService<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceService")
            .field("inner", &self.inner)
            .field("fences", &self.fences)
            .finish_non_exhaustive()
    }
}

/// The future of [`FenceService`].
pub type FenceFuture<T, E> = Pin<Box<dyn Future<Output = std::result::Result<T, E>> + Send>>;

impl<S, F, B, R> Service<Request<B>> for FenceService<S, F>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
    B: Send + 'static,
    R: From<String> + Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = FenceFuture<Response<R>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was not driven ready stays here; the ready one serves.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(resource) = (self.resource_of)(&request) else {
            return Box::pin(inner.call(request));
        };
        let token = match request.headers().get(FENCING_TOKEN).map(token_of) {
            None => {
                return refuse(
                    StatusCode::PRECONDITION_REQUIRED,
                    &resource,
                    "the request has no Fencing-Token header",
                    None,
                );
            }
            Some(None) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &resource,
                    "the Fencing-Token header is not a decimal number",
                    None,
                );
            }
            Some(Some(token)) => token,
        };
        let fences = self.fences.clone();
        Box::pin(async move {
            match fences.admit(&resource, token).await {
                Ok(admitted) => {
                    let response = inner.call(request).await;
                    drop(admitted);
                    response
                }
                Err(FenceError::Stale { greatest, .. }) => Ok(answer(
                    StatusCode::CONFLICT,
                    &resource,
                    "stale fencing token",
                    Some((token, greatest)),
                )),
                Err(error) => Ok(answer(
                    StatusCode::BAD_REQUEST,
                    &resource,
                    &error.to_string(),
                    None,
                )),
            }
        })
    }
}

fn token_of(value: &HeaderValue) -> Option<FencingToken> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().map(FencingToken::new)
}

fn refuse<R: From<String> + Send + 'static, E: Send + 'static>(
    status: StatusCode,
    resource: &str,
    error: &str,
    tokens: Option<(FencingToken, FencingToken)>,
) -> FenceFuture<Response<R>, E> {
    let response = answer(status, resource, error, tokens);
    Box::pin(std::future::ready(Ok(response)))
}

/// A refusal: `{"error": …, "resource": …, "token": …, "greatest": …}`.
fn answer<R: From<String>>(
    status: StatusCode,
    resource: &str,
    error: &str,
    tokens: Option<(FencingToken, FencingToken)>,
) -> Response<R> {
    let mut body = format!(
        "{{\"error\":{},\"resource\":{}",
        json(error),
        json(resource)
    );
    if let Some((token, greatest)) = tokens {
        body.push_str(&format!(",\"token\":{token},\"greatest\":{greatest}"));
    }
    body.push('}');
    let mut response = Response::new(R::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A JSON string literal.
fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::json;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
