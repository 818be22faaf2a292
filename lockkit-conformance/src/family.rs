//! The cases of the lock family: reader-writer locks (`LockOptions::shared`)
//! and semaphores (`LockOptions::semaphore`). On a backend whose
//! capabilities do not claim a kind, each case checks that the kind is
//! refused with `Unsupported` instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockGuard, LockKind, LockOptions};
use tokio::time::Instant;

use super::Harness;
use crate::cases::{abort_at_random_points, unique};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn shared(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).shared()
}

fn writer(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl)
}

fn permit(ttl: Duration, permits: u32) -> LockOptions {
    LockOptions::new().ttl(ttl).semaphore(permits)
}

/// Whether the client claims `kind`; if it does not, checks that asking for
/// it is refused with `Unsupported` (so that the case asserts something on
/// every backend) and returns false.
async fn claims(lock: &dyn DistributedLock, kind: LockKind) -> bool {
    let caps = lock.capabilities();
    let (claimed, opts) = match kind {
        LockKind::Shared => (caps.shared, shared(ms(5000))),
        _ => (caps.semaphore, permit(ms(5000), 2)),
    };
    if claimed {
        return true;
    }
    let name = unique("unclaimed");
    match lock.try_acquire(&name, &opts).await {
        Err(LockError::Unsupported { .. }) => false,
        other => panic!("{kind:?} is not claimed, yet asking for it gave {other:?}"),
    }
}

async fn take(lock: &dyn DistributedLock, name: &str, opts: &LockOptions) -> LockGuard {
    lock.acquire(name, &opts.clone().wait_for(Duration::from_secs(10)))
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?} with {opts:?}: {e}"))
}

async fn try_take(lock: &dyn DistributedLock, name: &str, opts: &LockOptions) -> Option<LockGuard> {
    lock.try_acquire(name, opts)
        .await
        .unwrap_or_else(|e| panic!("try_acquire {name:?} with {opts:?}: {e}"))
}

/// Two readers on two clients hold the same name at once; `status` says
/// it is held by two.
pub async fn two_readers_hold_together(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Shared).await {
        return;
    }
    let name = unique("readers");
    let o = shared(Duration::from_secs(10));
    let first = take(a.as_ref(), &name, &o).await;
    let second = try_take(b.as_ref(), &name, &o)
        .await
        .expect("a second reader is let in while the first holds");
    let third = try_take(a.as_ref(), &name, &o)
        .await
        .expect("a reader of the same client is let in too");
    let status = a.status_of(&name, LockKind::Shared).await.expect("status");
    assert!(status.held, "{status:?}");
    // `None` where the server cannot count share locks (MySQL row locks).
    assert!(
        status.holders.is_none_or(|n| n == 3),
        "three readers hold: {status:?}"
    );
    for guard in [first, second, third] {
        guard.release().await.expect("release a reader");
    }
    let status = a.status(&name).await.expect("status");
    assert!(!status.held, "every reader left: {status:?}");
}

/// Readers that all ask for a name's first grant at once, from two clients,
/// all get in, round after round on fresh names: readers never exclude each
/// other, so a reader turned away with an error (on MariaDB it was a
/// deadlock victim, when the readers locked the gap of the name's missing
/// row and each waited for the others to insert into it) is a bug.
pub async fn readers_arriving_together_all_get_in(h: &dyn Harness) {
    let clients = [h.client().await, h.client().await];
    if !claims(clients[0].as_ref(), LockKind::Shared).await {
        return;
    }
    let o = shared(Duration::from_secs(10)).wait_for(Duration::from_secs(20));
    for round in 0..40 {
        let name = unique("readers-together");
        let mut readers = Vec::new();
        for reader in 0..8 {
            let (client, name, o) = (clients[reader % 2].clone(), name.clone(), o.clone());
            readers.push(tokio::spawn(async move {
                let guard = client
                    .acquire(&name, &o)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}, reader {reader}: {e}"));
                guard.release().await.expect("a reader's release");
            }));
        }
        for reader in readers {
            reader.await.expect("every reader got in");
        }
    }
}

/// A writer excludes readers and readers exclude the writer, across clients;
/// each side gets in once the other has left.
pub async fn writer_and_readers_exclude_each_other(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Shared).await {
        return;
    }
    let name = unique("rw");
    // Longer than the writer's wait: it gets in because the reader left,
    // not because the reader's lease ran out.
    let ttl = Duration::from_secs(30);
    let reader = take(a.as_ref(), &name, &shared(ttl)).await;
    assert!(
        try_take(b.as_ref(), &name, &writer(ttl)).await.is_none(),
        "a writer got in while a reader held"
    );
    let waiting = {
        let b = b.clone();
        let name = name.clone();
        tokio::spawn(async move {
            b.acquire(&name, &writer(ttl).wait_for(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(
        !waiting.is_finished(),
        "the writer did not wait for the reader"
    );
    reader.release().await.expect("release the reader");
    let writer_guard = waiting.await.unwrap().expect("the writer gets in");
    assert!(
        try_take(a.as_ref(), &name, &shared(ttl)).await.is_none(),
        "a reader got in while the writer held"
    );
    assert!(
        try_take(a.as_ref(), &name, &writer(ttl)).await.is_none(),
        "a second writer got in"
    );
    writer_guard.release().await.expect("release the writer");
    let reader = take(a.as_ref(), &name, &shared(ttl)).await;
    reader.release().await.expect("release");
}

/// Readers that take turns back to back, always overlapping, do not keep a
/// waiting writer out: once it waits, new readers wait behind it.
pub async fn no_writer_starvation(h: &dyn Harness) {
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Shared).await {
        return;
    }
    let name = unique("starve");
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for (i, client) in [a.clone(), b.clone()].into_iter().enumerate() {
        let (stop, turns, name) = (stop.clone(), turns.clone(), name.clone());
        readers.push(tokio::spawn(async move {
            // Offset so that one reader always holds while the other comes back.
            tokio::time::sleep(ms(60 * i as u64)).await;
            let o = shared(Duration::from_secs(10)).wait_for(Duration::from_secs(20));
            while !stop.load(Ordering::SeqCst) {
                let guard = client.acquire(&name, &o).await.expect("a reader's acquire");
                turns.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(120)).await;
                guard.release().await.expect("a reader's release");
            }
        }));
    }
    // Let the readers get going, then ask as a writer.
    tokio::time::sleep(ms(400)).await;
    assert!(turns.load(Ordering::SeqCst) > 0, "the readers never got in");
    let started = Instant::now();
    let granted = c
        .acquire(
            &name,
            &writer(Duration::from_secs(10)).wait_for(Duration::from_secs(5)),
        )
        .await;
    let waited = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let guard = granted.unwrap_or_else(|e| {
        panic!("the writer was starved by back-to-back readers for {waited:?}: {e}")
    });
    guard.release().await.expect("release the writer");
    for reader in readers {
        reader.await.expect("a reader task");
    }
}

/// Four readers and a writer, all tasks of one client: the readers take
/// turns (hold 40 ms, release, ask again) while the writer waits for its
/// turn, takes it and lets go; then every reader gets in again. A reader
/// left waiting out its whole wait (8 s) behind a writer long gone is a
/// lost wake-up (it was on `memory://`: the waiting writer's record
/// outlived its grant).
pub async fn readers_and_a_writer_of_one_client_all_get_through(h: &dyn Harness) {
    let client = h.client().await;
    if !claims(client.as_ref(), LockKind::Shared).await {
        return;
    }
    let name = unique("one-client-readers");
    let mut readers = Vec::new();
    for reader in 0..4 {
        let (client, name) = (client.clone(), name.clone());
        readers.push(tokio::spawn(async move {
            let o = shared(Duration::from_secs(10)).wait_for(Duration::from_secs(8));
            for turn in 0..12 {
                let guard = client
                    .acquire(&name, &o)
                    .await
                    .unwrap_or_else(|e| panic!("reader {reader}, turn {turn}: {e}"));
                tokio::time::sleep(ms(40)).await;
                guard.release().await.expect("a reader's release");
            }
        }));
    }
    tokio::time::sleep(ms(100)).await;
    let guard = client
        .acquire(
            &name,
            &writer(Duration::from_secs(10)).wait_for(Duration::from_secs(8)),
        )
        .await
        .expect("the writer gets its turn among the readers");
    guard.release().await.expect("release the writer");
    for reader in readers {
        reader.await.expect("every reader got in every turn");
    }
}

/// A semaphore of N permits lets exactly N holdings in, across clients; the
/// lock of the same name is unrelated to it; a returned permit can be taken.
pub async fn semaphore_admits_exactly_its_permits(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Semaphore { permits: 1 }).await {
        return;
    }
    let name = unique("permits");
    let o = permit(Duration::from_secs(10), 3);
    let mut held = Vec::new();
    for client in [&a, &b, &a] {
        held.push(
            try_take(client.as_ref(), &name, &o)
                .await
                .expect("a free permit"),
        );
    }
    assert!(
        try_take(b.as_ref(), &name, &o).await.is_none(),
        "a fourth holding of a 3-permit semaphore"
    );
    let status = a.status_of(&name, o.kind()).await.expect("status");
    assert!(status.held, "{status:?}");
    assert_eq!(status.holders, Some(3), "{status:?}");
    // The lock `name` is another thing.
    let lock = try_take(b.as_ref(), &name, &writer(Duration::from_secs(10)))
        .await
        .expect("the lock of the semaphore's name is free");
    lock.release().await.expect("release the lock");
    held.pop()
        .unwrap()
        .release()
        .await
        .expect("return a permit");
    let again = take(b.as_ref(), &name, &o).await;
    assert!(try_take(a.as_ref(), &name, &o).await.is_none());
    again.release().await.expect("release");
    for guard in held {
        guard.release().await.expect("release");
    }
    let status = a.status_of(&name, o.kind()).await.expect("status");
    assert!(!status.held, "every permit returned: {status:?}");
}

/// 32 tasks on 4 clients contend for a semaphore of 3 permits: never more
/// than 3 inside, and every task gets its turns.
pub async fn semaphore_bounds_holders_under_contention(h: &dyn Harness) {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(h.client().await);
    }
    if !claims(clients[0].as_ref(), LockKind::Semaphore { permits: 1 }).await {
        return;
    }
    const PERMITS: u32 = 3;
    const ROUNDS: u64 = 3;
    let name = unique("sem-contention");
    let o = permit(Duration::from_secs(10), PERMITS).wait_for(Duration::from_secs(60));
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..8 {
            let (client, name, o) = (client.clone(), name.clone(), o.clone());
            let (inside, most, done) = (inside.clone(), most.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.acquire(&name, &o).await.expect("a permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(ms(fastrand::u64(1..10))).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("return a permit");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a contender");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS,
        "{most} holders of {PERMITS} permits at once"
    );
    assert_eq!(done.load(Ordering::SeqCst), 32 * ROUNDS);
}

/// A permit holder that crashes (stops renewing, never returns its permit)
/// loses the permit when its lease runs out, and another holder gets it.
pub async fn crashed_permit_comes_back(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Semaphore { permits: 1 }).await {
        return;
    }
    let name = unique("sem-crash");
    let ttl = ms(600);
    let crashed = take(a.as_ref(), &name, &permit(ttl, 1).auto_renew(false)).await;
    std::mem::forget(crashed);
    let o = permit(Duration::from_secs(10), 1);
    assert!(try_take(b.as_ref(), &name, &o).await.is_none());
    let guard = b
        .acquire(&name, &o.clone().wait_for(Duration::from_secs(30)))
        .await
        .expect("the crashed holder's permit comes back");
    guard.release().await.expect("release");
}

/// Where the backend fences, readers and writers of a name draw from one
/// sequence: a writer's token exceeds every token handed out before it.
pub async fn fencing_tokens_across_kinds(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Shared).await || !a.capabilities().fencing {
        return;
    }
    let name = unique("fence-kinds");
    let ttl = Duration::from_secs(10);
    let mut last = None;
    for _ in 0..3 {
        let r1 = take(a.as_ref(), &name, &shared(ttl)).await;
        let r2 = take(b.as_ref(), &name, &shared(ttl)).await;
        let tokens = [r1.fencing_token(), r2.fencing_token()];
        assert!(tokens.iter().all(Option::is_some), "readers get tokens");
        assert_ne!(tokens[0], tokens[1], "two readers share a token");
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let w = take(b.as_ref(), &name, &writer(ttl)).await;
        let token = w.fencing_token().expect("a writer's token");
        assert!(
            tokens.iter().all(|t| t.unwrap() < token),
            "writer {token:?} after readers {tokens:?}"
        );
        assert!(last.is_none_or(|l| l < token));
        last = Some(token);
        w.release().await.unwrap();
    }
}

/// Shared and permit acquires cancelled at random points (queued, in
/// flight, just granted) leak nothing: afterwards a writer gets the lock and
/// every permit can be taken well before a leaked lease (60 s) would have
/// run out.
pub async fn cancelled_family_acquires_leak_nothing(h: &dyn Harness) {
    let clients = [h.client().await, h.client().await];
    let sem = clients[0].capabilities().semaphore;
    let read = claims(clients[0].as_ref(), LockKind::Shared).await;
    if !sem && !read {
        claims(clients[0].as_ref(), LockKind::Semaphore { permits: 1 }).await;
        return;
    }
    let name = unique("cancel-family");
    let ttl = Duration::from_secs(60);
    let mut kinds = Vec::new();
    if read {
        kinds.push(shared(ttl));
        kinds.push(writer(ttl));
    }
    if sem {
        kinds.push(permit(ttl, 2));
    }
    for batch in 0..10 {
        let mut tasks = Vec::new();
        for i in 0..10 {
            let client = clients[(batch + i) % 2].clone();
            let o = kinds[(batch + i) % kinds.len()]
                .clone()
                .wait_for(Duration::from_secs(30));
            let name = name.clone();
            tasks.push(tokio::spawn(async move { client.acquire(&name, &o).await }));
        }
        abort_at_random_points(&tasks).await;
        for task in tasks {
            if let Ok(result) = task.await {
                result.expect("acquire");
            }
        }
    }
    let probe = h.client().await;
    // Half the lease: the undos of the cancelled acquires may still be
    // running (a SQL undo ends the given-up session first).
    let within = ttl / 2;
    if read {
        let guard = probe
            .acquire(&name, &writer(ttl).wait_for(within))
            .await
            .unwrap_or_else(|e| panic!("the lock is still held after cancellations: {e}"));
        guard.release().await.unwrap();
    }
    if sem {
        let o = permit(ttl, 2).wait_for(within);
        let first = probe.acquire(&name, &o).await.expect("permit 1 leaked");
        let second = probe.acquire(&name, &o).await.expect("permit 2 leaked");
        first.release().await.unwrap();
        second.release().await.unwrap();
    }
}

/// Dropping a reader's or a permit holder's guard without `release` gives
/// the holding back within a second.
pub async fn dropped_family_guards_release(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let ttl = Duration::from_secs(60);
    let within = Duration::from_secs(1);
    if claims(a.as_ref(), LockKind::Shared).await {
        let name = unique("drop-reader");
        drop(take(a.as_ref(), &name, &shared(ttl)).await);
        let guard = b
            .acquire(&name, &writer(ttl).wait_for(within))
            .await
            .expect("a dropped reader lets the writer in within 1 s");
        guard.release().await.unwrap();
    }
    if claims(a.as_ref(), LockKind::Semaphore { permits: 1 }).await {
        let name = unique("drop-permit");
        drop(take(a.as_ref(), &name, &permit(ttl, 1)).await);
        let guard = b
            .acquire(&name, &permit(ttl, 1).wait_for(within))
            .await
            .expect("a dropped permit comes back within 1 s");
        guard.release().await.unwrap();
    }
}

/// Users of one semaphore that pass different `permits` (documented, not
/// recommended): each acquirer is admitted while fewer holdings than its
/// own `permits` are held, so no permit is lost or made up and the bound is
/// the largest `permits` in use.
pub async fn mixed_permits_follow_the_documented_rule(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !claims(a.as_ref(), LockKind::Semaphore { permits: 1 }).await {
        return;
    }
    let name = unique("sem-mixed");
    let ttl = Duration::from_secs(10);
    let (one, two) = (permit(ttl, 1), permit(ttl, 2));
    let first = try_take(a.as_ref(), &name, &one)
        .await
        .expect("the first permit");
    let second = try_take(b.as_ref(), &name, &two)
        .await
        .expect("a 2-permit user is admitted beside one holder");
    assert!(
        try_take(a.as_ref(), &name, &one).await.is_none(),
        "a 1-permit user is admitted beside a holder"
    );
    assert!(
        try_take(b.as_ref(), &name, &two).await.is_none(),
        "a 2-permit user is admitted beside two holders"
    );
    second.release().await.expect("release");
    first.release().await.expect("release");
    let again = try_take(a.as_ref(), &name, &one)
        .await
        .expect("both permits came back");
    again.release().await.expect("release");
}
