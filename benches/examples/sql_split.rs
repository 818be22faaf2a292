//! Where an SQL cycle's cost over its raw floor goes: MariaDB `named` and
//! SQLite `lease`, wall time, CPU time and polls per cycle, on both runtime
//! flavours.
//!
//! Interleaved rounds of blocks of cycles of each kind (every kind in every
//! round, in the benches' order: turning, and reversed every other round),
//! each timed with the Linux scheduler's own count of CPU time
//! (`/proc/.../schedstat`):
//!
//! * `mariadb raw named`: `GET_LOCK` drawing its token with `NEXTVAL`, then
//!   `RELEASE_LOCK`, on one sqlx connection (the floor of the `sql` bench);
//! * `mariadb lockkit named`: `acquire` (ttl 30 s, `auto_renew(false)`) and
//!   `release` through `lockkit_sql::connect(…?mode=named)`;
//! * `sqlite raw lease` and `sqlite lockkit lease`: the same for `lease`
//!   mode on an SQLite file (the raw floor is lockkit's own statements sent
//!   by hand, and one byte written to a bell file);
//! * `memory cycle`: the same cycle on lockkit's in-process backend, which
//!   sends nothing: the engine's own work, run back to back;
//! * `mariadb raw named + memory cycle`: one of each, in turn. Against the
//!   raw floor it shows what the engine's work costs when network waits
//!   come between its runs, as they do in a lockkit cycle, rather than
//!   back to back with itself (its code and data no longer in the caches).
//!
//! Columns: the wall time per cycle and its ratio to the raw floor of the
//! same database in the same round (paired); the CPU time of the thread
//! that runs the cycles, of every thread of this process, and of the
//! MariaDB server (all its threads); and how many times the cycle's future
//! was polled. Same polls and the same statements on the wire (see
//! `SHOW GLOBAL STATUS`) with more CPU time on the client's side is work
//! done in the client per poll.
//!
//! ```sh
//! cargo run --release -p lockkit-benches --example sql_split [-- ROUNDS [unpinned]]
//! ```
//!
//! As the `sql` bench, it runs the client on one CPU and the server on
//! another (`lockkit_benches::cpu`); `unpinned` leaves both to the
//! scheduler, and then the MariaDB server's CPU time per cycle differs
//! between the raw and the lockkit connection as their server threads
//! happened to land. Linux only (it reads `/proc`).

#![allow(clippy::print_stdout)]

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lockkit_benches::{RawMy, RawSqlite, flavours, median, round_order};
use lockkit_core::{DistributedLock, LockOptions, MemoryLock, MemoryStore};
use lockkit_sql::SqlLock;
use lockkit_testkit::{FaultControl, MariaDbServer, TestServer};

const CYCLES_PER_BLOCK: usize = 1000;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    MyRaw,
    MyLockkit,
    SqliteRaw,
    SqliteLockkit,
    MyRawAndMemory,
    Memory,
}

const KINDS: [Kind; 6] = [
    Kind::MyRaw,
    Kind::MyLockkit,
    Kind::MyRawAndMemory,
    Kind::SqliteRaw,
    Kind::SqliteLockkit,
    Kind::Memory,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::MyRaw => "mariadb raw named",
            Kind::MyLockkit => "mariadb lockkit named",
            Kind::SqliteRaw => "sqlite raw lease",
            Kind::SqliteLockkit => "sqlite lockkit lease",
            Kind::MyRawAndMemory => "mariadb raw named + memory cycle",
            Kind::Memory => "memory cycle",
        }
    }

    /// The raw floor this kind is compared with.
    fn floor(self) -> Kind {
        match self {
            Kind::SqliteRaw | Kind::SqliteLockkit => Kind::SqliteRaw,
            _ => Kind::MyRaw,
        }
    }

    /// Whether this kind's cycles run on the MariaDB server (its CPU time
    /// is theirs).
    fn on_mariadb(self) -> bool {
        matches!(self, Kind::MyRaw | Kind::MyLockkit | Kind::MyRawAndMemory)
    }
}

/// One block's figures, per cycle.
#[derive(Clone, Copy, Default)]
struct Block {
    wall_us: f64,
    thread_cpu_us: f64,
    process_cpu_us: f64,
    server_cpu_us: f64,
    polls: f64,
}

/// The polls of every future wrapped in [`Counted`].
static POLLS: AtomicU64 = AtomicU64::new(0);

/// A future whose polls are counted in [`POLLS`].
struct Counted<F>(Pin<Box<F>>);

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        POLLS.fetch_add(1, Ordering::Relaxed);
        self.0.as_mut().poll(cx)
    }
}

/// CPU time in ns, from a `schedstat` file (0 if it cannot be read).
fn schedstat(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time in ns of every thread of process `pid` (`self` for this one).
fn process_cpu(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|task| task.ok())
        .map(|task| schedstat(&task.path().join("schedstat")))
        .sum()
}

struct Fixture {
    my_raw: RawMy,
    my_lockkit: SqlLock,
    sqlite_raw: RawSqlite,
    sqlite_lockkit: SqlLock,
    memory: MemoryLock,
    opts: LockOptions,
    server_pid: String,
}

impl Fixture {
    async fn cycle(&self, kind: Kind) {
        match kind {
            Kind::MyRaw => self.my_raw.named_cycle("split-raw").await,
            Kind::SqliteRaw => self.sqlite_raw.lease_cycle("split-raw").await,
            Kind::MyLockkit => self.lockkit_cycle(&self.my_lockkit).await,
            Kind::SqliteLockkit => self.lockkit_cycle(&self.sqlite_lockkit).await,
            Kind::MyRawAndMemory => {
                self.lockkit_cycle(&self.memory).await;
                self.my_raw.named_cycle("split-raw").await;
            }
            Kind::Memory => self.lockkit_cycle(&self.memory).await,
        }
    }

    async fn lockkit_cycle(&self, lockkit: &dyn DistributedLock) {
        lockkit_benches::lockkit_cycle(lockkit, "split-lockkit", &self.opts).await;
    }

    async fn block(&self, kind: Kind) -> Block {
        let thread0 = schedstat(Path::new("/proc/thread-self/schedstat"));
        let process0 = process_cpu("self");
        let server0 = process_cpu(&self.server_pid);
        let polls0 = POLLS.load(Ordering::Relaxed);
        let start = Instant::now();
        for _ in 0..CYCLES_PER_BLOCK {
            Counted(Box::pin(self.cycle(kind))).await;
        }
        let wall = start.elapsed();
        let per_cycle_us = |ns: u64| ns as f64 / CYCLES_PER_BLOCK as f64 / 1e3;
        Block {
            wall_us: per_cycle_us(wall.as_nanos() as u64),
            thread_cpu_us: per_cycle_us(
                schedstat(Path::new("/proc/thread-self/schedstat")) - thread0,
            ),
            process_cpu_us: per_cycle_us(process_cpu("self") - process0),
            server_cpu_us: per_cycle_us(process_cpu(&self.server_pid) - server0),
            polls: (POLLS.load(Ordering::Relaxed) - polls0) as f64 / CYCLES_PER_BLOCK as f64,
        }
    }
}

/// The MariaDB server's process id, from its pid file.
async fn server_pid(server: &MariaDbServer) -> String {
    let file = server
        .sql("SELECT @@pid_file")
        .await
        .expect("the server's pid file");
    let path = file.lines().last().unwrap_or_default().trim().to_owned();
    let path = if Path::new(&path).is_absolute() {
        path.into()
    } else {
        server.data_dir().join(path)
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let pinned = std::env::args().nth(2).as_deref() != Some("unpinned");
    if pinned {
        println!("{}\n", lockkit_benches::cpu::pin_client());
    }
    println!(
        "| runtime | kind | wall per cycle | × raw (paired) | thread CPU | process CPU | MariaDB CPU | polls |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (flavour, runtime) in flavours() {
        let dir = std::env::temp_dir().join(format!("lockkit-sql-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the SQLite file");
        let blocks = runtime.block_on(async {
            let server = MariaDbServer::start().await;
            if pinned {
                lockkit_benches::cpu::pin_server(server.pid().expect("a running server"));
            }
            let url = server.url();
            let sqlite = dir.join("locks.db");
            // lockkit's clients first: their `connect` creates the tables.
            let my_lockkit = lockkit_sql::connect(&format!("{url}?mode=named"))
                .await
                .expect("a lockkit client on MariaDB");
            let sqlite_lockkit =
                lockkit_sql::connect(&format!("sqlite://{}?mode=lease", sqlite.display()))
                    .await
                    .expect("a lockkit client on SQLite");
            let fixture = Fixture {
                my_raw: RawMy::connect(&url).await,
                my_lockkit,
                sqlite_raw: RawSqlite::connect(&sqlite).await,
                sqlite_lockkit,
                memory: MemoryLock::with_store(MemoryStore::new()),
                opts: LockOptions::new()
                    .ttl(Duration::from_secs(30))
                    .auto_renew(false),
                server_pid: server_pid(&server).await,
            };
            // Warm-up: statements prepared, connections open.
            for kind in KINDS {
                fixture.block(kind).await;
            }
            let mut blocks = vec![Vec::with_capacity(rounds); KINDS.len()];
            for round in 0..rounds {
                for step in 0..KINDS.len() {
                    let k = round_order(round, step, KINDS.len());
                    blocks[k].push(fixture.block(KINDS[k]).await);
                }
            }
            drop(fixture);
            drop(server);
            blocks
        });
        let _ = std::fs::remove_dir_all(&dir);
        for (kind, measured) in KINDS.iter().zip(&blocks) {
            let of = |f: fn(&Block) -> f64| median(measured.iter().map(f).collect());
            let floor = KINDS.iter().position(|&k| k == kind.floor());
            let ratio = median(
                measured
                    .iter()
                    .zip(&blocks[floor.expect("every floor is a kind")])
                    .map(|(b, raw)| b.wall_us / raw.wall_us)
                    .collect(),
            );
            let server = if kind.on_mariadb() {
                format!("{:.1} µs", of(|b| b.server_cpu_us))
            } else {
                "—".to_owned()
            };
            let cells = [
                flavour.to_owned(),
                kind.label().to_owned(),
                format!("{:.1} µs", of(|b| b.wall_us)),
                format!("{ratio:.3}"),
                format!("{:.1} µs", of(|b| b.thread_cpu_us)),
                format!("{:.1} µs", of(|b| b.process_cpu_us)),
                server,
                format!("{:.2}", of(|b| b.polls)),
            ];
            println!("| {} |", cells.join(" | "));
        }
    }
    println!(
        "\n{rounds} rounds of {CYCLES_PER_BLOCK} cycles of each kind per runtime; medians over rounds."
    );
}
