//! Where the single-Redis cycle's cost over its raw floor goes: wall time,
//! and the CPU time of the client's thread and of the Redis server, per
//! cycle, on a current-thread runtime.
//!
//! Interleaved rounds of blocks of cycles of each kind (every kind in every
//! round), each timed with the Linux scheduler's own count of CPU time
//! (`/proc/.../schedstat`) of this thread and of the server's main thread:
//!
//! * `raw`: `SET k tok NX PX 30000`, then an `EVALSHA` compare-and-delete
//!   (the floor of the `cycle_overhead` bench);
//! * `raw + timeouts`: the same, each command inside `tokio::time::timeout`
//!   (lockkit bounds every call);
//! * `Lua SET NX`: the acquire as a minimal script (`EVALSHA` running `SET
//!   NX PX`), the same release;
//! * `lockkit`: `try_acquire` (ttl 30 s, `auto_renew(false)`) and `release`
//!   through `lockkit::connect`, fencing token and release notification
//!   included;
//! * `lockkit, fencing=false`: the same without the token (the cycle the
//!   `cycle_overhead` bench judges).
//!
//! Run it as it is, and pinned to one core (`taskset -c 0`), where the
//! server and the client take turns on one CPU and the wall time is their
//! CPU time: the CPU columns then say which side each kind's extra cost
//! is spent on.
//!
//! ```sh
//! cargo run --release -p lockkit-benches --example cycle_split [-- ROUNDS]
//! taskset -c 0 target/release/examples/cycle_split
//! ```
//!
//! Linux only (it reads `/proc`).

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use lockkit_benches::{Deployment, RAW_RELEASE, Servers};
use lockkit_core::{DistributedLock, LockOptions};
use redis::aio::MultiplexedConnection;

const TTL_MS: u64 = 30_000;
const CYCLES_PER_BLOCK: usize = 300;
const MIN_SET: &str =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0";

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Raw,
    RawTimeouts,
    LuaSet,
    Lockkit,
    Tokenless,
}

const KINDS: [Kind; 5] = [
    Kind::Raw,
    Kind::RawTimeouts,
    Kind::LuaSet,
    Kind::Lockkit,
    Kind::Tokenless,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Raw => "raw",
            Kind::RawTimeouts => "raw + timeouts",
            Kind::LuaSet => "Lua SET NX",
            Kind::Lockkit => "lockkit",
            Kind::Tokenless => "lockkit, fencing=false",
        }
    }
}

/// One block's figures, per cycle.
#[derive(Clone, Copy, Default)]
struct Block {
    wall_us: f64,
    client_cpu_us: f64,
    server_cpu_us: f64,
    switches: f64,
}

/// CPU time in ns and timeslices run, from a `schedstat` file.
fn schedstat(path: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse::<u64>().unwrap_or(0));
    let cpu = fields.next().unwrap_or(0);
    let slices = fields.nth(1).unwrap_or(0);
    (cpu, slices)
}

struct Fixture {
    conn: MultiplexedConnection,
    release: redis::Script,
    min_set: redis::Script,
    locks: std::sync::Arc<dyn DistributedLock>,
    tokenless: std::sync::Arc<dyn DistributedLock>,
    opts: LockOptions,
    server_stat: String,
}

impl Fixture {
    async fn cycle(&mut self, kind: Kind, i: usize) {
        let token = format!("t{i}");
        let key = match kind {
            Kind::Raw => "split:raw",
            Kind::RawTimeouts => "split:timeouts",
            Kind::LuaSet => "split:lua",
            Kind::Lockkit | Kind::Tokenless => {
                let (locks, name) = if kind == Kind::Lockkit {
                    (&self.locks, "split:lockkit")
                } else {
                    (&self.tokenless, "split:tokenless")
                };
                let guard = locks
                    .try_acquire(name, &self.opts)
                    .await
                    .expect("try_acquire")
                    .expect("an uncontended lock");
                guard.release().await.expect("release");
                return;
            }
        };
        let limit = Duration::from_secs(5);
        let acquired: i64 = if kind == Kind::LuaSet {
            let mut call = self.min_set.key(key);
            call.arg(&token).arg(TTL_MS);
            call.invoke_async(&mut self.conn).await.expect("Lua SET NX")
        } else {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(&token).arg("NX").arg("PX").arg(TTL_MS);
            let reply = set.query_async::<Option<String>>(&mut self.conn);
            let reply = if kind == Kind::RawTimeouts {
                tokio::time::timeout(limit, reply).await.expect("in time")
            } else {
                reply.await
            };
            i64::from(reply.expect("SET NX").is_some())
        };
        assert_eq!(acquired, 1, "{key} was free");
        let mut release = self.release.key(key);
        release.arg(&token);
        let released = release.invoke_async::<i64>(&mut self.conn);
        let released = if kind == Kind::RawTimeouts {
            tokio::time::timeout(limit, released)
                .await
                .expect("in time")
        } else {
            released.await
        };
        assert_eq!(released.expect("compare-and-delete"), 1);
    }

    async fn block(&mut self, kind: Kind) -> Block {
        let (client0, slices0) = schedstat("/proc/thread-self/schedstat");
        let (server0, _) = schedstat(&self.server_stat);
        let start = Instant::now();
        for i in 0..CYCLES_PER_BLOCK {
            self.cycle(kind, i).await;
        }
        let wall = start.elapsed();
        let (client1, slices1) = schedstat("/proc/thread-self/schedstat");
        let (server1, _) = schedstat(&self.server_stat);
        let per_cycle_us = |ns: u64| ns as f64 / CYCLES_PER_BLOCK as f64 / 1e3;
        Block {
            wall_us: wall.as_nanos() as f64 / CYCLES_PER_BLOCK as f64 / 1e3,
            client_cpu_us: per_cycle_us(client1 - client0),
            server_cpu_us: per_cycle_us(server1 - server0),
            switches: (slices1 - slices0) as f64 / CYCLES_PER_BLOCK as f64,
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let servers = rt.block_on(Servers::start(&[Deployment::Redis]));
    let addr = servers.addrs(Deployment::Redis)[0];
    let url = servers.url(Deployment::Redis);
    let blocks = rt.block_on(async move {
        let client = redis::Client::open(format!("redis://{addr}")).expect("a redis URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("a redis connection");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .expect("the server's process id")
            .trim()
            .to_owned();
        let mut fixture = Fixture {
            conn,
            release: redis::Script::new(RAW_RELEASE),
            min_set: redis::Script::new(MIN_SET),
            locks: lockkit::connect(&url).await.expect("a lockkit client"),
            tokenless: lockkit::connect(&format!("{url}?fencing=false"))
                .await
                .expect("a lockkit client without tokens"),
            opts: LockOptions::new()
                .ttl(Duration::from_millis(TTL_MS))
                .auto_renew(false),
            server_stat: format!("/proc/{pid}/task/{pid}/schedstat"),
        };
        // Warm-up: scripts loaded, connections open.
        for kind in KINDS {
            fixture.block(kind).await;
        }
        let mut blocks: Vec<Vec<Block>> = vec![Vec::new(); KINDS.len()];
        for round in 0..rounds {
            for k in 0..KINDS.len() {
                // The order rotates from round to round.
                let k = (k + round) % KINDS.len();
                blocks[k].push(fixture.block(KINDS[k]).await);
            }
        }
        blocks
    });
    println!(
        "| kind | wall per cycle | × raw (paired) | client CPU | server CPU | client timeslices |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (kind, measured) in KINDS.iter().zip(&blocks) {
        let of = |f: fn(&Block) -> f64| median(measured.iter().map(f).collect());
        let ratio = median(
            measured
                .iter()
                .zip(&blocks[0])
                .map(|(b, raw)| b.wall_us / raw.wall_us)
                .collect(),
        );
        println!(
            "| {} | {:.1} µs | {ratio:.3} | {:.1} µs | {:.1} µs | {:.2} |",
            kind.label(),
            of(|b| b.wall_us),
            of(|b| b.client_cpu_us),
            of(|b| b.server_cpu_us),
            of(|b| b.switches),
        );
    }
    println!(
        "\nMedians over {rounds} interleaved rounds of {CYCLES_PER_BLOCK} cycles of each kind; CPU time per cycle from /proc/.../schedstat."
    );
}
