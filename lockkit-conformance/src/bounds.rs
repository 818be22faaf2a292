//! Bounded holds and the early warning: `max_hold`, `min_hold`,
//! `lock_delay` and `at_risk`.
//!
//! The cases bound what the server did (a name taken or free, a loss and
//! its reason) and use elapsed time only as a lower bound (nothing may
//! happen early) or with margins of seconds for what a waiter notices.

use std::time::Duration;

use futures_util::FutureExt;
use lockkit_core::{DistributedLock, LockError, LockOptions, LostReason};
use tokio::time::Instant;

use super::Harness;
use crate::cases::{assert_held, assert_refused, is_free_for, must_acquire, unique};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the server's clock may lag this client's by when it counts a
/// lease down (the drift lockkit allows for, and a scheduler's tick).
const SLACK: Duration = Duration::from_millis(60);

/// How long a waiter may take to notice that a name came free (a backend
/// that polls backs off; etcd counts leases in whole seconds).
const NOTICE: Duration = Duration::from_secs(4);

/// Waits (up to `within`) for `name` to come free; when it did, from `from`.
async fn freed_after(
    lock: &dyn DistributedLock,
    name: &str,
    from: Instant,
    within: Duration,
) -> Duration {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(within);
    let guard = lock
        .acquire(name, &opts)
        .await
        .unwrap_or_else(|e| panic!("{name:?} did not come free within {within:?}: {e}"));
    let after = from.elapsed();
    guard.release().await.expect("release");
    after
}

/// Both `try_acquire` and `acquire` refuse `opts` with an error `is`
/// accepts, and the name is left free.
async fn refused(
    lock: &dyn DistributedLock,
    name: &str,
    opts: &LockOptions,
    is: fn(&LockError) -> bool,
) {
    assert_refused(lock, name, opts, is).await;
    assert!(
        is_free_for(lock, name).await,
        "a refused request held {name:?}"
    );
}

/// `max_hold` ends a holding at grant + limit however it is renewed: the
/// guard is lost with [`LostReason::HoldLimit`], not before the limit, and
/// the name is free at once (its lease, 30 s long, would hold it far
/// longer). The same for a shared holding and a permit where the backend
/// has them, all at once.
pub async fn max_hold_ends_the_holding(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let mut kinds = vec![("exclusive", LockOptions::new())];
    if caps.shared {
        kinds.push(("shared", LockOptions::new().shared()));
    }
    if caps.semaphore {
        kinds.push(("permit", LockOptions::new().semaphore(1)));
    }
    // Each kind renewed twice before the limit, and with a lease far past
    // it, all at once on names of their own: every one ends at the limit.
    let each = kinds.into_iter().flat_map(|(kind, opts)| {
        [Duration::from_secs(2), Duration::from_secs(30)]
            .map(|ttl| held_to_the_limit(a.as_ref(), b.as_ref(), kind, opts.clone().ttl(ttl)))
    });
    futures_util::future::join_all(each).await;
}

/// One holding of `opts` (its TTL set) held to a `max_hold` limit.
async fn held_to_the_limit(
    a: &dyn DistributedLock,
    b: &dyn DistributedLock,
    kind: &str,
    opts: LockOptions,
) {
    let limit = Duration::from_secs(3);
    let ttl = opts.lease_ttl();
    let name = unique("max-hold");
    let opts = opts.max_hold(limit);
    let asked = Instant::now();
    let guard = must_acquire(a, &name, &opts).await;
    let reason = tokio::time::timeout(limit + Duration::from_secs(10), guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{kind}, ttl {ttl:?}: never lost"));
    assert_eq!(reason, LostReason::HoldLimit, "{kind}, ttl {ttl:?}");
    assert!(
        asked.elapsed() >= limit,
        "{kind}, ttl {ttl:?}: lost after {:?}, before its max_hold of {limit:?}",
        asked.elapsed()
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    let probe = opts.ttl(Duration::from_secs(5)).wait_for(NOTICE);
    let probe = b
        .acquire(&name, &probe)
        .await
        .unwrap_or_else(|e| panic!("{kind}: the name stayed taken past max_hold: {e}"));
    probe.release().await.expect("release");
}

/// `min_hold`: a holding released at once keeps its name taken until
/// grant + floor, then the name is free, with nothing left on the server,
/// and the next holder's token is greater. A backend that cannot keep it
/// (session locks) refuses it with `Unsupported`.
pub async fn min_hold_keeps_the_name_after_an_early_release(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let name = unique("min-hold");
    let floor = Duration::from_secs(3);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .min_hold(floor);
    if !caps.min_hold {
        refused(a.as_ref(), &name, &opts, |e| {
            matches!(e, LockError::Unsupported { .. })
        })
        .await;
        return;
    }
    let asked = Instant::now();
    let guard = must_acquire(a.as_ref(), &name, &opts).await;
    let token = guard.fencing_token();
    guard.release().await.expect("an early release succeeds");
    assert!(
        !is_free_for(b.as_ref(), &name).await,
        "{name:?} came free at its release, before its min_hold"
    );
    let next = b
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(floor + NOTICE),
        )
        .await
        .unwrap_or_else(|e| panic!("{name:?} still taken well past its min_hold: {e}"));
    let after = asked.elapsed();
    assert!(
        after + SLACK >= floor,
        "free after {after:?}, before the min_hold of {floor:?}"
    );
    if caps.fencing {
        assert!(
            next.fencing_token() > token,
            "the next holder's token rises"
        );
    }
    next.release().await.expect("release");

    // Nothing stays behind: no more than a plain release leaves.
    let prefix = unique("min-hold-storage");
    let plain = format!("{prefix}/plain");
    must_acquire(b.as_ref(), &plain, &LockOptions::new())
        .await
        .release()
        .await
        .expect("release");
    let left_by_release = h.stored_entries(&plain).await;
    let kept = format!("{prefix}/kept");
    let short = LockOptions::new().min_hold(ms(300));
    must_acquire(a.as_ref(), &kept, &short)
        .await
        .release()
        .await
        .expect("release");
    // Polled: etcd counts its leases in whole seconds.
    let give_up = Instant::now() + ms(300) + NOTICE;
    let mut left = h.stored_entries(&kept).await;
    while left > left_by_release && Instant::now() < give_up {
        tokio::time::sleep(ms(100)).await;
        left = h.stored_entries(&kept).await;
    }
    assert!(
        left <= left_by_release,
        "a min_hold holding left {left} entries once it ended; a release leaves {left_by_release}"
    );
}

/// `lock_delay`: a holding that lapses, or whose holder vanishes, keeps its
/// name taken `delay` past its lease; a release, or a dropped guard, frees
/// it at once. A backend that cannot keep it refuses it with `Unsupported`.
pub async fn lock_delay_keeps_an_unreleased_name(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let delay = Duration::from_secs(3);
    if !caps.lock_delay {
        let opts = LockOptions::new().lock_delay(delay);
        refused(a.as_ref(), &unique("lock-delay"), &opts, |e| {
            matches!(e, LockError::Unsupported { .. })
        })
        .await;
        return;
    }
    let long = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .lock_delay(Duration::from_secs(60));
    // Released or dropped: free at once (the lease and its delay would
    // hold it for two minutes).
    let name = unique("lock-delay-released");
    must_acquire(a.as_ref(), &name, &long)
        .await
        .release()
        .await
        .expect("release");
    assert!(
        is_free_for(b.as_ref(), &name).await,
        "a release frees at once"
    );
    let name = unique("lock-delay-dropped");
    drop(must_acquire(a.as_ref(), &name, &long).await);
    freed_after(b.as_ref(), &name, Instant::now(), NOTICE).await;

    // Lapsed and crashed, at once on two names (each waits out a lease
    // and its delay).
    futures_util::future::join(
        lapsed_name_waits(a.as_ref(), b.as_ref(), delay),
        crashed_name_waits(a.as_ref(), b.as_ref(), delay),
    )
    .await;
}

/// `lock_delay`, for a holder that comes back after its validity ran out
/// but before its watchdog noticed (a paused process, a busy runtime): its
/// `release()` is told `Lost` and leaves the name taken for the delay, and
/// so does dropping such a guard; only a valid holding is freed at once. An
/// `extend()` then is `Lost` too: the lease the delay keeps revives nothing.
/// Runs on a multi-thread runtime, as the suite's macro gives every case
/// (the frozen holder blocks a thread of its own).
pub async fn a_lapsed_guard_keeps_its_lock_delay(h: &dyn Harness) {
    let b = h.client().await;
    if !b.capabilities().lock_delay {
        return;
    }
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .lock_delay(Duration::from_secs(60));
    let (released, dropped, extended) = (
        unique("lapsed-released"),
        unique("lapsed-dropped"),
        unique("lapsed-extended"),
    );
    // The holder gets a runtime of its own, which the sleep below freezes
    // whole, its watchdogs included: the guards see their validity over
    // before anything else could mark them lost.
    let frozen_holder = || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the holder");
        runtime.block_on(async {
            let a = h.client().await;
            let first = must_acquire(a.as_ref(), &released, &opts).await;
            let second = must_acquire(a.as_ref(), &dropped, &opts).await;
            let third = must_acquire(a.as_ref(), &extended, &opts).await;
            let second_lost = second.lost();
            std::thread::sleep(opts.lease_ttl());
            let extend = third.extend(opts.lease_ttl()).await;
            let release = first.release().await;
            drop(second);
            let marked = second_lost.now_or_never();
            // Room for what the drop spawned.
            tokio::time::sleep(ms(200)).await;
            (release, marked, extend, third.is_lost())
        })
    };
    let (release, marked, extend, still_lost) = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| scope.spawn(frozen_holder).join())
    })
    .expect("the frozen holder panicked");
    assert!(
        matches!(release, Err(LockError::Lost { .. })),
        "a release past the validity is a loss, got {release:?}"
    );
    assert!(
        matches!(extend, Err(LockError::Lost { .. })) && still_lost,
        "an extension past the validity is a loss and revives nothing, got {extend:?}"
    );
    assert!(
        marked.is_some(),
        "a guard dropped past its validity is marked lost at once"
    );
    assert_held(
        b.as_ref(),
        &released,
        "a lapsed holding's release keeps its lock delay",
    )
    .await;
    assert_held(
        b.as_ref(),
        &dropped,
        "a lapsed holding dropped keeps its lock delay",
    )
    .await;
}

/// The options of [`lapsed_name_waits`] and [`crashed_name_waits`]: a
/// lease of a second, not renewed, with a lock delay of `delay`.
fn lapsing(delay: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(1))
        .auto_renew(false)
        .lock_delay(delay)
}

/// A holding (not renewed, with a lock delay) whose lease runs out: the
/// guard is lost, and the name stays taken for the delay.
async fn lapsed_name_waits(a: &dyn DistributedLock, b: &dyn DistributedLock, delay: Duration) {
    let lapsing = lapsing(delay);
    let ttl = lapsing.lease_ttl();
    let name = unique("lock-delay-lapsed");
    let asked = Instant::now();
    let guard = must_acquire(a, &name, &lapsing).await;
    let reason = tokio::time::timeout(ttl + Duration::from_secs(10), guard.lost())
        .await
        .expect("a lapsing holding is lost");
    assert_eq!(reason, LostReason::Expired);
    let after = freed_after(b, &name, asked, ttl + delay + NOTICE).await;
    assert!(
        after + SLACK >= ttl + delay,
        "a lapsed holding's name came free after {after:?}, before its lease and delay ({:?})",
        ttl + delay
    );
    drop(guard);
}

/// A holding (not renewed, with a lock delay) whose holder is gone without
/// a word: the name stays taken for its lease and the delay.
async fn crashed_name_waits(a: &dyn DistributedLock, b: &dyn DistributedLock, delay: Duration) {
    let lapsing = lapsing(delay);
    let ttl = lapsing.lease_ttl();
    let name = unique("lock-delay-crashed");
    let asked = Instant::now();
    std::mem::forget(must_acquire(a, &name, &lapsing).await);
    let after = freed_after(b, &name, asked, ttl + delay + NOTICE).await;
    assert!(
        after + SLACK >= ttl + delay,
        "a crashed holding's name came free after {after:?}, before its lease and delay ({:?})",
        ttl + delay
    );
}

/// `at_risk` rises when the holder is cut off from its server (the server
/// frozen: connections open, nothing answers, as behind a black hole) while
/// the holding is still valid, and clears without a loss once the server
/// answers again.
pub async fn at_risk_rises_when_cut_off_and_clears_when_healed(h: &dyn Harness) {
    let mut server = h.disposable().await;
    let a = server.connect().await.expect("connect");
    let name = unique("at-risk");
    let ttl = Duration::from_secs(6);
    let guard = must_acquire(a.as_ref(), &name, &LockOptions::new().ttl(ttl)).await;
    assert!(!guard.is_at_risk());
    let risk = guard.at_risk();
    server.pause().await;
    let risen = tokio::time::timeout(ttl * 2, risk).await;
    server.resume().await;
    risen.expect("at_risk resolves once renewals go unanswered");
    assert!(!guard.is_lost(), "the warning came before the loss");
    let lost = guard.lost();
    let cleared = async {
        while guard.is_at_risk() {
            tokio::time::sleep(ms(20)).await;
        }
    };
    tokio::select! {
        () = cleared => {}
        reason = lost => panic!("lost ({reason}) instead of confirmed again"),
    }
    assert!(!guard.is_lost());
    let b = server.connect().await.expect("connect");
    assert!(
        !is_free_for(b.as_ref(), &name).await,
        "still held after the heal"
    );
    guard.release().await.expect("release after the heal");
}

/// Bad bounds are `InvalidOptions` (zero, more than a day, `min_hold` above
/// `max_hold`), before anything is held.
pub async fn invalid_bounds_rejected(h: &dyn Harness) {
    let a = h.client().await;
    let name = unique("bad-bounds");
    let day = Duration::from_secs(24 * 3600);
    for opts in [
        LockOptions::new().max_hold(Duration::ZERO),
        LockOptions::new().min_hold(Duration::ZERO),
        LockOptions::new().lock_delay(Duration::ZERO),
        LockOptions::new().max_hold(day + ms(1)),
        LockOptions::new().min_hold(day + ms(1)),
        LockOptions::new().lock_delay(day + ms(1)),
        LockOptions::new()
            .min_hold(Duration::from_secs(2))
            .max_hold(Duration::from_secs(1)),
    ] {
        refused(a.as_ref(), &name, &opts.wait_for(ms(100)), |e| {
            matches!(e, LockError::InvalidOptions { .. })
        })
        .await;
    }
}
