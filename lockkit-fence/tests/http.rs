//! The tower layer: 409 for a stale `Fencing-Token`, the inner service
//! untouched; requests for one resource served one at a time.
#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Request, Response, StatusCode};
use lockkit_core::FencingToken;
use lockkit_fence::http::{FenceLayer, Fences};
use tokio::sync::{Semaphore, mpsc};
use tower::{Service, ServiceBuilder, ServiceExt};

fn put(path: &str, token: Option<&str>) -> Request<String> {
    let mut request = Request::put(path);
    if let Some(token) = token {
        request = request.header("Fencing-Token", token);
    }
    request.body(String::new()).expect("a request")
}

/// Fences `/reports/…` by path; `/health` is not fenced.
fn layer(
    fences: &Fences,
) -> FenceLayer<impl Fn(&Request<String>) -> Option<String> + Send + Sync + 'static> {
    FenceLayer::new(fences.clone(), |request: &Request<String>| {
        let path = request.uri().path();
        path.starts_with("/reports/").then(|| path.to_owned())
    })
}

#[tokio::test]
async fn a_stale_token_gets_409_and_never_reaches_the_service() {
    let fences = Fences::new();
    let served = Arc::new(AtomicUsize::new(0));
    let service = {
        let served = Arc::clone(&served);
        ServiceBuilder::new()
            .layer(layer(&fences))
            .service_fn(move |_request: Request<String>| {
                served.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(String::from("written"))) }
            })
    };
    let status = |response: &Response<String>| response.status();

    let ok = service
        .clone()
        .oneshot(put("/reports/daily", Some("11")))
        .await
        .unwrap();
    assert_eq!(status(&ok), StatusCode::OK);
    let again = service
        .clone()
        .oneshot(put("/reports/daily", Some("11")))
        .await
        .unwrap();
    assert_eq!(
        status(&again),
        StatusCode::OK,
        "the same holder writes again"
    );
    let stale = service
        .clone()
        .oneshot(put("/reports/daily", Some("10")))
        .await
        .unwrap();
    assert_eq!(status(&stale), StatusCode::CONFLICT);
    assert_eq!(
        stale.body(),
        r#"{"error":"stale fencing token","resource":"/reports/daily","token":10,"greatest":11}"#
    );
    assert_eq!(stale.headers()["content-type"], "application/json");
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "the stale request never reached the service"
    );
    assert_eq!(
        fences.greatest("/reports/daily"),
        Some(FencingToken::new(11))
    );

    let other = service
        .clone()
        .oneshot(put("/reports/weekly", Some("1")))
        .await
        .unwrap();
    assert_eq!(status(&other), StatusCode::OK, "resources are fenced apart");

    let missing = service
        .clone()
        .oneshot(put("/reports/daily", None))
        .await
        .unwrap();
    assert_eq!(status(&missing), StatusCode::PRECONDITION_REQUIRED);
    for bad in ["eleven", "-3", "", "99999999999999999999999"] {
        let response = service
            .clone()
            .oneshot(put("/reports/daily", Some(bad)))
            .await
            .unwrap();
        assert_eq!(status(&response), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    let long = format!("/reports/{}", "x".repeat(300));
    let response = service
        .clone()
        .oneshot(put(&long, Some("1")))
        .await
        .unwrap();
    assert_eq!(
        status(&response),
        StatusCode::BAD_REQUEST,
        "a resource past 255 bytes"
    );

    let unfenced = service.clone().oneshot(put("/health", None)).await.unwrap();
    assert_eq!(
        status(&unfenced),
        StatusCode::OK,
        "requests without a resource pass"
    );
    assert_eq!(served.load(Ordering::SeqCst), 4);
}

/// Token 10 is being served when token 11 arrives: 11 waits at the fence
/// until 10 is answered, so their writes land in token order. (The test
/// runs on one thread: yielding lets the 11 task run as far as it can.)
#[tokio::test(flavor = "current_thread")]
async fn requests_for_one_resource_are_served_one_at_a_time() {
    let fences = Fences::new();
    let gate = Arc::new(Semaphore::new(0));
    let (log_tx, mut log) = mpsc::unbounded_channel::<String>();
    let mut service = {
        let gate = Arc::clone(&gate);
        ServiceBuilder::new()
            .layer(layer(&fences))
            .service_fn(move |request: Request<String>| {
                let gate = Arc::clone(&gate);
                let log = log_tx.clone();
                async move {
                    let token = request.headers()["fencing-token"]
                        .to_str()
                        .unwrap()
                        .to_owned();
                    log.send(format!("enter {token}")).unwrap();
                    gate.acquire().await.unwrap().forget();
                    log.send(format!("leave {token}")).unwrap();
                    Ok::<_, Infallible>(Response::new(String::from("written")))
                }
            })
    };
    let ten = tokio::spawn(
        service
            .ready()
            .await
            .unwrap()
            .call(put("/reports/daily", Some("10"))),
    );
    assert_eq!(log.recv().await.as_deref(), Some("enter 10"));
    let eleven = tokio::spawn(
        service
            .ready()
            .await
            .unwrap()
            .call(put("/reports/daily", Some("11"))),
    );
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        log.try_recv().is_err(),
        "11 entered while 10 was being served"
    );
    gate.add_permits(2);
    assert_eq!(ten.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(eleven.await.unwrap().unwrap().status(), StatusCode::OK);
    let order: Vec<String> = std::iter::from_fn(|| log.try_recv().ok()).collect();
    assert_eq!(order, ["leave 10", "enter 11", "leave 11"]);
    assert_eq!(
        fences.greatest("/reports/daily"),
        Some(FencingToken::new(11))
    );
}
