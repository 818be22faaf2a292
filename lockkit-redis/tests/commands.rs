//! What a lock operation costs the server, counted by the server itself
//! (`INFO commandstats`) against a real redis-server: the commands of an
//! exclusive cycle, of a renewal, the round trips renewals share, and a
//! waiter woken by a release rather than by polling.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockOptions};
use lockkit_testkit::{RedisServer, TestServer, command_stat, waiter};

mod common;

use common::{connect, opts};

/// The exclusive cycle's fixed cost on the server: every command a Lua
/// script runs costs about as much as a command of its own (the script's
/// glue, not the command), so the uncontended, fenced cycle is held to one
/// script per round trip and at most ten commands inside them (`SET NX`,
/// `EXISTS`, `TIME`, `SET … GET` to take it; `GET` of the key and of the
/// fence counter, `TIME`, `ZPOPMIN` of the waiting line, `DEL`, `PUBLISH`
/// to let it go: the release keeps a counter the server's clock has not
/// passed, after the clock went back, and reserves the lock for the head
/// of the line when there is one). It ran seventeen once, then ten, then
/// seven before the clock fix, nine before the line;
/// docs/design/redis-cycle.md says why each command costs, and `cargo run
/// --release -p lockkit-benches --example cycle_split` measures where the
/// cycle's time goes.
#[tokio::test]
async fn the_exclusive_cycle_runs_few_commands_on_the_server() {
    const CYCLES: u64 = 20;
    let server = RedisServer::start().await;
    let locks = connect(&server.url()).await;
    let opts = opts().auto_renew(false);
    let cycle = || async {
        let guard = locks.try_acquire("counted", &opts).await.unwrap().unwrap();
        assert!(guard.fencing_token().is_some());
        guard.release().await.unwrap();
    };
    cycle().await;
    server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    for _ in 0..CYCLES {
        cycle().await;
    }
    let info = server.command(&["INFO", "commandstats"]).await.unwrap();
    assert_eq!(
        evalsha_calls(&info),
        2 * CYCLES,
        "two round trips a cycle: {info}"
    );
    let inside = calls_inside_scripts(&info);
    assert!(
        inside <= 10 * CYCLES,
        "{} commands inside the scripts per cycle: {info}",
        inside as f64 / CYCLES as f64
    );
}

/// Without fencing tokens (`fencing=false`) the exclusive cycle spares
/// the token's `TIME` and counter write and the release's clean-up of the
/// counter: at most six commands (`EXISTS`, `SET NX`; `GET`, `ZPOPMIN`,
/// `DEL`, `PUBLISH`). A fenced client of the same name still draws tokens
/// above every earlier one, and the tokenless holdings leave the counter
/// as they found it.
#[tokio::test]
async fn a_cycle_without_tokens_spares_their_commands() {
    const CYCLES: u64 = 20;
    let server = RedisServer::start().await;
    let plain = connect(&format!("{}?fencing=false", server.url())).await;
    let fenced = connect(&server.url()).await;
    assert!(!plain.capabilities().fencing);
    assert!(fenced.capabilities().fencing);
    let opts = opts().auto_renew(false);
    let take = |locks| {
        let opts = opts.clone();
        async move {
            let guard = DistributedLock::try_acquire(locks, "tokenless", &opts)
                .await
                .unwrap()
                .expect("the lock is free");
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            token
        }
    };
    let first = take(&fenced).await.expect("a fenced client's token");
    assert_eq!(take(&plain).await, None);
    server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    for _ in 0..CYCLES {
        assert_eq!(take(&plain).await, None);
    }
    let info = server.command(&["INFO", "commandstats"]).await.unwrap();
    assert_eq!(evalsha_calls(&info), 2 * CYCLES, "{info}");
    let inside = calls_inside_scripts(&info);
    assert!(
        inside <= 6 * CYCLES,
        "{} commands inside the scripts per cycle: {info}",
        inside as f64 / CYCLES as f64
    );
    assert_eq!(command_stat(&info, "time", "calls"), None, "{info}");
    let next = take(&fenced).await.expect("a fenced client's token");
    assert!(next > first, "token {next} after {first}");
}

/// A refused attempt of a client that keeps no line (a barging lock) runs
/// two commands: the `SET NX` and the holder's `PTTL`. It has no
/// reservation or turn of its own to look for; barging waiters ask again
/// on the backoff, and under contention their refusals are much of the
/// server's work.
#[tokio::test]
async fn a_barging_refusal_runs_two_commands() {
    const TRIES: u64 = 20;
    let server = RedisServer::start().await;
    let holder = connect(&server.url()).await;
    let barging = connect(&format!("{}?barging=true", server.url())).await;
    let held = common::take(&holder, "barged", &opts()).await;
    server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    for _ in 0..TRIES {
        let refused = barging.try_acquire("barged", &opts()).await.unwrap();
        assert!(refused.is_none(), "the lock is held");
    }
    let info = server.command(&["INFO", "commandstats"]).await.unwrap();
    assert_eq!(evalsha_calls(&info), TRIES, "{info}");
    assert_eq!(calls_inside_scripts(&info), 2 * TRIES, "{info}");
    held.release().await.unwrap();
}

/// A renewal of an exclusive lease runs three commands on the server: the
/// read of the lock key and the new expiry of it and of its fence counter
/// (renewals are what the server spends most on when a client holds many
/// leases; see `lockkit-scale density`).
#[tokio::test]
async fn a_renewal_runs_three_commands_on_the_server() {
    const RENEWALS: u64 = 20;
    let server = RedisServer::start().await;
    let locks = connect(&server.url()).await;
    let ttl = Duration::from_secs(30);
    let short = Duration::from_secs(2);
    let guard = locks
        .try_acquire("renewed", &opts().ttl(short).auto_renew(false))
        .await
        .unwrap()
        .unwrap();
    server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    for _ in 0..RENEWALS {
        guard.extend(ttl).await.unwrap();
    }
    let info = server.command(&["INFO", "commandstats"]).await.unwrap();
    assert_eq!(evalsha_calls(&info), RENEWALS, "{info}");
    let inside = calls_inside_scripts(&info);
    assert_eq!(inside, 3 * RENEWALS, "commands inside the scripts: {info}");
    let left: i64 = server
        .command(&["PTTL", "{lockkit:renewed}:fence"])
        .await
        .map(|answer| answer.trim().parse().unwrap_or(-3))
        .unwrap();
    assert!(
        left > 20_000,
        "the fence counter lives as long as the lock: {left} ms"
    );
    guard.release().await.unwrap();
}

/// Renewals are batched: 200 held leases (half exclusive, half semaphore
/// permits) renewed every 200 ms for a second go to the server in far fewer
/// script calls than renewals, and every lease lives on (each renewal works
/// as it would alone), also after the server lost its scripts. The scale
/// of it is `lockkit-scale density`.
#[tokio::test]
async fn renewals_of_many_leases_share_round_trips() {
    const LEASES: usize = 200;
    let server = RedisServer::start().await;
    let locks = connect(&server.url()).await;
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..LEASES {
        let opts = LockOptions::new().ttl(ttl).auto_renew(true);
        let (name, opts) = if i % 2 == 0 {
            (format!("batched/{i}"), opts)
        } else {
            ("batched-permits".to_owned(), opts.semaphore(LEASES as u32))
        };
        guards.push(locks.try_acquire(&name, &opts).await.unwrap().unwrap());
    }
    // The server's command counts over `period`, once no lease was lost in
    // it; with `flush_scripts`, the server forgets its scripts once the
    // counts are reset (so that the reload falls within the period).
    let hold = |period: Duration, flush_scripts: bool| {
        let (server, guards) = (&server, &guards);
        async move {
            server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
            if flush_scripts {
                server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
            }
            tokio::time::sleep(period).await;
            let info = server.command(&["INFO", "commandstats"]).await.unwrap();
            let lost: Vec<_> = guards
                .iter()
                .filter(|g| g.is_lost())
                .map(|g| g.name())
                .collect();
            assert!(lost.is_empty(), "leases lost: {lost:?}");
            info
        }
    };
    let info = hold(Duration::from_secs(1), false).await;
    // Each lease renews every ttl / 3, and nothing else runs meanwhile: an
    // exclusive renewal checks its owner with one GET, a permit's with one
    // ZSCORE.
    let renewals: u64 = ["get", "zscore"]
        .map(|command| command_stat(&info, command, "calls").unwrap_or(0))
        .iter()
        .sum();
    let calls = evalsha_calls(&info);
    assert!(
        renewals >= 2 * LEASES as u64,
        "{renewals} renewals in a second: {info}"
    );
    assert!(
        calls * 4 <= renewals,
        "{calls} script calls for {renewals} renewals: {info}"
    );
    // A server that lost its scripts (a restart) gets them again.
    let info = hold(Duration::from_millis(700), true).await;
    assert!(
        command_stat(&info, "script|load", "calls").is_some_and(|calls| calls > 0),
        "{info}"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// The calls of each command in an `INFO commandstats` reply.
fn command_calls(info: &str) -> impl Iterator<Item = (&str, u64)> {
    info.split_whitespace().filter_map(|part| {
        let (name, rest) = part.strip_prefix("cmdstat_")?.split_once(":calls=")?;
        Some((name, rest.split(',').next()?.parse().ok()?))
    })
}

/// The commands the scripts ran: every command counted but `EVALSHA`
/// itself and the test's own `CONFIG RESETSTAT` and `INFO`.
fn calls_inside_scripts(info: &str) -> u64 {
    command_calls(info)
        .filter(|(name, _)| !matches!(*name, "evalsha" | "config|resetstat" | "info"))
        .map(|(_, calls)| calls)
        .sum()
}

fn evalsha_calls(info: &str) -> u64 {
    command_stat(info, "evalsha", "calls").unwrap_or(0)
}

/// A waiter is woken by the release's pub/sub message, not by polling: with a
/// 10 s backoff it still gets the lock at once, after only a handful of attempts.
#[tokio::test]
async fn waiter_is_woken_by_release_notification() {
    let server = RedisServer::start().await;
    let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
    let held = holder.acquire("notified", &opts()).await.unwrap();
    server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
    let task = waiter::spawn_patient_acquire(waiter, "notified");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (guard, handoff) = waiter::hand_over(held, task).await;
    assert!(
        handoff < Duration::from_millis(500),
        "handoff took {handoff:?}"
    );
    let calls = evalsha_calls(&server.command(&["INFO", "commandstats"]).await.unwrap());
    // first try, the try right after subscribing, the holder's release,
    // which grants the waiter its turn (+1 if a jittered delay happened to
    // be short, +1 if the release came before the waiter was in line)
    assert!(
        (3..=5).contains(&calls),
        "{calls} script calls: the waiter polled"
    );
    guard.release().await.unwrap();
}

/// A waiter whose client still has the name's subscriptions (they linger
/// after its last wait) takes its watch before its first attempt: a release
/// after that attempt reaches it, so a refused attempt needs no second one
/// right after subscribing. The release grants the waiter its turn, with a
/// fencing token above the holder's, and tells it: the waiter does not
/// ask again. The first wait of a client subscribes (a refused attempt,
/// and the one after subscribing); the next wait, its subscriptions
/// lingering, costs the server the refused attempt alone. (A waiter in
/// line asks again after a second when nothing wakes it: one more attempt
/// is allowed for every second the wait took, so that a slow machine does
/// not fail this.)
#[tokio::test]
async fn a_lingering_subscription_spares_the_attempt_after_subscribing() {
    let server = RedisServer::start().await;
    let holder = connect(&server.url()).await;
    let waiter = std::sync::Arc::new(connect(&server.url()).await);
    let line = "{lockkit:lingering}:line";
    let mut waits = Vec::new();
    for _ in 0..2 {
        let held = holder.acquire("lingering", &opts()).await.unwrap();
        server.command(&["CONFIG", "RESETSTAT"]).await.unwrap();
        let started = tokio::time::Instant::now();
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.acquire("lingering", &opts()).await })
        };
        let in_line = lockkit_testkit::eventually(Duration::from_secs(10), || async {
            server.command(&["ZCARD", line]).await.as_deref().ok() == Some("1")
        })
        .await;
        assert!(in_line, "the waiter never joined the line");
        let held_token = held.fencing_token().expect("a token");
        held.release().await.unwrap();
        let guard = task.await.unwrap().unwrap();
        assert!(guard.fencing_token().expect("a token") > held_token);
        // Counted from an attempt of this wait, not from later than now.
        let ttl = opts().lease_ttl();
        let valid_until = guard.valid_until().expect("a lease");
        assert!(valid_until >= started + ttl - lockkit_core::backend::clock_drift(ttl));
        assert!(valid_until <= tokio::time::Instant::now() + ttl);
        assert!(!guard.is_lost());
        let took = started.elapsed();
        let calls = evalsha_calls(&server.command(&["INFO", "commandstats"]).await.unwrap());
        guard.release().await.unwrap();
        // Less the holder's release.
        waits.push((calls - 1, took.as_secs()));
    }
    let second = waits[1];
    assert!(
        second.0 <= 1 + second.1,
        "the wait with the subscriptions lingering: {second:?} (attempts, whole seconds)"
    );
}
