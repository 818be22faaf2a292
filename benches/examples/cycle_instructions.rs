//! The client's instructions per lock cycle, counted by valgrind's
//! callgrind: a figure that does not move with the machine's load, for the
//! engine's own work (the wall time of a cycle is mostly its round trips,
//! and on a shared machine it drifts by more than that work costs).
//!
//! One kind per run, on a current-thread runtime:
//!
//! * `memory`: `acquire` and `release` on lockkit's in-process backend
//!   (ttl 30 s, `auto_renew(false)`): the engine alone;
//! * `mariadb-raw-named` and `mariadb-named`: the `sql` bench's raw
//!   `GET_LOCK` + `RELEASE_LOCK` floor, and lockkit's `named` mode, against
//!   a MariaDB server the testkit starts;
//! * `sqlite-raw-lease` and `sqlite-lease`: the same for `lease` mode on an
//!   SQLite file.
//!
//! Callgrind counts only inside the function `measured`, which runs the
//! cycles after a warm-up (connections open, statements prepared). The
//! count still holds a few thousand instructions of starting and stopping
//! the runtime, so `scripts/cycle-instructions.sh` runs each kind twice,
//! with two cycle counts, and divides the difference:
//!
//! ```sh
//! scripts/cycle-instructions.sh memory mariadb-raw-named mariadb-named
//! ```
//!
//! Without valgrind the example runs the cycles and prints their wall time.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::time::{Duration, Instant};

use lockkit_benches::{RawMy, RawSqlite, lockkit_cycle};
use lockkit_core::{DistributedLock, LockOptions, MemoryLock, MemoryStore};
use lockkit_testkit::{MariaDbServer, TestServer};
use tokio::runtime::Runtime;

/// The kinds, as named on the command line.
const KINDS: [&str; 5] = [
    "memory",
    "mariadb-raw-named",
    "mariadb-named",
    "sqlite-raw-lease",
    "sqlite-lease",
];
/// Cycles before the counted ones.
const WARM_UP: usize = 200;
const NAME: &str = "instructions";

/// What one kind's cycle runs on.
enum Target {
    Lockkit(Box<dyn DistributedLock>),
    MyRaw(RawMy),
    SqliteRaw(RawSqlite),
}

impl Target {
    async fn cycle(&self, opts: &LockOptions) {
        match self {
            Target::Lockkit(lock) => lockkit_cycle(lock.as_ref(), NAME, opts).await,
            Target::MyRaw(raw) => raw.named_cycle(NAME).await,
            Target::SqliteRaw(raw) => raw.lease_cycle(NAME).await,
        }
    }
}

/// The cycles callgrind counts (`--toggle-collect` names this function).
#[inline(never)]
fn measured(runtime: &Runtime, target: &Target, opts: &LockOptions, cycles: usize) {
    run(runtime, target, opts, cycles);
}

fn run(runtime: &Runtime, target: &Target, opts: &LockOptions, cycles: usize) {
    runtime.block_on(async {
        for _ in 0..cycles {
            target.cycle(opts).await;
        }
    });
}

/// lockkit's client of `url`; its `connect` makes the tables the raw
/// floors use too.
async fn lockkit_sql(url: &str) -> Box<dyn DistributedLock> {
    Box::new(lockkit_sql::connect(url).await.expect("a lockkit client"))
}

async fn target(kind: &str, server: Option<&MariaDbServer>, sqlite: &Path) -> Target {
    let mariadb = || server.expect("a MariaDB server").url();
    let sqlite_url = format!("sqlite://{}?mode=lease", sqlite.display());
    match kind {
        "memory" => Target::Lockkit(Box::new(MemoryLock::with_store(MemoryStore::new()))),
        "mariadb-named" => Target::Lockkit(lockkit_sql(&format!("{}?mode=named", mariadb())).await),
        "mariadb-raw-named" => {
            lockkit_sql(&format!("{}?mode=named", mariadb())).await;
            Target::MyRaw(RawMy::connect(&mariadb()).await)
        }
        "sqlite-lease" => Target::Lockkit(lockkit_sql(&sqlite_url).await),
        "sqlite-raw-lease" => {
            lockkit_sql(&sqlite_url).await;
            Target::SqliteRaw(RawSqlite::connect(sqlite).await)
        }
        other => unreachable!("checked against KINDS: {other}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_default();
    assert!(
        KINDS.contains(&kind.as_str()),
        "usage: cycle_instructions KIND [CYCLES]; KIND is one of {KINDS:?}"
    );
    let cycles: usize = args.next().and_then(|c| c.parse().ok()).unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let dir = tempfile::tempdir().expect("a directory for the SQLite file");
    let sqlite = dir.path().join("locks.db");
    let (server, target) = runtime.block_on(async {
        let server = match kind.starts_with("mariadb") {
            true => Some(MariaDbServer::start().await),
            false => None,
        };
        let target = target(&kind, server.as_ref(), &sqlite).await;
        (server, target)
    });
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .auto_renew(false);
    run(&runtime, &target, &opts, WARM_UP);
    let started = Instant::now();
    measured(&runtime, &target, &opts, cycles);
    let took = started.elapsed();
    println!(
        "{kind}: {cycles} cycles, {:.1} µs each",
        took.as_secs_f64() * 1e6 / cycles as f64
    );
    // The clients go before the server.
    drop(target);
    drop(server);
}
