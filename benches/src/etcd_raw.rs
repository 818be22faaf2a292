//! The hand-written etcd lock cycle: the requests of etcd's own lock recipe
//! (a session's lease, the `concurrency` package's `Mutex`) with nothing
//! around them, on an `etcd-client` connection of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp,
};
use tokio::time::Instant;

/// A raw etcd client.
#[derive(Clone)]
pub struct RawEtcd {
    /// Boxed: the client is some 3.7 KB by value.
    client: Box<Client>,
    /// The lease the last cycle released, for the next one.
    kept: Arc<Mutex<Option<(i64, Instant)>>>,
}

impl std::fmt::Debug for RawEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawEtcd")
    }
}

/// The lease of a raw cycle, in seconds (as lockkit's 30 s benchmarks ask).
const RAW_LEASE_SECONDS: i64 = 30;

impl RawEtcd {
    /// Connects to `endpoints` (`host:port`, comma-separated), with the
    /// connection settings lockkit-etcd's client uses (its defaults: a 2 s
    /// connect timeout, an HTTP/2 keep-alive ping every 5 s), so that the
    /// floor differs from lockkit by the lock engine alone.
    pub async fn connect(endpoints: &str) -> RawEtcd {
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(|e| format!("http://{e}"))
            .collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(lockkit_etcd::DEFAULT_CONNECT_TIMEOUT)
            .with_keep_alive(
                lockkit_etcd::KEEP_ALIVE_INTERVAL,
                lockkit_etcd::DEFAULT_COMMAND_TIMEOUT,
            );
        let client = Client::connect(endpoints, Some(options))
            .await
            .expect("an etcd-client connection");
        RawEtcd {
            client: Box::new(client),
            kept: Arc::default(),
        }
    }

    /// One uncontended cycle on the directory `dir` (`…/`), the requests
    /// lockkit's cycle sends, in its order: a keep-alive of the lease the
    /// previous cycle released (the first cycle grants one), as lockkit
    /// renews a lease its client kept; one transaction that creates
    /// `<dir><lease hex>` if it is missing and reads the directory's oldest
    /// key (ours: the lock is free); one transaction that deletes the key if
    /// its create revision is still ours. The lease is then kept for the
    /// next cycle. Panics if the key was not the oldest or not deleted.
    pub async fn cycle(&self, dir: &str) {
        let mut lease_client = self.client.lease_client();
        // Kept for at most half its TTL, as lockkit keeps it; one that
        // expired meanwhile (between benchmark groups) is replaced.
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .filter(|(_, at)| at.elapsed() < Duration::from_secs(RAW_LEASE_SECONDS as u64 / 2));
        let renewed = match kept {
            Some((lease, _)) => {
                let (mut keeper, mut stream) = lease_client
                    .keep_alive(lease)
                    .await
                    .expect("lease keep-alive");
                keeper.keep_alive().await.expect("keep-alive request");
                let answer = stream.message().await.expect("keep-alive answer");
                answer.filter(|a| a.ttl() > 0).map(|_| lease)
            }
            None => None,
        };
        let lease = match renewed {
            Some(lease) => lease,
            None => lease_client
                .grant(RAW_LEASE_SECONDS, None)
                .await
                .expect("lease grant")
                .id(),
        };
        let mut kv = self.client.kv_client();
        let key = format!("{dir}{lease:x}");
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only()
            .with_limit(1);
        let create = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(dir, Some(oldest)),
            ]);
        let created = kv.txn(create).await.expect("create txn");
        assert!(created.succeeded(), "raw etcd: {key} existed");
        let revision = created.header().expect("a header").revision();
        let delete = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let deleted = kv.txn(delete).await.expect("delete txn");
        assert!(
            deleted.succeeded(),
            "raw etcd: {key} was not ours to delete"
        );
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some((lease, Instant::now()));
    }

    /// One write: a put of `key`, timed (the yardstick of etcd's handoffs).
    pub async fn put(&self, key: &str) -> Duration {
        let started = Instant::now();
        self.client.clone().put(key, "x", None).await.expect("put");
        started.elapsed()
    }

    /// How many keys are under `prefix`.
    pub async fn count(&self, prefix: &str) -> i64 {
        self.client
            .clone()
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("count")
            .count()
    }
}
