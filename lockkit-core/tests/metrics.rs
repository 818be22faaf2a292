//! The metrics of `lockkit_core::metrics` are emitted (feature `metrics`):
//! one test that installs a recorder and goes through each of them on the
//! in-memory backend.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockkit_core::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_WAIT, ACQUIRES, AT_RISK, AT_RISK_TIME, HANDOFF, LEADER_CHANGES,
    LEASES_LOST, RENEWALS,
};
use lockkit_core::{
    DistributedLock, Election, LockError, LockOptions, LostReason, MemoryLock, MemoryStore,
};
use metrics::Key;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every series seen so far, summed over snapshots (a snapshot of the
/// debugging recorder drains what it reads): a counter's count, a
/// histogram's number of samples.
struct Seen {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<Key, u64>>,
}

impl Seen {
    /// The total of the series `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            *totals.entry(key.key().clone()).or_default() += n;
        }
        totals
            .iter()
            .filter(|(key, _)| {
                key.name() == name
                    && labels
                        .iter()
                        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(_, n)| n)
            .sum()
    }
}

#[test]
fn every_metric_is_emitted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let seen = Seen {
        snapshotter,
        totals: Mutex::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(scenarios(&seen));
}

async fn scenarios(s: &Seen) {
    let store = MemoryStore::new();
    let locks = Arc::new(MemoryLock::with_store(store.clone()));
    let memory = [("backend", "memory")];
    let opts = LockOptions::new().ttl(Duration::from_secs(5));

    // An acquire, then a busy try and a timed-out wait by another client
    // (tasks of one client queue locally, without asking the server).
    let other = MemoryLock::with_store(store.clone());
    let guard = locks.acquire("m-acquire", &opts).await.unwrap();
    let busy = other.try_acquire("m-acquire", &opts).await.unwrap();
    assert!(busy.is_none());
    let timed_out = other
        .acquire(
            "m-acquire",
            &opts.clone().wait_for(Duration::from_millis(50)),
        )
        .await;
    assert!(matches!(timed_out, Err(LockError::Timeout { .. })));
    guard.release().await.unwrap();
    let acquired = [
        ("backend", "memory"),
        ("op", "acquire"),
        ("outcome", "acquired"),
    ];
    assert_eq!(s.value(ACQUIRES, &acquired), 1);
    assert_eq!(s.value(ACQUIRE_WAIT, &acquired), 1);
    let busy = [("op", "try_acquire"), ("outcome", "busy")];
    assert_eq!(s.value(ACQUIRES, &busy), 1);
    assert_eq!(
        s.value(ACQUIRES, &[("op", "acquire"), ("outcome", "timeout")]),
        1
    );
    assert!(s.value(ACQUIRE_ATTEMPTS, &memory) >= 3);

    // Renewals by the watchdog.
    let short = LockOptions::new().ttl(Duration::from_millis(300));
    let renewed = locks.acquire("m-renew", &short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(!renewed.is_lost());
    assert!(s.value(RENEWALS, &[("backend", "memory"), ("outcome", "renewed")]) >= 1);
    // A lease revoked behind the holder's back: the next renewal is refused
    // and the holding lost.
    assert!(store.revoke("m-renew"));
    let reason = tokio::time::timeout(Duration::from_secs(20), renewed.lost())
        .await
        .expect("lost after the revocation");
    assert_eq!(reason, LostReason::Revoked);
    assert_eq!(s.value(RENEWALS, &[("outcome", "refused")]), 1);
    assert_eq!(
        s.value(LEASES_LOST, &[("backend", "memory"), ("reason", "revoked")]),
        1
    );
    // A renewal that fails while the store is out.
    let outage = locks.acquire("m-outage", &short).await.unwrap();
    store.outage(true);
    outage.at_risk().await;
    store.outage(false);
    assert!(s.value(RENEWALS, &[("outcome", "failed")]) >= 1);
    assert_eq!(s.value(AT_RISK, &memory), 1);
    // The spell is timed when it ends: confirmed again, or lost.
    let lost = outage.lost();
    tokio::select! {
        _ = lost => {}
        () = async { while outage.is_at_risk() { tokio::time::sleep(Duration::from_millis(5)).await } } => {}
    }
    assert_eq!(s.value(AT_RISK_TIME, &memory), 1);
    drop(outage);

    // A hand-over between two tasks of one client.
    let holder = locks.acquire("m-handoff", &opts).await.unwrap();
    let next = tokio::spawn({
        let (locks, opts) = (locks.clone(), opts.clone());
        async move { locks.acquire("m-handoff", &opts).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s.value(HANDOFF, &memory), 0);
    holder.release().await.unwrap();
    next.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(s.value(HANDOFF, &memory), 1);

    // An election: elected, observed by another candidate, resigned.
    let dyn_locks: Arc<dyn DistributedLock> = locks.clone();
    let a = Election::new(dyn_locks.clone(), "m-election", "a");
    let b = Election::new(dyn_locks, "m-election", "b");
    let mut seen = b.observe(Duration::from_millis(20));
    let leading = a.campaign(&opts).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(2),
        seen.wait_for(|l| l.as_deref() == Some("a")),
    )
    .await
    .expect("b sees a lead")
    .unwrap();
    leading.resign().await.unwrap();
    assert_eq!(s.value(LEADER_CHANGES, &[("change", "elected")]), 1);
    assert_eq!(s.value(LEADER_CHANGES, &[("change", "resigned")]), 1);
    assert_eq!(s.value(LEADER_CHANGES, &[("change", "observed")]), 1);
}
