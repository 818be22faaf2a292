//! A handoff between Redlock clients, against real redis-server processes:
//! the release grants the first client in line its lease on every instance
//! and tells it, and that client holds without asking again.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_redlock::RedlockLock;
use lockkit_testkit::{RedisServer, TestServer, command_stat, eventually};

const INSTANCES: usize = 3;

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(30))
}

async fn connect(servers: &[RedisServer]) -> RedlockLock {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    // A loaded machine running a debug build can miss the default
    // instance timeout (see `faults.rs`).
    let url = format!("redlock://{}?instance_timeout=250ms", hosts.join(","));
    lockkit_redlock::connect(&url).await.expect("connect")
}

/// The script calls each instance has run since its last `RESETSTAT`.
async fn script_calls(servers: &[RedisServer]) -> Vec<u64> {
    let mut calls = Vec::with_capacity(servers.len());
    for server in servers {
        let info = server.command(&["INFO", "commandstats"]).await.unwrap();
        calls.push(command_stat(&info, "evalsha", "calls").unwrap_or(0));
    }
    calls
}

/// A client in line on every instance (a client whose subscriptions
/// linger from an earlier wait asks once, then waits) gets the lock from
/// the holder's release alone: each instance's release makes the lease
/// the waiter's and marks the waiter's turn record as granted
/// (`g<owner>`), and the waiter, told by a quorum, holds without asking
/// again: the instances run one script each between the waiter's place in
/// line and its grant, the release. Its lease counts from the attempt that
/// put it in line.
#[tokio::test]
async fn a_release_grants_the_head_its_turn_on_every_instance() {
    let mut servers = Vec::with_capacity(INSTANCES);
    for _ in 0..INSTANCES {
        servers.push(RedisServer::start().await);
    }
    let holder = connect(&servers).await;
    let waiter = Arc::new(connect(&servers).await);
    let (key, line, turns) = (
        "lockkit:turned",
        "{lockkit:turned}:line",
        "{lockkit:turned}:turns",
    );
    for round in 0..2 {
        let held = holder.acquire("turned", &opts()).await.unwrap();
        let started = tokio::time::Instant::now();
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.acquire("turned", &opts()).await })
        };
        for server in &servers {
            let in_line = eventually(Duration::from_secs(10), || async {
                server.command(&["ZCARD", line]).await.as_deref().ok() == Some("1")
            })
            .await;
            assert!(in_line, "round {round}: the waiter never joined a line");
        }
        // The first wait subscribes, and asks once more after that.
        if round == 0 {
            let guard = {
                held.release().await.unwrap();
                task.await.unwrap().unwrap()
            };
            guard.release().await.unwrap();
            // The two releases kept places (each client waited before):
            // given up by their clients when their turns came, the name
            // is left with nothing, and the second round starts as the
            // first, but with the waiter's subscriptions live.
            for server in &servers {
                let left = eventually(Duration::from_secs(10), || async {
                    server.command(&["EXISTS", key, line]).await.as_deref().ok() == Some("0")
                })
                .await;
                assert!(left, "the kept places were never given up");
            }
            continue;
        }
        // Its subscriptions lingering, the second wait asked once: the
        // line shows it, and the server's counts start after that.
        for server in &servers {
            server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
        }
        held.release().await.unwrap();
        let guard = task.await.unwrap().unwrap();
        let calls = script_calls(&servers).await;
        for (server, calls) in servers.iter().zip(&calls) {
            let owner = server.command(&["GET", key]).await.unwrap();
            let records = server.command(&["HVALS", turns]).await.unwrap();
            assert!(
                records
                    .split(' ')
                    .any(|record| record == format!("g{owner}")),
                "the lease on {} came from the waiter's turn: {owner} against {records}",
                server.port()
            );
            assert_eq!(*calls, 1, "the release alone ran a script: {calls:?}");
        }
        let ttl = opts().lease_ttl();
        let valid_until = guard.valid_until().expect("a lease");
        assert!(valid_until >= started + ttl - lockkit_core::backend::clock_drift(ttl));
        assert!(valid_until <= tokio::time::Instant::now() + ttl);
        guard.release().await.unwrap();
    }
}
