#![allow(clippy::print_stdout)]
//! What a release costs a Redis Cluster's nodes, announced with `PUBLISH`
//! (broadcast over the cluster bus to every node) and with sharded pub/sub
//! (`SPUBLISH`, Redis 7: only the shard of the lock key's slot), on clusters
//! of 3 and 6 masters started by the testkit.
//!
//! Each run is a number of uncontended `acquire` + `release` cycles on one
//! name, a waiter of another client subscribed to its releases throughout.
//! Per node, the messages it handled are read from the server's own
//! counters before and after: the pub/sub messages it received over the
//! cluster bus (`CLUSTER INFO`: `cluster_stats_messages_publish_received`
//! and `…_publishshard_received`) and the `PUBLISH`/`SPUBLISH` calls it ran
//! itself (`INFO commandstats`, the release script's). Counts, not times:
//! the figures do not depend on the machine's speed.
//!
//! Run with `cargo bench -p lockkit-benches --bench cluster_pubsub`; the
//! summary is printed and written to
//! `target/lockkit-bench/cluster-pubsub-summary.md`.

use std::fmt::Write as _;
use std::time::Duration;

use lockkit_benches::{RunMode, runtime, save_summary};
use lockkit_core::{DistributedLock, LockOptions};
use lockkit_redis::{DEFAULT_PREFIX, RedisLock};
use lockkit_testkit::{RedisCluster, RedisServer, TestServer, command_stat, info_field};

const NAME: &str = "bench-cluster-pubsub";

/// One run's counts: releases, and the messages per release on the key's
/// master and on the other masters.
struct Row {
    masters: usize,
    sharded: bool,
    releases: u64,
    on_key_master: u64,
    on_others: Vec<u64>,
}

fn main() {
    let mode = RunMode::from_env();
    if mode == RunMode::List {
        return;
    }
    let (sizes, releases): (&[usize], u64) = match mode {
        RunMode::Test => (&[3], 5),
        _ => (&[3, 6], 500),
    };
    let rows = runtime().block_on(async {
        let mut rows = Vec::new();
        for &masters in sizes {
            let cluster = RedisCluster::start(masters).await;
            bus_connected(&cluster).await;
            for sharded in [false, true] {
                rows.push(measure(&cluster, masters, sharded, releases).await);
            }
        }
        rows
    });
    save_summary(mode, "cluster-pubsub", &summary(mode, &rows));
}

/// Waits until every node has a live bus link to every other (a cluster just
/// formed may still be connecting them, and a broadcast then misses a node).
async fn bus_connected(cluster: &RedisCluster) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for node in cluster.nodes() {
        loop {
            let nodes = node
                .command(&["CLUSTER", "NODES"])
                .await
                .expect("CLUSTER NODES");
            let lines: Vec<&str> = nodes.lines().filter(|l| !l.trim().is_empty()).collect();
            if lines.len() == cluster.nodes().len()
                && lines.iter().all(|l| l.contains(" connected"))
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster bus did not connect: {nodes}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn connect(cluster: &RedisCluster, sharded: bool) -> RedisLock {
    let url = format!("{}?sharded_pubsub={sharded}", cluster.url());
    lockkit_redis::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to the cluster: {e}"))
}

async fn measure(cluster: &RedisCluster, masters: usize, sharded: bool, releases: u64) -> Row {
    let holder = connect(cluster, sharded).await;
    assert_eq!(holder.backend().instance().publishes_sharded(), sharded);
    let name = format!("{NAME}-{masters}-{sharded}");
    // A waiter of another client subscribes when its wait begins: it waits
    // once for the lock held by the holder, gets it, and its subscription
    // lingers (10 s by default) through the counted releases, which are
    // delivered to it as they would be to a waiting client.
    let waiter = connect(cluster, sharded).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let first = holder.acquire(&name, &opts).await.expect("first acquire");
    let waiting = {
        let name = name.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            let guard = waiter.acquire(&name, &opts).await.expect("the waiter");
            guard.release().await.expect("the waiter's release");
            waiter
        })
    };
    // Let the waiter subscribe, then hand the lock over to it once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.expect("release");
    let waiter = waiting.await.expect("the waiter's task");
    let key = format!("{DEFAULT_PREFIX}{name}");
    let master = cluster.master_of(&key).await.expect("the key's master");
    // The bus carries messages late (cluster links are written as the
    // event loop gets to them): let the set-up's own settle first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counts(cluster.nodes()).await;
    for _ in 0..releases {
        let guard = holder.acquire(&name, &opts).await.expect("acquire");
        guard.release().await.expect("release");
    }
    // Broadcasts still on their way over the bus count once they arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = counts(cluster.nodes()).await;
    drop(waiter);
    let handled: Vec<(u16, u64)> = cluster
        .nodes()
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(node, (b, a))| (node.port(), a - b))
        .collect();
    Row {
        masters,
        sharded,
        releases,
        on_key_master: handled
            .iter()
            .find(|(port, _)| *port == master.port())
            .map_or(0, |(_, n)| *n),
        on_others: handled
            .iter()
            .filter(|(port, _)| *port != master.port())
            .map(|(_, n)| *n)
            .collect(),
    }
}

/// Per node: pub/sub messages received over the bus plus `PUBLISH` and
/// `SPUBLISH` calls run there.
async fn counts(nodes: &[RedisServer]) -> Vec<u64> {
    let mut out = Vec::new();
    for node in nodes {
        let bus = node
            .command(&["CLUSTER", "INFO"])
            .await
            .expect("CLUSTER INFO");
        let stats = node
            .command(&["INFO", "commandstats"])
            .await
            .expect("INFO commandstats");
        let received = |name: &str| -> u64 {
            info_field(&bus, name)
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        let calls = |command: &str| command_stat(&stats, command, "calls").unwrap_or(0);
        out.push(
            received("cluster_stats_messages_publish_received")
                + received("cluster_stats_messages_publishshard_received")
                + calls("publish")
                + calls("spublish"),
        );
    }
    out
}

fn per_release(messages: u64, releases: u64) -> String {
    format!("{:.2}", messages as f64 / releases.max(1) as f64)
}

fn summary(mode: RunMode, rows: &[Row]) -> String {
    let mut out = format!(
        "## Messages a release costs the nodes of a Redis Cluster ({} run)\n\n\
         Per release: the pub/sub messages each node handled (received over the cluster bus, or published there by the release script), from the servers' own counters; a waiter of another client subscribed throughout.\n\n\
         | masters | announced with | releases | on the key's master | on each other master | on the whole cluster |\n\
         | --- | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    for row in rows {
        let others: u64 = row.on_others.iter().sum();
        let each: Vec<String> = row
            .on_others
            .iter()
            .map(|n| per_release(*n, row.releases))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            row.masters,
            if row.sharded {
                "`SPUBLISH` (sharded)"
            } else {
                "`PUBLISH`"
            },
            row.releases,
            per_release(row.on_key_master, row.releases),
            each.join(", "),
            per_release(row.on_key_master + others, row.releases),
        );
    }
    out
}
