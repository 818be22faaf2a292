#![allow(clippy::print_stdout)]
//! Sixteen processes on one name: the contention that matters in
//! production, where every contender is a client of its own.
//!
//! Per backend, 16 worker processes (this program, started again with
//! `LOCKKIT_PROCESSES_WORKER` set) each open one client and loop for a few
//! seconds: `acquire` of one name (waiting as long as it takes), a critical
//! section of two round trips to *another* Redis server (`GET` of a counter,
//! then `SET` of the value plus one), `release`. The counter's value read in
//! a critical section is its place in the order of grants, so the run is
//! checked (the counter ends at the number of sections, or two holders
//! overlapped) and ordered without trusting any clock. Reported:
//!
//! * critical sections per second;
//! * the straight-back share: of consecutive grants, the share that went
//!   to the process that held the lock just before;
//! * the handoff: from the previous holder's `release` call to the next
//!   holder's `acquire` returning (wall-clock nanoseconds; all processes
//!   read the same clock on one machine), p50 and p99;
//! * server commands per handoff: the lock servers' own counters before
//!   and after the run (on Redis, the commands that scripts call count
//!   too) (Redis `total_commands_processed`, ZooKeeper
//!   `zk_packets_received`, etcd's `grpc_server_handled_total`, PostgreSQL's
//!   committed and rolled-back transactions, MariaDB's `Questions`), over the
//!   number of sections; none for SQLite, which has no server.
//!
//! lockkit runs once more with 4 processes, to show whether the work per
//! handoff grows with the number of waiters, and on Redlock with three
//! instances lockkit and rslock run once more with one instance held by a
//! client that died. On Redis and Redlock `rslock` 0.10 runs the same work in as many
//! processes, and `distributed-lock` 0.2 on PostgreSQL (advisory) and
//! MariaDB (`GET_LOCK`), one after the other on the same servers.
//!
//! Run with `cargo bench -p lockkit-benches --bench processes`
//! (`LOCKKIT_BENCH_BACKENDS=redis,pg-advisory` limits the backends,
//! `LOCKKIT_BENCH_QUICK=1` shortens the runs); the summary is printed and
//! written to `target/lockkit-bench/processes-summary.md`.

use std::fmt::Write as _;
use std::process::Stdio;
use std::time::Duration;

use lockkit_benches::{
    Client, Deployment, LoadKind, Locker, RunMode, Servers, fmt_duration, percentile, runtime,
    save_summary, selected, wall_ns,
};
use lockkit_testkit::{RedisServer, TestServer, info_field};
use redis::AsyncCommands as _;
use serde_json::{Value, json};
use sqlx::Connection as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// The worker's settings, as JSON in this variable.
const WORKER: &str = "LOCKKIT_PROCESSES_WORKER";
/// The counter the critical sections count on (on the section server).
const COUNTER: &str = "bench-processes-counter";
const TTL: Duration = Duration::from_secs(30);
/// How long a worker stays after its last release before it exits.
const LINGER: Duration = Duration::from_millis(500);

fn main() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let mode = RunMode::from_env();
    if mode == RunMode::List {
        return;
    }
    let (processes, run) = match mode {
        RunMode::Bench => (16, Duration::from_secs(6)),
        RunMode::Quick => (16, Duration::from_secs(3)),
        _ => (4, Duration::from_millis(500)),
    };
    // memory:// is one process's store: no contention across processes.
    let backends: Vec<Deployment> = selected()
        .into_iter()
        .filter(|d| *d != Deployment::Memory)
        .collect();
    let rows = runtime().block_on(async {
        let servers = Servers::start(&backends).await;
        let section = RedisServer::start().await;
        let mut rows = Vec::new();
        for &backend in &backends {
            for (client, params, start) in libraries(backend) {
                // lockkit also with a quarter of the processes: whether the
                // server's work per handoff grows with the waiters.
                // (A test-mode run: lockkit alone, once per backend.)
                let counts = match (client, start, mode) {
                    (Client::Lockkit, Start::Clean, RunMode::Test) => vec![processes],
                    (_, _, RunMode::Test) => continue,
                    (Client::Lockkit, Start::Clean, _) => vec![processes / 4, processes],
                    _ => vec![processes],
                };
                for n in counts {
                    let library = (client, params, start);
                    let row = contend(&servers, backend, library, &section, n, run).await;
                    println!("{}", row.line());
                    rows.push(row);
                }
            }
        }
        rows
    });
    save_summary(mode, "processes", &summary(mode, processes, run, &rows));
}

/// Extra URL parameters of a lockkit run.
type Params = &'static [(&'static str, &'static str)];
const NONE: Params = &[];
const FAIR: Params = &[("fair", "true")];

/// What the lock servers hold of the run's lock when a run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// Nothing.
    Clean,
    /// On one instance of a Redlock deployment, a lease of a client that
    /// died, which outlives the run: every grant needs all the other
    /// instances.
    DeadInstance,
}

impl Start {
    /// What a report adds to the backend's label for a run that starts so.
    fn label(self) -> &'static str {
        match self {
            Start::Clean => "",
            Start::DeadInstance => ", one instance held by a dead client",
        }
    }
}

/// A run's library, lockkit's URL parameters, and how the run starts.
type Library = (Client, Params, Start);

/// Which libraries run on `backend`: lockkit everywhere (on Redis also as a
/// fair lock), the peers where they have a lock of that kind; on Redlock
/// with three instances, both once more with one instance held by a dead
/// client.
fn libraries(backend: Deployment) -> Vec<Library> {
    use Deployment::*;
    let mut libraries = vec![(Client::Lockkit, NONE, Start::Clean)];
    match backend {
        Redis => libraries.extend([
            (Client::Lockkit, FAIR, Start::Clean),
            (Client::Rslock, NONE, Start::Clean),
        ]),
        Redlock3 => libraries.extend([
            (Client::Rslock, NONE, Start::Clean),
            (Client::Lockkit, NONE, Start::DeadInstance),
            (Client::Rslock, NONE, Start::DeadInstance),
        ]),
        Redlock5 => libraries.push((Client::Rslock, NONE, Start::Clean)),
        PgAdvisory | MariaDbNamed => {
            libraries.push((Client::DistributedLock, NONE, Start::Clean));
        }
        _ => {}
    }
    libraries
}

/// The keys of the run's lock (the load generator's key 0) that a dead
/// client's lease holds, for lockkit and for rslock.
const DEAD_KEYS: [&str; 2] = ["lockkit:lockkit-load/0", "lockkit-load-rslock:0"];

/// One worker's critical sections: (place in the order of grants, the
/// wall-clock ns at which its acquire returned, at which its release was
/// called).
type Section = (u64, u64, u64);

/// One run of `processes` workers of `client` on `backend`.
async fn contend(
    servers: &Servers,
    backend: Deployment,
    library: Library,
    section: &RedisServer,
    processes: usize,
    run: Duration,
) -> Row {
    let (client, params, start) = library;
    section
        .command(&["SET", COUNTER, "0"])
        .await
        .expect("reset the counter");
    let dead =
        (start == Start::DeadInstance).then(|| &servers.redis()[backend.redis_masters() - 1]);
    if let Some(instance) = dead {
        for key in DEAD_KEYS {
            let set = instance
                .command(&["SET", key, "a-client-that-died", "PX", "600000"])
                .await;
            assert_eq!(set.as_deref().ok(), Some("OK"), "hold {key}: {set:?}");
        }
    }
    let hosts: Vec<String> = servers
        .addrs(backend)
        .iter()
        .map(ToString::to_string)
        .collect();
    let extra: Vec<(&str, String)> = params
        .iter()
        .map(|&(key, value)| (key, value.to_owned()))
        .collect();
    let url = servers.url_with(backend, &hosts, &extra);
    let before = commands(servers, backend).await;
    // Every worker starts at the same moment, after its connections are up.
    // (Sixteen processes open their connections in well under a second.)
    let start_at = wall_ns()
        + if processes > 4 {
            3_000_000_000
        } else {
            1_500_000_000
        };
    let spec = json!({
        "url": url,
        "client": client.name(),
        "section": section.url(),
        "start_at": start_at,
        "end_at": start_at + run.as_nanos() as u64,
    })
    .to_string();
    let exe = std::env::current_exe().expect("this program's path");
    let children: Vec<_> = (0..processes)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .env(WORKER, &spec)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let mut sections: Vec<(usize, Section)> = Vec::new();
    let mut errors = Vec::new();
    for (process, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().await.expect("a worker's output");
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<Value>(text.trim()) {
            Ok(value) if out.status.success() => {
                for s in value["sections"].as_array().into_iter().flatten() {
                    let n = |i: usize| s[i].as_u64().unwrap_or(0);
                    sections.push((process, (n(0), n(1), n(2))));
                }
                if let Some(e) = value["error"].as_str() {
                    errors.push(e.to_owned());
                }
            }
            _ => errors.push(format!("worker {process} failed: {} {text}", out.status)),
        }
    }
    // PostgreSQL counts a session's transactions when its backend exits
    // (or within a second); the others count as they go.
    if matches!(
        backend,
        Deployment::PgLease | Deployment::PgRow | Deployment::PgAdvisory
    ) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let after = commands(servers, backend).await;
    if let Some(instance) = dead {
        let mut del = vec!["DEL"];
        del.extend(DEAD_KEYS);
        instance
            .command(&del)
            .await
            .expect("end the dead client's leases");
    }
    let counted: u64 = section
        .command(&["GET", COUNTER])
        .await
        .expect("read the counter")
        .trim()
        .parse()
        .unwrap_or(0);
    Row::of(
        backend,
        library,
        processes,
        run,
        sections,
        counted,
        before.zip(after).map(|(b, a)| a.saturating_sub(b)),
        errors,
    )
}

/// What a worker does: see the module's documentation.
fn worker(spec: &str) {
    let spec: Value = serde_json::from_str(spec).expect("the worker's settings");
    let field = |key: &str| spec[key].as_str().unwrap_or_default().to_owned();
    let (url, section) = (field("url"), field("section"));
    let client: Client = field("client").parse().expect("a client");
    let (start_at, end_at) = (
        spec["start_at"].as_u64().unwrap_or(0),
        spec["end_at"].as_u64().unwrap_or(0),
    );
    let out = runtime().block_on(async move {
        let locker = match Locker::connect(client, &url).await {
            Ok(Some(locker)) => locker,
            other => return json!({"sections": [], "error": format!("connect: {other:?}")}),
        };
        let redis = redis::Client::open(section.as_str()).expect("the section server's URL");
        let mut conn = redis
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the section server");
        let now = wall_ns();
        tokio::time::sleep(Duration::from_nanos(start_at.saturating_sub(now))).await;
        let deadline = Instant::now() + Duration::from_nanos(end_at.saturating_sub(wall_ns()));
        let mut sections = Vec::new();
        let mut error = None;
        // The lock is the load generator's key 0 (`lockkit-load/0`).
        while Instant::now() < deadline {
            let held = match locker
                .acquire(
                    0,
                    LoadKind::Exclusive,
                    TTL,
                    deadline + Duration::from_secs(10),
                )
                .await
            {
                Ok(Some((held, _))) => held,
                Ok(None) => break,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            };
            let acquired = wall_ns();
            let seen: Option<u64> = conn.get(COUNTER).await.expect("GET the counter");
            let place = seen.unwrap_or(0);
            let () = conn.set(COUNTER, place + 1).await.expect("SET the counter");
            let released = wall_ns();
            if let Err(e) = locker.release(held).await {
                error = Some(e);
                break;
            }
            sections.push(json!([place, acquired, released]));
        }
        // Redlock finishes a slow instance's part of the last release in
        // the background: exiting at once would leave that instance's grant
        // to expire into the next run.
        tokio::time::sleep(LINGER).await;
        json!({"sections": sections, "error": error})
    });
    println!("{out}");
}

/// The lock servers' count of commands (see the module's documentation);
/// `None` for SQLite.
async fn commands(servers: &Servers, backend: Deployment) -> Option<u64> {
    use Deployment::*;
    match backend {
        Redis | Redlock3 | Redlock5 => {
            let mut sum = 0;
            for server in &servers.redis()[..backend.redis_masters()] {
                let info = server.command(&["INFO", "stats"]).await.ok()?;
                sum += info_field(&info, "total_commands_processed")?
                    .trim()
                    .parse::<u64>()
                    .ok()?;
            }
            Some(sum)
        }
        Zk => {
            // `name<TAB>value` lines.
            let mntr = servers.zk().four_letter("mntr").await.ok()?;
            mntr.lines()
                .find_map(|line| line.strip_prefix("zk_packets_received\t"))?
                .trim()
                .parse()
                .ok()
        }
        Etcd => etcd_requests(&servers.etcd().endpoint()).await,
        PgLease | PgRow | PgAdvisory => {
            let mut conn = sqlx::PgConnection::connect(&servers.pg().url())
                .await
                .ok()?;
            let n: i64 = sqlx::query_scalar(
                "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                 WHERE datname = current_database()",
            )
            .fetch_one(&mut conn)
            .await
            .ok()?;
            Some(n as u64)
        }
        MariaDbLease | MariaDbRow | MariaDbNamed => {
            let mut conn = sqlx::MySqlConnection::connect(&servers.my().url())
                .await
                .ok()?;
            let (_, n): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                .fetch_one(&mut conn)
                .await
                .ok()?;
            n.parse().ok()
        }
        _ => None,
    }
}

/// The sum of etcd's `grpc_server_handled_total` (every gRPC request it
/// answered), from its `/metrics` page.
async fn etcd_requests(endpoint: &str) -> Option<u64> {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut page = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut page))
        .await
        .ok()?
        .ok()?;
    let sum: f64 = page
        .lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Some(sum as u64)
}

/// One run's figures.
struct Row {
    backend: Deployment,
    /// The library, lockkit's URL parameters, how the run started.
    client: Library,
    processes: usize,
    sections: usize,
    per_second: f64,
    straight_back: Option<f64>,
    handoff_p50: Option<Duration>,
    handoff_p99: Option<Duration>,
    commands_per_handoff: Option<f64>,
    /// Whether the counter and the sections agree (no two holders at once).
    books: bool,
    errors: Vec<String>,
}

impl Row {
    #[allow(clippy::too_many_arguments)]
    fn of(
        backend: Deployment,
        client: Library,
        processes: usize,
        run: Duration,
        mut sections: Vec<(usize, Section)>,
        counted: u64,
        commands: Option<u64>,
        errors: Vec<String>,
    ) -> Row {
        sections.sort_by_key(|(_, (place, _, _))| *place);
        let places_unique = sections.windows(2).all(|w| w[0].1.0 + 1 == w[1].1.0);
        let books = counted == sections.len() as u64
            && places_unique
            && sections.first().is_none_or(|(_, s)| s.0 == 0);
        let pairs = sections.len().saturating_sub(1);
        let straight = sections.windows(2).filter(|w| w[0].0 == w[1].0).count();
        let mut handoffs: Vec<Duration> = sections
            .windows(2)
            .filter(|w| w[0].0 != w[1].0)
            .map(|w| Duration::from_nanos(w[1].1.1.saturating_sub(w[0].1.2)))
            .collect();
        handoffs.sort();
        Row {
            backend,
            client,
            processes,
            sections: sections.len(),
            per_second: sections.len() as f64 / run.as_secs_f64(),
            straight_back: (pairs > 0).then(|| straight as f64 / pairs as f64),
            handoff_p50: percentile(&handoffs, 50.0),
            handoff_p99: percentile(&handoffs, 99.0),
            commands_per_handoff: commands
                .filter(|_| pairs > 0)
                .map(|n| n as f64 / sections.len() as f64),
            books,
            errors,
        }
    }

    fn line(&self) -> String {
        let opt = |d: Option<Duration>| d.map_or("—".into(), fmt_duration);
        format!(
            "| {}{} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
            self.backend.label(),
            self.client.2.label(),
            match self.client {
                (client, [], _) => client.library().to_owned(),
                (client, params, _) => {
                    let params: Vec<String> =
                        params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    format!("{} (`{}`)", client.library(), params.join("&"))
                }
            },
            self.processes,
            self.sections,
            self.per_second,
            self.straight_back
                .map_or("—".into(), |s| format!("{:.0} %", s * 100.0)),
            opt(self.handoff_p50),
            opt(self.handoff_p99),
            self.commands_per_handoff
                .map_or("—".into(), |c| format!("{c:.1}")),
            match (self.books, self.errors.first()) {
                (true, None) => "OK".to_owned(),
                (true, Some(e)) => format!("OK; error: {}", e.replace('|', "/")),
                (false, _) => "**overlap or lost section**".to_owned(),
            },
        )
    }
}

fn summary(mode: RunMode, processes: usize, run: Duration, rows: &[Row]) -> String {
    let mut out = format!(
        "## {processes} processes on one name ({} run, {} s per library, backend and process count)\n\n\
         Each process one client, looping `acquire` → two round trips to another Redis server → `release`. \
         Straight back: of consecutive grants, the share that went to the process that had just released. \
         Handoff: from the holder's `release` call to the next holder's `acquire` returning. \
         Commands per handoff: the lock servers' own count over the run ÷ critical sections (on Redis the commands that scripts call count too; lockkit also runs with {quarter} processes, to show whether that count grows with the waiters). \
         One instance held by a dead client: a lease on the lock's key on one of the three instances outlives the run, so every grant needs both others. \
         Books: the counter the sections advanced agrees with the sections (no two holders at once).\n\n\
         | backend | library | processes | critical sections | per second | straight back | handoff p50 | handoff p99 | server commands per handoff | books |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label(),
        run.as_secs(),
        quarter = processes / 4,
    );
    for row in rows {
        let _ = writeln!(out, "{}", row.line());
    }
    out.push_str(&targets(rows, processes));
    out
}

/// Most straight-back grants lockkit's default mode may give.
const STRAIGHT_BACK_MAX: f64 = 0.25;
/// How much the server's commands per handoff may grow when the waiters
/// are four times as many, on the backends whose count must be bounded.
const COMMANDS_GROWTH_MAX: f64 = 1.25;

/// Whether lockkit's server commands per handoff must not grow with the
/// waiters on `backend`.
fn commands_bounded(backend: Deployment) -> bool {
    use Deployment::*;
    matches!(
        backend,
        Redis | Redlock3 | Redlock5 | Etcd | EtcdCluster | PgLease | MariaDbLease | SqliteLease
    )
}

/// The targets of lockkit's default mode, each judged on this run's rows:
/// at most a quarter of the grants straight back, server commands per
/// handoff that do not grow with the waiters (where they must not), and
/// at least the throughput of every peer that ran on the same backend.
fn targets(rows: &[Row], processes: usize) -> String {
    let lockkit = |backend: Deployment, start: Start, n: usize| {
        rows.iter().find(|r| {
            r.backend == backend && r.client == (Client::Lockkit, NONE, start) && r.processes == n
        })
    };
    let mut out = format!(
        "\n### Targets of lockkit's default mode, judged on this run\n\n\
         Straight back: at most {:.0} % of the grants at {processes} processes. \
         Commands per handoff (Redis, Redlock, etcd and the SQL lease modes): with {processes} processes \
         at most {COMMANDS_GROWTH_MAX} × the figure with {} (four times the waiters). \
         Throughput: at least that of every peer that ran on the same backend, with as many processes.\n\n\
         | backend | target | lockkit | yardstick | verdict |\n\
         | --- | --- | --- | --- | --- |\n",
        STRAIGHT_BACK_MAX * 100.0,
        processes / 4,
    );
    let verdict = |pass: bool| if pass { "PASS" } else { "MISS" };
    for row in rows {
        let (client, params, start) = row.client;
        let label = row.backend.label();
        if client == Client::Lockkit && params.is_empty() && start == Start::Clean {
            if row.processes == processes
                && let Some(share) = row.straight_back
            {
                let _ = writeln!(
                    out,
                    "| {label} | straight back | {:.0} % | ≤ {:.0} % | {} |",
                    share * 100.0,
                    STRAIGHT_BACK_MAX * 100.0,
                    verdict(share <= STRAIGHT_BACK_MAX),
                );
            }
            if row.processes == processes && commands_bounded(row.backend) {
                let fewer = lockkit(row.backend, Start::Clean, processes / 4)
                    .and_then(|r| r.commands_per_handoff);
                let line = match (row.commands_per_handoff, fewer) {
                    (Some(many), Some(few)) => format!(
                        "{many:.1} | {few:.1} with {} processes (× {:.2}) | {}",
                        processes / 4,
                        many / few,
                        verdict(many <= few * COMMANDS_GROWTH_MAX),
                    ),
                    (Some(many), None) => {
                        format!("{many:.1} | — | no run with {} processes", processes / 4)
                    }
                    (None, _) => "— | — | no server to count".to_owned(),
                };
                let _ = writeln!(out, "| {label} | commands per handoff | {line} |");
            }
        } else if client != Client::Lockkit
            && let Some(ours) = lockkit(row.backend, start, row.processes)
        {
            let _ = writeln!(
                out,
                "| {label}{} | throughput | {:.0}/s | {:.0}/s ({}) | {} |",
                start.label(),
                ours.per_second,
                row.per_second,
                client.library(),
                verdict(ours.per_second >= row.per_second),
            );
        }
    }
    out
}
