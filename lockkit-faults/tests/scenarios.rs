//! The suite detects what it is built to detect: a holder paused past its
//! lease writes after the next holder took over. With a fencing backend the
//! resource rejects that write; without fencing (Redlock) it accepts it, and
//! the checker says so. Real servers, real worker processes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lockkit_faults::deploy::Deployment;
use lockkit_faults::record::Store;
use lockkit_faults::run::{RunResult, Settings, run};
use lockkit_faults::scenario::Scenario;
use lockkit_faults::stores::FenceStores;

fn settings(log_dir: PathBuf) -> Settings {
    let lease = Duration::from_secs(1);
    Settings {
        lease,
        clients: 3,
        tail_leases: 2,
        cut_tail: false,
        run_timeout: Duration::from_secs(60),
        worker_exe: PathBuf::from(env!("CARGO_BIN_EXE_lockkit-faults")),
        log_dir,
        careful: false,
        stores: None,
    }
}

async fn paused_holder(backend: Deployment) -> RunResult {
    paused_holder_with(backend, None).await
}

async fn paused_holder_with(backend: Deployment, stores: Option<Arc<FenceStores>>) -> RunResult {
    let logs = tempfile::tempdir().unwrap();
    let settings = Settings {
        stores,
        ..settings(logs.path().into())
    };
    let result = run(backend, Scenario::HolderPaused, None, &settings).await;
    assert_eq!(result.error, None, "{result:?}");
    assert_eq!(result.trace.faults.len(), 1);
    assert!(result.outcome.recovered(), "{:?}", result.outcome);
    assert!(result.outcome.completed >= 2, "{:?}", result.outcome);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_rejects_the_paused_holders_late_write() {
    let result = paused_holder(Deployment::Redis).await;
    assert!(result.fencing);
    let outcome = &result.outcome;
    assert!(outcome.overlaps >= 1, "{outcome:?}");
    assert!(outcome.stale_rejected >= 1, "{outcome:?}");
    assert_eq!(outcome.stale_accepted, 0, "{outcome:?}");
    // The late holder saw its lease lost.
    assert!(outcome.lost >= 1, "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_the_late_write_lands() {
    let result = paused_holder(Deployment::Redlock3).await;
    assert!(!result.fencing);
    let outcome = &result.outcome;
    assert!(outcome.overlaps >= 1, "{outcome:?}");
    assert!(outcome.stale_accepted >= 1, "{outcome:?}");
    assert_eq!(outcome.stale_rejected, 0, "{outcome:?}");
}

/// The same late write, also made to PostgreSQL and Redis through
/// `lockkit::fence`: both stores refuse it, and admit the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_stores_refuse_the_paused_holders_late_write() {
    let stores = Arc::new(FenceStores::start().await.expect("the fence stores"));
    let result = paused_holder_with(Deployment::PgLease, Some(Arc::clone(&stores))).await;
    stores.stop();
    assert!(result.fencing);
    let outcome = &result.outcome;
    assert!(outcome.stale_rejected >= 1, "{outcome:?}");
    let seen: Vec<Store> = outcome.stores.iter().map(|s| s.store).collect();
    assert_eq!(seen, Store::ALL, "{outcome:?}");
    for store in &outcome.stores {
        assert_eq!(store.stale_admitted, 0, "{store:?}");
        assert!(store.stale_refused >= 1, "{store:?}");
        assert!(store.admitted >= 2, "{store:?}");
        assert_eq!(store.errors, 0, "{store:?}");
    }
}

/// The same pause on Redlock with a lock delay of twice the pause: the name
/// stays taken until the late holder's writes have landed, so none is
/// stale, without fencing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_keeps_the_late_write_out_without_fencing() {
    let logs = tempfile::tempdir().unwrap();
    let settings = Settings {
        tail_leases: 8,
        ..settings(logs.path().into())
    };
    let scenario = Scenario::HolderPaused;
    let delay = scenario
        .compared_lock_delay(Deployment::Redlock3, settings.lease)
        .expect("Redlock's holder-paused run is compared");
    let result = run(Deployment::Redlock3, scenario, Some(delay), &settings).await;
    assert_eq!(result.error, None, "{result:?}");
    let outcome = &result.outcome;
    assert!(
        outcome.lost >= 1,
        "the paused holder wrote late: {outcome:?}"
    );
    assert_eq!(outcome.stale_accepted, 0, "{outcome:?}");
    assert_eq!(outcome.overlaps, 0, "{outcome:?}");
    assert!(outcome.recovered(), "{outcome:?}");
}
