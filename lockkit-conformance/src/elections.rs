//! The cases of leader elections ([`Election`]). On a backend whose
//! capabilities do not claim holder identities, each checks that a campaign
//! is refused with `Unsupported` instead.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{DistributedLock, Election, Leadership, LockError, LockOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Harness;
use crate::cases::unique;

/// Whether `lock` records holders; if it does not, checks that a campaign
/// says so.
async fn records_holders(lock: &Arc<dyn DistributedLock>) -> bool {
    if lock.capabilities().holder {
        return true;
    }
    let election = Election::new(lock.clone(), unique("no-holder"), "me");
    let refused = election.campaign(&LockOptions::new().no_wait()).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "a backend without holder identities must refuse a campaign: {refused:?}"
    );
    false
}

/// A campaign of `election` with `opts` in a task of its own: the leadership
/// and when it was granted.
fn campaign(election: &Election, opts: &LockOptions) -> JoinHandle<(Leadership, Instant)> {
    let (election, opts) = (election.clone(), opts.clone());
    tokio::spawn(async move {
        let leadership = election
            .campaign(&opts)
            .await
            .unwrap_or_else(|e| panic!("{} campaigns: {e}", election.identity()));
        (leadership, Instant::now())
    })
}

/// The first of `campaigns` to finish, and the rest.
async fn first_leader(
    mut campaigns: Vec<JoinHandle<(Leadership, Instant)>>,
    within: Duration,
) -> (
    (Leadership, Instant),
    Vec<JoinHandle<(Leadership, Instant)>>,
) {
    let started = Instant::now();
    loop {
        if let Some(i) = campaigns.iter().position(JoinHandle::is_finished) {
            let done = campaigns.remove(i).await.expect("a candidate");
            return (done, campaigns);
        }
        assert!(
            started.elapsed() < within,
            "no new leader within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Three candidates on three clients: exactly one leads at a time, every
/// client's `leader()` names it, terms strictly increase across leaders
/// (where the backend fences), and a leader that resigns or whose lease is
/// deleted behind its back is replaced before its lease could have run out
/// (its `lost()` firing for the deleted one).
pub async fn elections_have_one_leader_at_a_time(h: &dyn Harness) {
    let clients = [h.client().await, h.client().await, h.client().await];
    if !records_holders(&clients[0]).await {
        return;
    }
    let name = unique("election");
    let ttl = Duration::from_secs(9);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(60));
    let elections: Vec<Election> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| Election::new(c.clone(), name.clone(), format!("candidate-{i}")))
        .collect();
    let campaigns: Vec<_> = elections.iter().map(|e| campaign(e, &opts)).collect();
    let fences = clients[0].capabilities().fencing;
    let within = ttl;

    // The first leader.
    let ((first, _), campaigns) = first_leader(campaigns, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        campaigns.iter().all(|c| !c.is_finished()),
        "a second leader while the first leads"
    );
    for election in &elections {
        assert_eq!(
            election.leader().await.expect("leader()").as_deref(),
            Some(first.identity()),
            "{} sees another leader",
            election.identity()
        );
    }

    // It resigns: another leads, in a later term.
    let first_term = first.term();
    first.resign().await.expect("resign");
    let ((second, _), campaigns) = first_leader(campaigns, within).await;
    assert_ne!(second.identity(), "");
    if fences {
        assert!(
            second.term() > first_term,
            "term {:?} after {first_term:?}",
            second.term()
        );
    }
    assert_eq!(
        elections[0].leader().await.expect("leader()").as_deref(),
        Some(second.identity())
    );

    // Its lease is deleted behind its back: it learns so, and the last
    // candidate leads.
    h.revoke(&name).await;
    let lost = tokio::time::timeout(within, second.lost()).await;
    assert!(
        lost.is_ok(),
        "the deposed leader was not told within {within:?}"
    );
    let ((third, _), rest) = first_leader(campaigns, within).await;
    assert!(rest.is_empty());
    if fences {
        assert!(third.term() > second.term());
    }
    assert_eq!(
        elections[1].leader().await.expect("leader()").as_deref(),
        Some(third.identity())
    );
    third.resign().await.expect("resign");
    assert_eq!(elections[2].leader().await.expect("leader()"), None);
}

/// A leader that stops renewing (as a paused or dying process does) knows it
/// lost before the next candidate is granted leadership: its lease's local
/// deadline (after which `is_lost()` is true and `lost()` fires) comes before
/// the grant; `lost()` fires; and the next one leads within the TTL plus a
/// second. (The deadline is compared, not the instant a task awaiting
/// `lost()` runs: on a loaded machine a woken task may run later than
/// another, which says nothing about what the guard knew.)
pub async fn lost_leadership_is_told_before_a_new_leader(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !records_holders(&a).await {
        return;
    }
    let name = unique("election-lost");
    let ttl = Duration::from_secs(2);
    let stalled = LockOptions::new().ttl(ttl).auto_renew(false);
    let old = Election::new(a, name.clone(), "stalls")
        .campaign(&stalled)
        .await
        .expect("the first campaign");
    let deadline = old
        .guard()
        .valid_until()
        .expect("a leadership without renewal has a deadline");
    let next = campaign(
        &Election::new(b, name.clone(), "next"),
        &LockOptions::new().wait_for(Duration::from_secs(30)),
    );
    let (new, granted_at) = next.await.expect("the next candidate");
    assert!(
        deadline <= granted_at,
        "the old leader's lease was still valid to it {:?} after the new one was granted",
        deadline - granted_at
    );
    assert!(old.is_lost(), "the old leader does not know it lost");
    // It knows (is_lost), so its lost() resolves at once; the bound is
    // only against a hang.
    let told = tokio::time::timeout(Duration::from_secs(20), old.lost()).await;
    assert!(told.is_ok(), "the old leader's lost() did not fire");
    assert_eq!(new.identity(), "next");
    new.resign().await.expect("resign");
}

/// A holding taken with `holder(identity)` shows the identity in `status`
/// (for readers and permits, one of theirs) until it ends; elsewhere such a
/// request is refused with `Unsupported`, and a bad identity is
/// `InvalidOptions` everywhere.
pub async fn holder_identities_are_read_back(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let name = unique("holder");
    let ttl = Duration::from_secs(10);
    for bad in ["", "tab\there"] {
        let refused = a
            .try_acquire(&name, &LockOptions::new().ttl(ttl).holder(bad))
            .await;
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "identity {bad:?}: {refused:?}"
        );
    }
    let caps = a.capabilities();
    if !caps.holder {
        let refused = a
            .try_acquire(&name, &LockOptions::new().ttl(ttl).holder("me"))
            .await;
        assert!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "{refused:?}"
        );
        return;
    }
    let writer = a
        .acquire(&name, &LockOptions::new().ttl(ttl).holder("host-a:1"))
        .await
        .expect("a writer with an identity");
    let status = b.status(&name).await.expect("status");
    assert_eq!(status.holder.as_deref(), Some("host-a:1"), "{status:?}");
    writer.release().await.expect("release");
    assert_eq!(b.status(&name).await.expect("status").holder, None);
    // The longest identity, not ASCII, comes back whole; a holder that
    // records none shows none, whoever held before it.
    let longest = format!("{}x", "é".repeat(127));
    assert_eq!(longest.len(), 255);
    let writer = a
        .acquire(&name, &LockOptions::new().ttl(ttl).holder(longest.clone()))
        .await
        .expect("a writer with the longest identity");
    let status = b.status(&name).await.expect("status");
    assert_eq!(
        status.holder.as_deref(),
        Some(longest.as_str()),
        "{status:?}"
    );
    writer.release().await.expect("release");
    let anonymous = a
        .acquire(&name, &LockOptions::new().ttl(ttl))
        .await
        .expect("a writer without an identity");
    let status = b.status(&name).await.expect("status");
    assert!(status.held && status.holder.is_none(), "{status:?}");
    anonymous.release().await.expect("release");
    let mut kinds = Vec::new();
    if caps.shared {
        kinds.push(lockkit_core::LockKind::Shared);
    }
    if caps.semaphore {
        kinds.push(lockkit_core::LockKind::Semaphore { permits: 2 });
    }
    for kind in kinds {
        let opts = |who: &str| {
            let o = LockOptions::new().ttl(ttl).holder(who);
            match kind {
                lockkit_core::LockKind::Semaphore { permits } => o.semaphore(permits),
                _ => o.shared(),
            }
        };
        let first = a.acquire(&name, &opts("reader-1")).await.expect("first");
        let second = b.acquire(&name, &opts("reader-2")).await.expect("second");
        let status = a.status_of(&name, kind).await.expect("status");
        assert!(
            matches!(status.holder.as_deref(), Some("reader-1" | "reader-2")),
            "{kind:?}: {status:?}"
        );
        first.release().await.expect("release");
        second.release().await.expect("release");
    }
}

/// Where a lock changes hands, `status` shows the identity of the holder of
/// the moment: a waiter's, granted at the release; then, in quick turns
/// between two clients, each holder's that took the name as soon as the
/// other released it (a record written while the release before deletes
/// its own), after waits with a deadline as well; none once the last
/// holding ended.
pub async fn holder_identities_follow_the_holding(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    if !a.capabilities().holder {
        // `holder_identities_are_read_back` checks the refusal.
        return;
    }
    let name = unique("holder-follows");
    let with = |who: &str| {
        LockOptions::new()
            .ttl(Duration::from_secs(10))
            .holder(who)
            .wait_for(Duration::from_secs(20))
    };
    let first = a.acquire(&name, &with("first")).await.expect("first");
    let waiter = {
        let (b, name, opts) = (b.clone(), name.clone(), with("second"));
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    // In its wait or not yet there, the waiter holds next.
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.release().await.expect("release");
    let second = waiter
        .await
        .expect("the waiter's task")
        .expect("the waiter gets the lock");
    let status = a.status(&name).await.expect("status");
    assert_eq!(status.holder.as_deref(), Some("second"), "{status:?}");
    second.release().await.expect("release");
    for turn in 0..10 {
        let (client, other) = if turn % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let who = format!("turn-{turn}");
        let guard = client.acquire(&name, &with(&who)).await.expect("a turn");
        let status = other.status(&name).await.expect("status");
        assert_eq!(status.holder.as_deref(), Some(who.as_str()), "{status:?}");
        guard.release().await.expect("release");
    }
    let status = a.status(&name).await.expect("status");
    assert!(!status.held && status.holder.is_none(), "{status:?}");
}
