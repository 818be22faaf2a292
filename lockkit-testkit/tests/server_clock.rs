//! Servers started with a shiftable wall clock see the offset a test sets,
//! and keep their own otherwise: what the fault suite's `clock-jump`
//! scenario relies on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit_testkit::{
    FaultControl, MariaDbServer, PostgresServer, RedisServer, TestServer, eventually,
};

const JUMP_MS: i64 = 20_000;

fn machine_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// The server's clock as `read` answers it, less the machine's read just
/// before and just after: how far ahead it is, at least and at most.
async fn ahead(read: impl Future<Output = f64>) -> (f64, f64) {
    let before = machine_secs();
    let server = read.await;
    let after = machine_secs();
    (server - after, server - before)
}

/// `secs` lies within the range (a second of slack: whole-second clocks).
fn is_ahead_by((least, most): (f64, f64), secs: f64) -> bool {
    least - 1.0 <= secs && secs <= most + 1.0
}

/// Waits until the server's clock, as `read` answers it, is `secs` ahead of
/// the machine's: the library reads a new offset within a millisecond of
/// the server's next clock read, which may come a little later.
async fn assert_ahead_by<F, Fut>(what: &str, read: F, secs: f64)
where
    F: Fn() -> Fut,
    Fut: Future<Output = f64>,
{
    let moved = eventually(Duration::from_secs(10), || async {
        is_ahead_by(ahead(read()).await, secs)
    })
    .await;
    let (least, most) = ahead(read()).await;
    assert!(
        moved,
        "{what}: the server's clock is {least:.3}..{most:.3} s ahead of the machine's, expected {secs} s"
    );
}

fn last_number(text: &str) -> f64 {
    text.lines()
        .rev()
        .find_map(|line| line.trim().parse().ok())
        .unwrap_or_else(|| panic!("no number in {text:?}"))
}

#[tokio::test]
async fn a_redis_key_expires_at_once_when_the_clock_leaps_past_it() {
    let server = RedisServer::builder().shiftable_clock(true).start().await;
    let clock = server.clock().expect("started with a shiftable clock");
    let time = || async {
        let reply = server.command(&["TIME"]).await.expect("TIME");
        let mut parts = reply
            .split_whitespace()
            .map(|p| p.parse::<f64>().expect("a number"));
        parts.next().expect("seconds") + parts.next().expect("microseconds") / 1e6
    };
    assert_ahead_by("redis", time, 0.0).await;
    let set = server
        .command(&["SET", "k", "v", "PX", "10000"])
        .await
        .unwrap();
    assert_eq!(set.trim(), "OK");
    clock.set_offset_ms(JUMP_MS).unwrap();
    assert_eq!(clock.offset_ms(), JUMP_MS);
    assert_ahead_by("redis", time, 20.0).await;
    // The key's 10 s ran out at the leap.
    assert_eq!(server.command(&["EXISTS", "k"]).await.unwrap().trim(), "0");
    // Kept across a restart, and back when set back.
    server.restart().await;
    assert_ahead_by("redis after a restart", time, 20.0).await;
    clock.set_offset_ms(0).unwrap();
    assert_ahead_by("redis set back", time, 0.0).await;
}

#[tokio::test]
async fn postgres_and_mariadb_read_the_moved_clock() {
    let (pg, my) = tokio::join!(
        PostgresServer::builder().shiftable_clock(true).start(),
        MariaDbServer::builder().shiftable_clock(true).start(),
    );
    let pg_time = || async {
        last_number(
            &pg.psql("SELECT extract(epoch FROM clock_timestamp())")
                .await
                .expect("psql"),
        )
    };
    let my_time = || async {
        last_number(
            &my.sql("SELECT UNIX_TIMESTAMP(NOW(6))")
                .await
                .expect("mariadb"),
        )
    };
    assert_ahead_by("postgres", pg_time, 0.0).await;
    assert_ahead_by("mariadb", my_time, 0.0).await;
    pg.clock()
        .expect("shiftable")
        .set_offset_ms(JUMP_MS)
        .unwrap();
    my.clock()
        .expect("shiftable")
        .set_offset_ms(-JUMP_MS)
        .unwrap();
    assert_ahead_by("postgres", pg_time, 20.0).await;
    assert_ahead_by("mariadb", my_time, -20.0).await;
}

#[tokio::test]
async fn a_server_without_one_has_no_clock_to_move() {
    let server = RedisServer::start().await;
    assert!(server.clock().is_none());
}
