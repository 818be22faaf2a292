//! The conformance cases. Each is a plain async fn over a [`Harness`].

use std::time::Duration;

use lockkit_core::{
    DistributedLock, FencingToken, LockError, LockGuard, LockOptions, LostReason, ReleaseOnCrash,
};
use tokio::time::Instant;

use super::Harness;
use crate::contention::{Probe, spawn_contenders};

/// A lock name no other test uses.
pub fn unique(case: &str) -> String {
    format!("lockkit-test/{case}/{:016x}", fastrand::u64(..))
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) async fn must_acquire(
    lock: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
) -> LockGuard {
    match lock
        .acquire(name, &opts.clone().wait_for(Duration::from_secs(10)))
        .await
    {
        Ok(guard) => guard,
        Err(e) => panic!("acquire {name:?} failed: {e}"),
    }
}

pub(crate) async fn is_free_for(lock: &dyn DistributedLock, name: &str) -> bool {
    match lock.try_acquire(name, &opts(Duration::from_secs(5))).await {
        Ok(Some(guard)) => {
            guard.release().await.expect("release of a probe");
            true
        }
        Ok(None) => false,
        Err(e) => panic!("try_acquire {name:?} failed: {e}"),
    }
}

pub(crate) async fn assert_held(lock: &dyn DistributedLock, name: &str, why: &str) {
    let probe = lock
        .try_acquire(name, &opts(Duration::from_secs(5)))
        .await
        .unwrap_or_else(|e| panic!("try_acquire {name:?} failed: {e}"));
    if let Some(guard) = probe {
        guard.release().await.ok();
        panic!("{name:?} should be held: {why}");
    }
}

/// Both `try_acquire` and `acquire` of `name` with `opts` fail, with an
/// error that `is` (e.g. `InvalidName`) accepts.
pub(crate) async fn assert_refused(
    lock: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
    is: fn(&LockError) -> bool,
) {
    let err = lock.try_acquire(name, opts).await.unwrap_err();
    assert!(is(&err), "try_acquire {name:?} with {opts:?}: {err}");
    let err = lock.acquire(name, opts).await.unwrap_err();
    assert!(is(&err), "acquire {name:?} with {opts:?}: {err}");
}

/// Two clients: while one holds a name the other can neither take it nor wait it out.
pub async fn mutual_exclusion_between_two_clients(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("mutex");
    let o = opts(Duration::from_secs(10));
    let guard = a
        .try_acquire(&name, &o)
        .await
        .unwrap()
        .expect("a free lock is granted");
    assert!(b.try_acquire(&name, &o).await.unwrap().is_none());
    let err = b
        .acquire(&name, &o.clone().wait_for(ms(200)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    guard.release().await.unwrap();
    let guard = b
        .try_acquire(&name, &o)
        .await
        .unwrap()
        .expect("free after release");
    assert!(a.try_acquire(&name, &o).await.unwrap().is_none());
    guard.release().await.unwrap();
}

/// Holding one name does not block another.
pub async fn independent_names(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let (one, two) = (unique("indep-1"), unique("indep-2"));
    let o = opts(Duration::from_secs(10));
    let g1 = a.try_acquire(&one, &o).await.unwrap().expect("one is free");
    let g2 = b
        .try_acquire(&two, &o)
        .await
        .unwrap()
        .expect("two is free while one is held");
    let g3 = a
        .try_acquire(&unique("indep-3"), &o)
        .await
        .unwrap()
        .expect("a third name is free");
    assert_held(b.as_ref(), &one, "a holds it").await;
    assert_held(a.as_ref(), &two, "b holds it").await;
    for g in [g1, g2, g3] {
        g.release().await.unwrap();
    }
}

/// A name can be taken again right after release, many times over.
pub async fn reacquire_after_release(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("reacquire");
    for i in 0..20 {
        let g = a
            .try_acquire(&name, &opts(Duration::from_secs(10)))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: free after release"));
        g.release().await.unwrap();
    }
}

/// After a release, nothing of the old holding touches the next holder: not its
/// drop, not a late release of a lease that is already gone (which says `Lost`).
pub async fn double_release_is_harmless(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("double-release");
    let o = opts(Duration::from_secs(10));
    let first = must_acquire(a.as_ref(), &name, &o).await;
    first.release().await.unwrap();
    let second = must_acquire(b.as_ref(), &name, &o).await;
    tokio::time::sleep(ms(200)).await;
    assert_held(a.as_ref(), &name, "b holds it after a's release").await;
    // A lease that is already gone: releasing it is a clean `Lost`, twice over.
    h.revoke(&name).await;
    let err = second.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    assert!(is_free_for(a.as_ref(), &name).await);
}

/// A guard whose lease is gone (revoked, or expired) cannot release or extend the
/// lease of the holder that came after it; it gets `Lost`.
pub async fn stale_guard_cannot_release_or_extend(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let long = opts(Duration::from_secs(30)).auto_renew(false);

    // Revoked, then taken by b: the server-side compare refuses a's release.
    let name = unique("stale-release");
    let stale = must_acquire(a.as_ref(), &name, &long).await;
    h.revoke(&name).await;
    let fresh = must_acquire(b.as_ref(), &name, &long).await;
    let err = stale.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "release: {err}");
    assert_held(a.as_ref(), &name, "b's lease survives a's stale release").await;
    fresh.release().await.unwrap();

    // Revoked, then taken by b: the server-side compare refuses a's extend.
    let name = unique("stale-extend");
    let stale = must_acquire(a.as_ref(), &name, &long).await;
    h.revoke(&name).await;
    let fresh = must_acquire(b.as_ref(), &name, &long).await;
    let err = stale.extend(Duration::from_secs(60)).await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "extend: {err}");
    assert!(stale.is_lost());
    drop(stale);
    tokio::time::sleep(ms(100)).await;
    assert_held(
        a.as_ref(),
        &name,
        "b's lease survives a's stale extend and drop",
    )
    .await;
    fresh.release().await.unwrap();

    // Expired by its TTL, then taken by b.
    let name = unique("stale-expired");
    let stale = must_acquire(a.as_ref(), &name, &opts(ms(300)).auto_renew(false)).await;
    let fresh = must_acquire(b.as_ref(), &name, &long).await;
    assert!(stale.is_lost());
    assert!(matches!(
        stale.extend(Duration::from_secs(60)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(stale.release().await, Err(LockError::Lost { .. })));
    assert_held(a.as_ref(), &name, "b's lease survives the expired guard").await;
    fresh.release().await.unwrap();
}

/// A holder that stops renewing and never releases (a crash) loses the lock
/// when its TTL runs out, not before.
pub async fn ttl_expiry_frees_crashed_holder(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("crash");
    let ttl = ms(600);
    let granted = Instant::now();
    let crashed = must_acquire(a.as_ref(), &name, &opts(ttl).auto_renew(false)).await;
    // A crash: no release on drop. (`forget` also keeps the guard's timers alive,
    // which only mark it lost once its validity is over.)
    std::mem::forget(crashed);
    assert_held(b.as_ref(), &name, "right after the crash").await;
    let taken = b
        .acquire(
            &name,
            &opts(Duration::from_secs(10)).wait_for(Duration::from_secs(5)),
        )
        .await
        .expect("the TTL frees the crashed holder's lock");
    let after = granted.elapsed();
    assert!(
        after >= ttl - ms(50),
        "freed after {after:?}, before the TTL of {ttl:?}"
    );
    assert!(after < ttl + ms(1500), "freed only after {after:?}");
    taken.release().await.unwrap();
}

/// The holder can extend its lease past the original TTL.
pub async fn extend_by_holder(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("extend");
    let guard = must_acquire(a.as_ref(), &name, &opts(ms(400)).auto_renew(false)).await;
    let before = guard.valid_until().expect("validity is known");
    tokio::time::sleep(ms(150)).await;
    guard.extend(Duration::from_secs(2)).await.unwrap();
    let after = guard.valid_until().expect("validity is known");
    assert!(
        after > before + ms(1000),
        "extend moved validity from {before:?} to {after:?}"
    );
    tokio::time::sleep(ms(500)).await; // well past the original 400 ms
    assert!(!guard.is_lost());
    assert_held(b.as_ref(), &name, "extended past its first TTL").await;
    guard.release().await.unwrap();
}

/// With auto-renew on, a lock outlives many TTLs.
pub async fn auto_renew_keeps_lock_across_five_ttls(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("renew");
    // Each renewal has two thirds of the TTL to come back: 330 ms here,
    // which a ZooKeeper read on a machine loaded by the whole suite has
    // outrun (200 ms at a TTL of 300 ms).
    let ttl = ms(500);
    let guard = must_acquire(a.as_ref(), &name, &opts(ttl).auto_renew(true)).await;
    let end = Instant::now() + ttl * 6;
    let mut probes = 0;
    while Instant::now() < end {
        assert_held(b.as_ref(), &name, "auto-renew keeps it").await;
        probes += 1;
        tokio::time::sleep(ms(60)).await;
    }
    assert!(probes >= 10, "only {probes} probes");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// Deleting the lease behind the holder's back fires the lost signal.
pub async fn lost_signal_when_lease_deleted(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("lost-deleted");
    let guard = must_acquire(a.as_ref(), &name, &opts(ms(600)).auto_renew(true)).await;
    let lost = guard.lost();
    assert!(!guard.is_lost());
    h.revoke(&name).await;
    // A renewal period is 200 ms; the bound is only against a hang.
    let reason = tokio::time::timeout(Duration::from_secs(20), lost)
        .await
        .expect("lost signal fires at the next renewal");
    // Session locks (SQL `row`, `advisory`, `named`) are revoked by killing
    // the holder's connection.
    let expected = if a.capabilities().release_on_crash == ReleaseOnCrash::Connection {
        LostReason::ConnectionLost
    } else {
        LostReason::Revoked
    };
    assert_eq!(reason, expected);
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// A dead server fires the lost signal once the lease can no longer be renewed.
pub async fn lost_signal_when_server_dies(h: &dyn Harness) {
    let mut server = h.disposable().await;
    let a = server.connect().await.expect("connect to a live server");
    let name = unique("lost-server");
    let ttl = ms(800);
    let guard = must_acquire(a.as_ref(), &name, &opts(ttl).auto_renew(true)).await;
    server.kill().await;
    // Bounded by the case's limit only: how soon the timer fires after the
    // lease runs out is the machine's speed, not the backend's behaviour.
    let reason = guard.lost().await;
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed | LostReason::SessionExpired | LostReason::ConnectionLost
        ),
        "{reason:?}"
    );
    assert!(guard.is_lost());
}

/// A server outage shorter than the lease costs renewals, not the lease: the
/// watchdog retries until the validity runs out.
pub async fn renewal_survives_a_short_outage(h: &dyn Harness) {
    let mut server = h.disposable().await;
    let (a, b) = (
        server.connect().await.expect("connect"),
        server.connect().await.expect("connect"),
    );
    let name = unique("outage");
    let ttl = ms(1500);
    let guard = must_acquire(a.as_ref(), &name, &opts(ttl).auto_renew(true)).await;
    server.pause().await;
    tokio::time::sleep(ttl / 3 + ms(300)).await; // a renewal falls into the outage
    server.resume().await;
    tokio::time::sleep(ttl).await; // past the validity the lost renewal would have given
    assert!(!guard.is_lost(), "a short outage lost the lease");
    assert_held(b.as_ref(), &name, "renewal resumed after the outage").await;
    guard.release().await.unwrap();
}

/// Fencing tokens strictly increase across 100 successive holders (where the
/// backend claims fencing; otherwise guards carry none).
pub async fn fencing_tokens_strictly_increase(h: &dyn Harness) {
    let clients = [h.client().await, h.client().await];
    let fencing = clients[0].capabilities().fencing;
    let name = unique("fencing");
    let mut last = None;
    for i in 0..100 {
        let guard = must_acquire(
            clients[i % 2].as_ref(),
            &name,
            &opts(Duration::from_secs(10)),
        )
        .await;
        let token = guard.fencing_token();
        if fencing {
            let token = token.unwrap_or_else(|| panic!("holder {i} has no fencing token"));
            if let Some(previous) = last {
                assert!(token > previous, "holder {i}: {token} after {previous}");
            }
            last = Some(token);
        } else {
            assert_eq!(token, None, "capabilities say no fencing");
        }
        guard.release().await.unwrap();
    }
}

/// `FencingToken::is_current` (Chubby's `CheckSequencer`): true for the
/// holder's token while it holds, false once it released and while a later
/// holder holds; `Unsupported` where the backend reports no token for a
/// holding (then never a wrong answer).
pub async fn is_current_tells_the_holding(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("current");
    let first = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(10))).await;
    let Some(token) = first.fencing_token() else {
        let answer = FencingToken::new(1).is_current(b.as_ref(), &name).await;
        assert!(
            matches!(answer, Err(LockError::Unsupported { .. })),
            "{answer:?}"
        );
        first.release().await.unwrap();
        return;
    };
    match token.is_current(b.as_ref(), &name).await {
        Ok(current) => assert!(current, "the holder's token is current"),
        Err(LockError::Unsupported { .. }) => {
            let status = b.status(&name).await.expect("status");
            assert_eq!(
                status.fencing_token, None,
                "a token was reported: {status:?}"
            );
            first.release().await.unwrap();
            return;
        }
        Err(other) => panic!("is_current failed: {other}"),
    }
    let other = FencingToken::new(token.get().wrapping_add(1));
    assert!(
        !other.is_current(b.as_ref(), &name).await.unwrap(),
        "another token is not current"
    );
    first.release().await.unwrap();
    assert!(
        !token.is_current(b.as_ref(), &name).await.unwrap(),
        "free after release"
    );
    let second = must_acquire(b.as_ref(), &name, &opts(Duration::from_secs(10))).await;
    let next = second
        .fencing_token()
        .expect("the next holder has a token too");
    assert!(
        !token.is_current(a.as_ref(), &name).await.unwrap(),
        "the former holder's token"
    );
    assert!(
        next.is_current(a.as_ref(), &name).await.unwrap(),
        "the next holder's token"
    );
    second.release().await.unwrap();
}

/// A waiting `acquire` gets the lock as soon as the holder releases, not after its TTL.
pub async fn acquire_succeeds_when_holder_releases(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("handoff");
    let holder = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(30))).await;
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.acquire(
                &name,
                &opts(Duration::from_secs(30)).wait_for(Duration::from_secs(20)),
            )
            .await
        })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    holder.release().await.unwrap();
    // Within its 20 s wait, before the holder's 30 s lease could have run
    // out: the release handed it over. (How fast is the benchmarks' part.)
    let guard = waiter.await.unwrap().expect("the waiter gets the lock");
    guard.release().await.unwrap();
}

/// `acquire` with a wait gives `Timeout`, not before the wait is over,
/// while the holder still holds. How late past the wait it returns is the
/// machine's speed: the wait policy's own tests bound it on tokio's paused
/// clock.
pub async fn acquire_times_out_near_deadline(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("timeout");
    let holder = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(30))).await;
    let wait = ms(400);
    let start = Instant::now();
    let err = b
        .acquire(&name, &opts(Duration::from_secs(30)).wait_for(wait))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(took >= wait, "gave up early, after {took:?}");
    assert!(!holder.is_lost(), "the holder's lease ran out meanwhile");
    holder.release().await.unwrap();
}

/// A waiter that gives up has left the name's line by the time its
/// `acquire` returns `Timeout`, where `status` counts waiters: a release
/// then does not wait on a client that no longer waits (a process that
/// exits right after giving up, say).
pub async fn a_waiter_that_gives_up_leaves_the_line(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("gives-up");
    let holder = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(60))).await;
    if a.status(&name).await.unwrap().waiters.is_none() {
        holder.release().await.unwrap();
        return;
    }
    // Long enough for the waiter to be counted however slow the machine.
    let wait = Duration::from_secs(5);
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.acquire(&name, &opts(Duration::from_secs(30)).wait_for(wait))
                .await
        })
    };
    let mut seen = false;
    while !waiter.is_finished() {
        if a.status(&name).await.unwrap().waiters == Some(1) {
            seen = true;
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert!(seen, "the waiter was never counted within its {wait:?}");
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let after = a.status(&name).await.unwrap();
    assert_eq!(
        after.waiters,
        Some(0),
        "the waiter that gave up is still counted: {after:?}"
    );
    holder.release().await.unwrap();
}

/// A wait its client gave up on never takes the lock later: once the holder
/// releases, the client's next try gets it. (A server may go on with a
/// wait after its client gave up: MySQL and MariaDB until the wait is
/// killed, ZooKeeper and etcd until the waiter's key is deleted.) Several
/// rounds, each release coming at once after the give-up, when what the
/// wait left is most likely still on the server. (On a loaded machine, a
/// MariaDB `row` wait cut off by its client and killed in the background
/// took the lock in rounds 3, 7 and 191 of three runs of 400: its
/// `Timeout` now comes once the wait is stopped.)
pub async fn a_wait_given_up_never_takes_the_lock_later(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("given-up");
    let o = opts(Duration::from_secs(30));
    for round in 0..12 {
        let holder = must_acquire(a.as_ref(), &name, &o).await;
        let err = b
            .acquire(&name, &o.clone().wait_for(ms(100)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LockError::Timeout { .. }),
            "round {round}: {err}"
        );
        holder.release().await.unwrap();
        let guard = b
            .try_acquire(&name, &o)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: a wait given up took the lock"));
        guard.release().await.unwrap();
    }
}

/// `no_wait` and `try_acquire` make one attempt and return at once.
pub async fn no_wait_gives_timeout_at_once(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("no-wait");
    let holder = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(30))).await;
    let start = Instant::now();
    let err = b
        .acquire(&name, &opts(Duration::from_secs(30)).no_wait())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(
        b.try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    // At once: it did not wait for the holder's lease (30 s) to run out.
    assert!(!holder.is_lost());
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    holder.release().await.unwrap();
}

/// 64 tasks on 4 clients × 50 critical sections: never two inside at once, and
/// no update of a shared counter is lost.
pub async fn no_overlap_under_contention(h: &dyn Harness) {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 16;
    const ROUNDS: u64 = 50;
    let name = unique("contention");
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(h.client().await);
    }
    let probe = Probe::default();
    let o = opts(Duration::from_secs(10)).wait_for(Duration::from_secs(60));
    for task in spawn_contenders(&clients, TASKS_PER_CLIENT, ROUNDS, &name, &o, &probe) {
        task.await.expect("worker task");
    }
    assert_eq!(probe.overlaps(), 0, "critical sections overlapped");
    assert_eq!(
        probe.completed(),
        (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS,
        "updates were lost"
    );
}

/// Aborts each task at a random point, spread from "not started" through
/// "request in flight" to "granted": scheduler yields (microseconds) and,
/// now and then, a timer tick (about a millisecond) before each abort.
pub(crate) async fn abort_at_random_points<T>(tasks: &[tokio::task::JoinHandle<T>]) {
    for task in tasks {
        for _ in 0..fastrand::usize(0..300) {
            tokio::task::yield_now().await;
        }
        if fastrand::u8(0..4) == 0 {
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..2000))).await;
        }
        task.abort();
    }
}

/// 200 `acquire` futures cancelled at random points (queued, in flight, just
/// granted) leak no lease: the lock is free again within 1 s, not after its TTL.
pub async fn cancelled_acquires_leak_no_lease(h: &dyn Harness) {
    let clients = [h.client().await, h.client().await];
    let name = unique("cancel");
    let o = opts(Duration::from_secs(60)).wait_for(Duration::from_secs(30));
    let mut completed = 0;
    for batch in 0..20 {
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (client, name, o) = (clients[(batch + i) % 2].clone(), name.clone(), o.clone());
            tasks.push(tokio::spawn(async move { client.acquire(&name, &o).await }));
        }
        abort_at_random_points(&tasks).await;
        for task in tasks {
            // A task that finished before its abort hands back a guard; dropping
            // it must release the lock as well.
            if let Ok(result) = task.await {
                result.expect("acquire");
                completed += 1;
            }
        }
    }
    // A leaked lease would hold the name for its 60 s: free within half of
    // that, it was released.
    let probe = h.client().await;
    let guard = probe
        .acquire(
            &name,
            &opts(Duration::from_secs(10)).wait_for(Duration::from_secs(30)),
        )
        .await
        .unwrap_or_else(|e| {
            panic!("lock still held after cancellations ({completed} of 200 completed): {e}")
        });
    guard.release().await.unwrap();
}

/// An `acquire` given up while the server does not answer is undone once
/// the server is back: the lock is free well before the lease's TTL, and the
/// clients that gave up go on working, with no panic anywhere in the process
/// (a driver that reused a connection given up midway could read the
/// answers out of step). One client has used the lock before the outage
/// (its request goes out whole, and the server may grant it when it wakes),
/// the other has only asked for a status (its first acquire may be given up
/// halfway through a connection's preparations).
pub async fn acquire_given_up_in_an_outage_is_undone(h: &dyn Harness) {
    let panics = crate::panics::count();
    let mut server = h.disposable().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(server.connect().await.expect("connect"));
    }
    let [warm, cold, probe] = &clients[..] else {
        unreachable!("three clients")
    };
    let ttl = Duration::from_secs(60);
    let names = [unique("given-up-warm"), unique("given-up-cold")];
    must_acquire(warm.as_ref(), &unique("warm-up"), &opts(ttl))
        .await
        .release()
        .await
        .expect("release");
    cold.status(&names[1])
        .await
        .expect("status before the outage");
    server.pause().await;
    for (client, name) in [warm, cold].into_iter().zip(&names) {
        let given_up = tokio::time::timeout(ms(500), client.acquire(name, &opts(ttl))).await;
        match given_up {
            // Given up in flight, or refused as unavailable: both are fine.
            Err(_) => {}
            Ok(Err(e)) => assert!(e.is_temporary(), "acquire in the outage failed with {e}"),
            Ok(Ok(_)) => panic!("{name}: acquire granted while the server was frozen"),
        }
    }
    server.resume().await;
    // A lease the undo missed would hold its name for the TTL (60 s): two
    // waits of 15 s each end well before that.
    for (client, name) in [warm, cold].into_iter().zip(&names) {
        let guard = probe
            .acquire(name, &opts(ttl).wait_for(Duration::from_secs(15)))
            .await
            .unwrap_or_else(|e| panic!("{name}: the acquire given up in the outage holds: {e}"));
        guard.release().await.expect("release");
        let again = must_acquire(client.as_ref(), name, &opts(ttl)).await;
        again.release().await.expect("release");
    }
    assert_eq!(
        crate::panics::count(),
        panics,
        "a panic in the process (see its output)"
    );
}

/// Dropping a guard without `release` frees the lock: another client gets
/// it well before the lease (60 s) would have run out.
pub async fn dropped_guard_releases_promptly(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("drop");
    let guard = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(60))).await;
    drop(guard);
    let taken = b
        .acquire(
            &name,
            &opts(Duration::from_secs(10)).wait_for(Duration::from_secs(30)),
        )
        .await
        .expect("a dropped guard frees the lock before its lease runs out");
    taken.release().await.unwrap();
}

/// Empty, over-long and control-character names are rejected with `InvalidName`.
pub async fn invalid_names_rejected(h: &dyn Harness) {
    let a = h.client().await;
    let o = opts(Duration::from_secs(5)).wait_for(ms(100));
    for bad in [
        String::new(),
        "x".repeat(256),
        "line\nbreak".to_owned(),
        "nul\0".to_owned(),
        "\u{1b}[31m".to_owned(),
    ] {
        assert_refused(a.as_ref(), &bad, &o, |e| {
            matches!(e, LockError::InvalidName { .. })
        })
        .await;
    }
    let longest = format!("{}{}", unique("max"), "y".repeat(255))
        .chars()
        .take(255)
        .collect::<String>();
    let guard = a
        .try_acquire(&longest, &o)
        .await
        .unwrap()
        .expect("a 255-byte name works");
    guard.release().await.unwrap();
}

/// A zero or huge TTL is `InvalidOptions`, for acquiring and for extending.
pub async fn invalid_options_rejected(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("options");
    for bad in [
        opts(Duration::ZERO),
        opts(Duration::MAX),
        opts(Duration::from_secs(5)).wait_for(Duration::MAX),
        opts(Duration::from_secs(5)).semaphore(0),
        opts(Duration::from_secs(5)).holder(""),
        opts(Duration::from_secs(5)).holder("h".repeat(256)),
        opts(Duration::from_secs(5)).holder("new\nline"),
    ] {
        assert_refused(a.as_ref(), &name, &bad, |e| {
            matches!(e, LockError::InvalidOptions { .. })
        })
        .await;
    }
    let guard = must_acquire(a.as_ref(), &name, &opts(Duration::from_secs(5))).await;
    for bad in [Duration::ZERO, Duration::MAX] {
        let err = guard.extend(bad).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOptions { .. }),
            "extend {bad:?}: {err}"
        );
    }
    assert!(!guard.is_lost(), "a rejected extend leaves the lease alone");
    guard.release().await.unwrap();
}

/// Names with `/`, `..`, `{}`, spaces, `%`, case differences and non-ASCII work,
/// and distinct names are distinct locks.
pub async fn odd_names_work_and_do_not_collide(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let base = unique("odd");
    let suffixes = [
        "",
        "/",
        "a/b",
        "a%2Fb",
        "a_2Fb",
        "..",
        ".",
        "a/../b",
        "{a}",
        "{a}:fence",
        "{",
        "}",
        "with space",
        "with  two",
        "A",
        "a",
        "ünïcödé 名前",
        "emoji 🔒",
        "%",
        "%25",
        "-lock-",
        "__lock__",
        "tab-free\u{a0}nbsp",
        "'quote\"",
        "back\\slash",
        "semi;colon",
    ];
    let names: Vec<String> = suffixes.iter().map(|s| format!("{base}{s}")).collect();
    let o = opts(Duration::from_secs(20)).auto_renew(false);
    let mut guards = Vec::new();
    for name in &names {
        let guard = a
            .try_acquire(name, &o)
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"))
            .unwrap_or_else(|| panic!("{name:?} collides with an earlier name"));
        guards.push(guard);
    }
    for name in &names {
        assert_held(b.as_ref(), name, "a holds every odd name").await;
    }
    for guard in guards {
        let name = guard.name().to_owned();
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("release {name:?}: {e}"));
    }
    for name in &names {
        assert!(
            is_free_for(b.as_ref(), name).await,
            "{name:?} free after release"
        );
    }
}

/// A dead server gives `Unavailable` within the connect timeout (no hang, no panic).
pub async fn dead_server_gives_unavailable(h: &dyn Harness) {
    let mut server = h.disposable().await;
    server.kill().await;
    let start = Instant::now();
    let outcome = match server.connect().await {
        Err(e) => e,
        Ok(client) => client
            .try_acquire(&unique("dead"), &opts(Duration::from_secs(5)))
            .await
            .expect_err("a dead server cannot grant a lock"),
    };
    let took = start.elapsed();
    assert!(
        matches!(outcome, LockError::Unavailable { .. }),
        "{outcome}"
    );
    assert!(
        took <= h.connect_timeout() + Duration::from_secs(1),
        "took {took:?} with a connect timeout of {:?}",
        h.connect_timeout()
    );
}

/// `connect` waits for a server that is still starting (its port closed,
/// or open and not serving yet), within the connect timeout: services
/// started together by an orchestrator must just work. The connect begins
/// while the server is dead, and the server starts a little later.
pub async fn connect_waits_for_a_starting_server(h: &dyn Harness) {
    let mut server = h.disposable().await;
    server.kill().await;
    let server = server;
    let connect_timeout = Duration::from_secs(60);
    let start = Instant::now();
    let (connected, restarted) = tokio::join!(
        async {
            let client = server.connect_within(connect_timeout).await;
            (client, start.elapsed())
        },
        async {
            tokio::time::sleep(ms(300)).await;
            server.restart().await;
            start.elapsed()
        }
    );
    let (client, took) = connected;
    let client = client.unwrap_or_else(|e| {
        panic!(
            "connect gave up after {took:?} while the server started (up after {restarted:?}): {e}"
        )
    });
    assert!(took < connect_timeout, "took {took:?}");
    // Once every member is up, the client serves. A client of a cluster
    // may still meet a member's broken connection once: that is
    // `Unavailable`, and it passes.
    let name = unique("starting");
    let until = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match client
            .try_acquire(&name, &opts(Duration::from_secs(5)))
            .await
        {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("{name:?} is held by nobody, yet busy"),
            Err(LockError::Unavailable { .. }) if Instant::now() < until => {
                tokio::time::sleep(ms(100)).await;
            }
            Err(error) => panic!("acquire after the server started: {error}"),
        }
    };
    guard.release().await.unwrap();
}

/// A guard knows its name, its validity and that it is not lost.
pub async fn guard_reports_its_state(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("state");
    let ttl = Duration::from_secs(10);
    let guard = must_acquire(a.as_ref(), &name, &opts(ttl)).await;
    // The validity counts from when the granting request was sent, which
    // is before the acquire returned (and may be well after it began: a
    // waiting acquire, a slow machine).
    let handed_over = Instant::now();
    assert_eq!(guard.name(), name);
    let valid_until = guard.valid_until().expect("validity is known");
    assert!(valid_until > handed_over + ttl / 2, "{valid_until:?}");
    assert!(
        valid_until <= handed_over + ttl,
        "validity beyond the TTL: {:?} after the acquire returned",
        valid_until - handed_over
    );
    assert!(!guard.is_lost());
    assert_eq!(guard.fencing_token().is_some(), a.capabilities().fencing);
    let shown = format!("{guard:?}");
    assert!(shown.contains(&name), "{shown}");
    guard.release().await.unwrap();
}

/// `status` tells a free lock from a held one without taking it, and reports
/// the holder's fencing token and remaining lease where the backend has them,
/// and the queue behind the holder where the server keeps one.
pub async fn status_reports_the_holder(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("status");
    let free = b.status(&name).await.expect("status of an unused name");
    assert!(!free.held, "an unused name is free: {free:?}");

    let ttl = Duration::from_secs(10);
    let guard = must_acquire(a.as_ref(), &name, &opts(ttl)).await;
    let held = b.status(&name).await.expect("status of a held name");
    assert!(held.held, "held by the other client: {held:?}");
    if a.capabilities().fencing {
        // Session locks (SQL row/advisory/named) keep no token on the server.
        if let Some(token) = held.fencing_token {
            assert_eq!(
                Some(token),
                guard.fencing_token(),
                "the token reported is the holder's"
            );
        }
    } else {
        assert_eq!(held.fencing_token, None, "no token without fencing");
    }
    if let Some(left) = held.remaining {
        assert!(left <= ttl && left > ttl / 2, "remaining lease {left:?}");
    }
    // Asking took nothing: the holder still holds, and can release.
    assert!(!guard.is_lost());
    assert_held(b.as_ref(), &name, "status must not take the lock").await;

    if held.waiters.is_some() {
        let (waiter_client, waiter_name) = (b.clone(), name.clone());
        let waiter = tokio::spawn(async move {
            let o = opts(ttl).wait_for(Duration::from_secs(10));
            waiter_client.acquire(&waiter_name, &o).await
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = a.status(&name).await.expect("status with a waiter");
            if now.waiters == Some(1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the waiter never showed: {now:?}"
            );
            tokio::time::sleep(ms(20)).await;
        }
        guard.release().await.unwrap();
        let next = waiter.await.unwrap().expect("the waiter gets the lock");
        let after = a.status(&name).await.unwrap();
        assert!(after.held && after.waiters == Some(0), "{after:?}");
        next.release().await.unwrap();
    } else {
        guard.release().await.unwrap();
    }
    let released = b.status(&name).await.expect("status after release");
    assert!(!released.held, "free after release: {released:?}");

    let err = b.status("bad\nname").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidName { .. }), "{err}");
}

/// Tasks of one client taking turns (the lease may pass from one to the
/// next without a release in between): never two inside at once, fencing
/// tokens strictly increasing in the order the sections ran, and the lock
/// free once the last one released.
pub async fn local_handoffs_keep_exclusion_and_fencing(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("local-handoffs");
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (a, name, inside, tokens) = (a.clone(), name.clone(), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let o = opts(Duration::from_secs(10)).wait_for(Duration::from_secs(30));
            for _ in 0..25 {
                let guard = a.acquire(&name, &o).await.expect("acquire");
                assert!(
                    !inside.swap(true, std::sync::atomic::Ordering::SeqCst),
                    "two tasks inside at once"
                );
                tokens.lock().unwrap().push(guard.fencing_token());
                tokio::task::yield_now().await;
                inside.store(false, std::sync::atomic::Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task");
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 200);
    if a.capabilities().fencing {
        for pair in tokens.windows(2) {
            assert!(pair[1] > pair[0], "tokens must increase: {pair:?}");
        }
    }
    let after = a.status(&name).await.expect("status");
    assert!(!after.held, "nothing left held: {after:?}");
    assert!(is_free_for(a.as_ref(), &name).await);
}

/// A kind of holding the backend cannot give (its capabilities say no
/// shared locks, or no semaphores) is refused with `Unsupported` by
/// `try_acquire` and `acquire` alike, and nothing is taken: never granted as
/// an exclusive lock instead.
pub async fn unsupported_kinds_are_refused(h: &dyn Harness) {
    let a = h.client().await;
    let caps = a.capabilities();
    let name = unique("kinds");
    let base = opts(Duration::from_secs(5)).wait_for(ms(200));
    for (supported, asked) in [
        (caps.shared, base.clone().shared()),
        (caps.semaphore, base.clone().semaphore(2)),
    ] {
        if supported {
            continue;
        }
        assert_refused(a.as_ref(), &name, &asked, |e| {
            matches!(e, LockError::Unsupported { .. })
        })
        .await;
    }
    assert!(
        is_free_for(a.as_ref(), &name).await,
        "a refused request left {name:?} held"
    );
}
