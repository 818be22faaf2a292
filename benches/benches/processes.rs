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
//!   number of sections; none for SQLite, which has no server;
//! * CPU time per section: the workers' loops (each worker reads its
//!   threads' run time when its loop starts and ends), and the lock
//!   servers' processes (`/proc/<pid>/stat`), over the number of sections.
//!
//! A library's time on a backend and runtime is split into five rounds,
//! and each round runs every library of that backend and runtime in turn
//! (the order turned and reversed every other round), so that a drift of
//! the machine falls on all of them; the throughput targets are judged on
//! the median over rounds of lockkit's throughput ÷ the peer's in the same
//! round.
//!
//! Every run is made with the workers on a multi-thread tokio runtime and
//! again on a current-thread one. lockkit runs once more with 4 processes
//! (multi-thread), to show whether the work per handoff grows with the
//! number of waiters, and on Redlock with three instances lockkit and
//! rslock run once more with one instance held by a client that died
//! (multi-thread). On Redis and Redlock lockkit also runs as a barging lock
//! (`barging=true`, on Redis also without fencing tokens), whose waiters ask
//! on the backoff, in no line; on PostgreSQL (advisory) and MariaDB
//! (`GET_LOCK`) also without fencing tokens (`fencing=false`), which
//! `distributed-lock` does not draw either. On Redis and Redlock `rslock` 0.10 runs the same work in
//! as many processes, and `distributed-lock` 0.2 on PostgreSQL (advisory)
//! and MariaDB (`GET_LOCK`), one after the other on the same servers. On
//! Redis a ring of processes without a lock, each handing over to the next
//! one when its section is done, measures the floors of a handoff between
//! processes: by one `PUBLISH`, by a release script then a script that
//! takes the releasing process's place in line, and by one script that
//! releases and keeps that place, as lockkit's default mode does (see
//! [`Handoff`]), each written by hand.
//!
//! The workers run on one CPU and the servers on the other
//! ([`lockkit_benches::cpu`]), as if each ran on a host of its own:
//! left to the scheduler, a holder that kept the lock looped against a
//! server on its own CPU at a speed no other placement gave. Every CPU
//! also runs a busy loop at the lowest priority
//! ([`lockkit_benches::cpu::keep_awake`]): an idle vCPU halts, and the
//! library that left the CPUs idle more often paid for it in the wake-ups
//! of its critical sections.
//!
//! Run with `cargo bench -p lockkit-benches --bench processes`
//! (`LOCKKIT_BENCH_BACKENDS=redis,pg-advisory` limits the backends,
//! `LOCKKIT_BENCH_QUICK=1` shortens the runs); the summary is printed and
//! written to `target/lockkit-bench/processes-summary.md`.

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use lockkit_benches::{
    Client, Deployment, LoadKind, Locker, RunMode, Servers, fmt_duration, median, percentile,
    round_order, runtime, runtime_of, save_summary, selected, wall_ns,
};
use lockkit_testkit::{FaultControl, RedisServer, TestServer, info_field};
use redis::AsyncCommands as _;
use serde_json::{Value, json};
use sqlx::Connection as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// The worker's settings, as JSON in this variable.
const WORKER: &str = "LOCKKIT_PROCESSES_WORKER";
/// The worker's place among the run's processes (0, 1, …), in this variable.
const INDEX: &str = "LOCKKIT_PROCESSES_INDEX";
/// The runtime flavours every run is made on, multi-thread first.
const FLAVOURS: [Flavour; 2] = [Flavour::Multi, Flavour::Current];
/// The channels of the handoff ring (see [`Entrant::Ring`]): this, then
/// the worker's index.
const RING: &str = "bench-processes-ring:";
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
    // Each library's time on a backend and runtime, split into rounds
    // that take every library in turn (see `round_order`).
    let (processes, run, rounds) = match mode {
        RunMode::Bench => (16, Duration::from_secs(6), 5),
        RunMode::Quick => (16, Duration::from_secs(3), 5),
        _ => (4, Duration::from_millis(500), 1),
    };
    // memory:// is one process's store: no contention across processes.
    let backends: Vec<Deployment> = selected()
        .into_iter()
        .filter(|d| *d != Deployment::Memory)
        .collect();
    let runtime = runtime();
    // The servers start on every CPU, then move to a CPU of their own; this
    // process pins itself only then (its threads, and the workers it starts
    // later, run on its CPU). Started on this process's one CPU, they took
    // turns there: a ZooKeeper, a MariaDB and a PostgreSQL server starting
    // together on one CPU left PostgreSQL unready after 30 s (a CI run).
    let (servers, section) =
        runtime.block_on(async { (Servers::start(&backends).await, RedisServer::start().await) });
    let lock_servers = backends
        .iter()
        .flat_map(|&backend| lock_server_pids(&servers, backend).unwrap_or_default());
    for pid in lock_servers.chain([section.pid()]) {
        lockkit_benches::cpu::pin_server(pid.expect("a running server"));
    }
    let pinned = lockkit_benches::cpu::pin_client();
    let (awake, kept_awake) = lockkit_benches::cpu::keep_awake();
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        for &backend in &backends {
            for flavour in FLAVOURS {
                let runs: Vec<(Library, usize)> = libraries(backend)
                    .into_iter()
                    .flat_map(|library| {
                        counts(backend, library, flavour, mode, processes)
                            .into_iter()
                            .map(move |n| (library, n))
                    })
                    .collect();
                let mut merged: Vec<Option<Row>> = runs.iter().map(|_| None).collect();
                let part = run / rounds as u32;
                for round in 0..rounds {
                    for step in 0..runs.len() {
                        let i = round_order(round, step, runs.len());
                        let (library, n) = runs[i];
                        let row =
                            contend(&servers, backend, library, flavour, &section, n, part).await;
                        match &mut merged[i] {
                            Some(sum) => sum.absorb(row),
                            empty => *empty = Some(row),
                        }
                    }
                }
                for row in merged.into_iter().flatten() {
                    println!("{}", row.line());
                    rows.push(row);
                }
            }
        }
        rows
    });
    save_summary(
        mode,
        "processes",
        &summary(
            mode,
            processes,
            run,
            rounds,
            &format!("{pinned} {kept_awake}"),
            &rows,
        ),
    );
    drop(awake);
}

/// The process counts `library` runs with on `flavour`: every library with
/// `processes`; lockkit's default mode on the multi-thread runtime also with
/// a quarter of them (whether the server's work per handoff grows with the
/// waiters). The fair mode and the dead instance run on the multi-thread
/// runtime only; the barging mode on both, as the peers. A test-mode run: lockkit alone, once per backend, and on
/// Redis also on the current-thread runtime and the handoff ring.
fn counts(
    backend: Deployment,
    library: Library,
    flavour: Flavour,
    mode: RunMode,
    processes: usize,
) -> Vec<usize> {
    let lockkit = (Entrant::Client(Client::Lockkit), NONE, Start::Clean);
    let multi = flavour == Flavour::Multi;
    match mode {
        RunMode::Test if library == lockkit && (multi || backend == Deployment::Redis) => {
            vec![processes]
        }
        RunMode::Test if library.0.is_ring() && multi => vec![processes],
        RunMode::Test => vec![],
        _ if library == lockkit && multi => vec![processes / 4, processes],
        // Barging is judged against the peers on both runtimes.
        _ if !multi && (library.1 == FAIR || library.2 != Start::Clean) => vec![],
        _ => vec![processes],
    }
}

/// The tokio runtime a worker runs on: the multi-thread one of the other
/// benches (a worker per core), or a current-thread one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavour {
    Multi,
    Current,
}

impl Flavour {
    fn name(self) -> &'static str {
        match self {
            Flavour::Multi => "multi-thread",
            Flavour::Current => "current-thread",
        }
    }

    fn runtime(self) -> tokio::runtime::Runtime {
        match self {
            Flavour::Multi => runtime(),
            Flavour::Current => runtime_of("current_thread"),
        }
    }
}

impl std::str::FromStr for Flavour {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        FLAVOURS
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| format!("no runtime flavour {name:?}"))
    }
}

/// Who contends in a run: a lock library, or a floor of a handoff
/// between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entrant {
    Client(Client),
    /// No lock: the processes pass the critical section round a ring, each
    /// waiting for a message on a channel of its own on the lock's Redis
    /// server and, when its section is done, handing over to the next one
    /// as the [`Handoff`] says, by hand through redis-rs.
    Ring(Handoff),
}

/// What a process of the ring sends the lock's server when its section is
/// done (see [`Entrant::Ring`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handoff {
    /// One `PUBLISH` to the next process's channel: what any lock that
    /// hands over between processes through that server pays at least
    /// (the `PUBLISH`, its delivery, the next process's wake-up).
    Publish,
    /// A handoff in two scripts, with nothing of a client: one that runs
    /// the commands of the default mode's release on its path that grants
    /// the head of the line, its `PUBLISH` to the next process included
    /// ([`RING_RELEASE`]); then, as a releasing process asks again at
    /// once, a second script that runs the commands of a refused waiting
    /// acquire taking its place in line ([`RING_PLACE`]): lockkit's
    /// default mode before its release kept the place.
    ReleaseThenPlace,
    /// One script that does both: the release's commands, then the
    /// releasing process's place in line ([`RING_RELEASE`] with its
    /// caller placed): the server work of lockkit's default mode, whose
    /// release keeps the releasing process's place, so that asking again
    /// sends nothing.
    ReleasePlacing,
}

/// The ring's forms, in the order reports show them.
const HANDOFFS: [Handoff; 3] = [
    Handoff::Publish,
    Handoff::ReleaseThenPlace,
    Handoff::ReleasePlacing,
];

/// The ring's release script, as lockkit's default-mode release runs when
/// the head of the line recorded its turn (see lockkit-redis's `RELEASE`):
/// the holder checked, the head popped from the line and its record taken
/// from the turns, the server's clock read, the lease set for the head's
/// owner, the waiting-writer record deleted, a fencing token drawn for the
/// head (`SET … GET` on the counter), and the turn published, here to the
/// next process of the ring (`ARGV[2]`). With `ARGV[7]`, the caller's place
/// in line is then kept as [`RING_PLACE`] takes it (`ARGV[7]` how long a
/// place lasts, ms; `ARGV[8]` its stamp; `ARGV[9]` the ttl its turn is to
/// grant, ms; `ARGV[10]` its next owner token).
/// KEYS: lock, waiting writer, fence counter, line, turns; ARGV[1] the
/// caller's owner token, ARGV[4] its waiter id, ARGV[5] the reservation
/// (ms), ARGV[6] "1" to draw tokens. Answers the processes that heard the
/// turn.
const RING_RELEASE: &str = r"
local held = redis.call('GET', KEYS[1])
local released = held == ARGV[1]
local message = ''
local head = redis.call('ZPOPMIN', KEYS[4])[1]
local turn = head and redis.call('HGET', KEYS[5], head)
local t
if turn then
  redis.call('HDEL', KEYS[5], head)
  local fresh, since, ttl, fencing, owner = string.match(turn, '^(%d+)|(%d+)|(%d+)|(%d)|(.*)$')
  t = redis.call('TIME')
  local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if fresh and tonumber(fresh) >= n or released then
    redis.call('SET', KEYS[1], owner, 'PX', ttl)
    redis.call('DEL', KEYS[2])
    if fencing == ARGV[6] then
      local last = redis.call('SET', KEYS[3], string.format('%d', n), 'PX', ttl, 'GET')
      last = last and tonumber(last)
      if last and last >= n then
        n = last + 1
        redis.call('SET', KEYS[3], string.format('%d', n), 'PX', ttl)
      end
    end
    message = since .. '|' .. string.format('%d', n) .. '|' .. owner
  end
end
if ARGV[7] then
  t = t or redis.call('TIME')
  local place = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZADD', KEYS[4], 'NX', place, ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[7])
  local fresh = string.format('%d', place + tonumber(ARGV[7]) * 750)
  redis.call('HSET', KEYS[5], ARGV[4], fresh .. '|' .. ARGV[8] .. '|' .. ARGV[9] .. '|' .. ARGV[6] .. '|' .. ARGV[10])
  redis.call('PEXPIRE', KEYS[5], ARGV[7])
end
return redis.call('PUBLISH', ARGV[2], message)
";

/// The ring's place in line, as lockkit's acquire runs when it waits and is
/// refused (see lockkit-redis's `ACQUIRE`, with a waiter whose turn grants
/// it the lease): `SET NX` refused, the holder read and its lease's time
/// left, the server's clock read, a place in line (kept if there already)
/// and the turn's record, each of the two keys living as long as a place.
/// KEYS: lock, fence counter, readers, waiting writer, line, turns; ARGV[1]
/// owner token, ARGV[2] ttl (ms), ARGV[3] "1" to draw a token, ARGV[4]
/// "1" (waits), ARGV[5] waiter id, ARGV[6] how long a place lasts (ms),
/// ARGV[7] "" (placed by the server's clock), ARGV[8] the stamp.
const RING_PLACE: &str = r"
local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not granted then
  local held = redis.call('GET', KEYS[1])
  granted = held == '\30' .. ARGV[5] or held == ARGV[1]
end
local wait = redis.call('PTTL', KEYS[1])
if ARGV[4] == '1' and ARGV[5] ~= '' then
  local t = redis.call('TIME')
  local place = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZADD', KEYS[5], 'NX', place, ARGV[5])
  redis.call('PEXPIRE', KEYS[5], ARGV[6])
  local fresh = string.format('%d', place + tonumber(ARGV[6]) * 750)
  redis.call('HSET', KEYS[6], ARGV[5], fresh .. '|' .. ARGV[8] .. '|' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[1])
  redis.call('PEXPIRE', KEYS[6], ARGV[6])
  local half = math.floor(tonumber(ARGV[6]) / 2)
  if wait == -1 or wait > half then
    wait = half
  end
end
return -3 - wait
";

impl Entrant {
    /// The name the worker's settings carry.
    fn name(self) -> &'static str {
        match self {
            Entrant::Client(client) => client.name(),
            Entrant::Ring(Handoff::Publish) => "ring",
            Entrant::Ring(Handoff::ReleaseThenPlace) => "ring-release-then-place",
            Entrant::Ring(Handoff::ReleasePlacing) => "ring-release-placing",
        }
    }

    /// How reports name it.
    fn library(self) -> &'static str {
        match self {
            Entrant::Client(client) => client.library(),
            Entrant::Ring(Handoff::Publish) => "floor: a ring of `PUBLISH`es, no lock",
            Entrant::Ring(Handoff::ReleaseThenPlace) => {
                "floor: a ring of a release script and a place script, no lock"
            }
            Entrant::Ring(Handoff::ReleasePlacing) => {
                "floor: a ring of one script that releases and keeps the place (the default mode's), no lock"
            }
        }
    }

    /// Whether this is one of the ring's forms.
    fn is_ring(self) -> bool {
        matches!(self, Entrant::Ring(_))
    }
}

/// How reports name a run's library: the library, then lockkit's URL
/// parameters if it has any.
fn label((entrant, params, _): Library) -> String {
    if params.is_empty() {
        return entrant.library().to_owned();
    }
    let params: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{} (`{}`)", entrant.library(), params.join("&"))
}

/// A straight-back share as a report shows it: a percentage, or `—`
/// without consecutive grants.
fn share(straight_back: Option<f64>) -> String {
    straight_back.map_or("—".into(), |s| format!("{:.0} %", s * 100.0))
}

/// A duration as a report shows it, or `—` where there is none.
fn duration(d: Option<Duration>) -> String {
    d.map_or("—".into(), fmt_duration)
}

/// Extra URL parameters of a lockkit run.
type Params = &'static [(&'static str, &'static str)];
const NONE: Params = &[];
const FAIR: Params = &[("fair", "true")];
const BARGING: Params = &[("barging", "true")];
/// Barging without fencing tokens, as `rslock` grants them (Redis only;
/// Redlock draws none).
const BARGING_UNFENCED: Params = &[("barging", "true"), ("fencing", "false")];
/// Without fencing tokens, as `distributed-lock` grants them (the SQL
/// session modes).
const UNFENCED: Params = &[("fencing", "false")];

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
type Library = (Entrant, Params, Start);

/// Which libraries run on `backend`: lockkit everywhere (on Redis also as a
/// fair lock; on Redis and Redlock also as a barging one), the peers where
/// they have a lock of that kind; on Redlock with three instances, lockkit
/// (both modes) and rslock once more with one instance held by a dead
/// client; on Redis the handoff ring in each of its forms, the floors of
/// a handoff.
fn libraries(backend: Deployment) -> Vec<Library> {
    use Deployment::*;
    let lockkit = Entrant::Client(Client::Lockkit);
    let rslock = Entrant::Client(Client::Rslock);
    let mut libraries = vec![(lockkit, NONE, Start::Clean)];
    match backend {
        Redis => libraries.extend(
            [
                (lockkit, FAIR, Start::Clean),
                (lockkit, BARGING, Start::Clean),
                (lockkit, BARGING_UNFENCED, Start::Clean),
                (rslock, NONE, Start::Clean),
            ]
            .into_iter()
            .chain(HANDOFFS.map(|h| (Entrant::Ring(h), NONE, Start::Clean))),
        ),
        Redlock3 => libraries.extend([
            (lockkit, BARGING, Start::Clean),
            (rslock, NONE, Start::Clean),
            (lockkit, NONE, Start::DeadInstance),
            (lockkit, BARGING, Start::DeadInstance),
            (rslock, NONE, Start::DeadInstance),
        ]),
        Redlock5 => libraries.extend([
            (lockkit, BARGING, Start::Clean),
            (rslock, NONE, Start::Clean),
        ]),
        PgAdvisory | MariaDbNamed => libraries.extend([
            (lockkit, UNFENCED, Start::Clean),
            (Entrant::Client(Client::DistributedLock), NONE, Start::Clean),
        ]),
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
    flavour: Flavour,
    section: &RedisServer,
    processes: usize,
    run: Duration,
) -> Row {
    let (entrant, params, start) = library;
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
    let url = match entrant {
        Entrant::Ring(_) => servers.redis()[0].url(),
        Entrant::Client(_) => servers.url_with(backend, &hosts, &extra),
    };
    let before = commands(servers, backend).await;
    let server_before = server_cpu(servers, backend);
    // Every worker starts at the same moment, after its connections are up.
    // (Sixteen processes open their connections in well under a second:
    // a second and a half leaves them room on a loaded machine, and a
    // late one only joins late.)
    let start_at = wall_ns()
        + if processes > 4 {
            1_500_000_000
        } else {
            1_000_000_000
        };
    let spec = json!({
        "url": url,
        "client": entrant.name(),
        "flavour": flavour.name(),
        "processes": processes,
        "section": section.url(),
        "start_at": start_at,
        "end_at": start_at + run.as_nanos() as u64,
    })
    .to_string();
    let exe = std::env::current_exe().expect("this program's path");
    let children: Vec<_> = (0..processes)
        .map(|index| {
            tokio::process::Command::new(&exe)
                .env(WORKER, &spec)
                .env(INDEX, index.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let mut sections: Vec<(usize, Section)> = Vec::new();
    let mut errors = Vec::new();
    let mut cpu = Duration::ZERO;
    for (process, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().await.expect("a worker's output");
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<Value>(text.trim()) {
            Ok(value) if out.status.success() => {
                for s in value["sections"].as_array().into_iter().flatten() {
                    let n = |i: usize| s[i].as_u64().unwrap_or(0);
                    sections.push((process, (n(0), n(1), n(2))));
                }
                cpu += Duration::from_nanos(value["cpu_ns"].as_u64().unwrap_or(0));
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
    let server_used = server_before
        .zip(server_cpu(servers, backend))
        .map(|(b, a)| a.saturating_sub(b));
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
        flavour,
        processes,
        run,
        sections,
        counted,
        before.zip(after).map(|(b, a)| a.saturating_sub(b)),
        Cpu {
            clients: cpu,
            servers: server_used,
        },
        errors,
    )
}

/// What a worker does: see the module's documentation.
fn worker(spec: &str) {
    let spec: Value = serde_json::from_str(spec).expect("the worker's settings");
    let field = |key: &str| spec[key].as_str().unwrap_or_default().to_owned();
    let (url, section) = (field("url"), field("section"));
    let flavour: Flavour = field("flavour").parse().expect("a runtime flavour");
    let entrant = match field("client").as_str() {
        ring if ring.starts_with("ring") => HANDOFFS
            .into_iter()
            .map(Entrant::Ring)
            .find(|r| r.name() == ring)
            .expect("a form of the ring"),
        client => Entrant::Client(client.parse().expect("a client")),
    };
    let index: usize = std::env::var(INDEX)
        .ok()
        .and_then(|i| i.parse().ok())
        .expect("the worker's index");
    let processes = spec["processes"].as_u64().unwrap_or(1) as usize;
    let (start_at, end_at) = (
        spec["start_at"].as_u64().unwrap_or(0),
        spec["end_at"].as_u64().unwrap_or(0),
    );
    // The loop runs as a task of its own, as a service's work does, not
    // on the thread that waits for the runtime: there, on the multi-thread
    // runtime, every wake-up from a worker thread would cross threads.
    let work = async move {
        let redis = redis::Client::open(section.as_str()).expect("the section server's URL");
        let mut conn = redis
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the section server");
        let times = (start_at, end_at);
        let (sections, error) = match entrant {
            Entrant::Client(client) => {
                let locker = match Locker::connect(client, &url).await {
                    Ok(Some(locker)) => locker,
                    other => return json!({"sections": [], "error": format!("connect: {other:?}")}),
                };
                locked(&locker, &mut conn, times).await
            }
            Entrant::Ring(handoff) => ring(&url, handoff, index, processes, &mut conn, times).await,
        };
        let cpu = process_cpu().as_nanos() as u64 - LOOP_CPU.load(Ordering::SeqCst);
        // Redlock finishes a slow instance's part of the last release in
        // the background: exiting at once would leave that instance's grant
        // to expire into the next run.
        tokio::time::sleep(LINGER).await;
        json!({"sections": sections, "error": error, "cpu_ns": cpu})
    };
    let out = flavour
        .runtime()
        .block_on(async { tokio::spawn(work).await })
        .unwrap_or_else(|e| json!({"sections": [], "error": format!("the worker's task: {e}")}));
    println!("{out}");
}

/// A worker's sections (as JSON `[place, acquired, released]`) and the
/// error that ended them early, if one did.
type Worked = (Vec<Value>, Option<String>);

/// The CPU time this process had used when its loop started (see
/// [`start`]), in ns.
static LOOP_CPU: AtomicU64 = AtomicU64::new(0);

/// The CPU time this process's threads have run so far: the first field
/// of each `/proc/self/task/<tid>/schedstat`, in ns (a thread that ended
/// before is not counted; a runtime's threads live as long as it).
fn process_cpu() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    let ns: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Waits until `start_at` (wall-clock ns), then answers the instant the
/// run ends, `end_at`; the CPU time used from here on is the loop's.
async fn start(start_at: u64, end_at: u64) -> Instant {
    tokio::time::sleep(Duration::from_nanos(start_at.saturating_sub(wall_ns()))).await;
    LOOP_CPU.store(process_cpu().as_nanos() as u64, Ordering::SeqCst);
    Instant::now() + Duration::from_nanos(end_at.saturating_sub(wall_ns()))
}

/// The critical section: two round trips to the section server. Answers
/// the counter's value it read, the section's place in the order of grants.
async fn section(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let seen: Option<u64> = conn.get(COUNTER).await.expect("GET the counter");
    let place = seen.unwrap_or(0);
    let () = conn.set(COUNTER, place + 1).await.expect("SET the counter");
    place
}

/// A lock library's worker: `acquire`, the section, `release`, until the
/// run ends.
async fn locked(
    locker: &Locker,
    conn: &mut redis::aio::MultiplexedConnection,
    (start_at, end_at): (u64, u64),
) -> Worked {
    let deadline = start(start_at, end_at).await;
    let mut sections = Vec::new();
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
            Err(e) => return (sections, Some(e.to_string())),
        };
        let acquired = wall_ns();
        let place = section(conn).await;
        let released = wall_ns();
        if let Err(e) = locker.release(held).await {
            return (sections, Some(e.to_string()));
        }
        sections.push(json!([place, acquired, released]));
    }
    (sections, None)
}

/// The handoff ring's worker (see [`Entrant::Ring`]): worker 0 starts with
/// the section; each one, when its section is done, hands over to the next
/// one as `handoff` says. After the run's end a worker that gets its turn
/// passes it on without a section and stops.
async fn ring(
    url: &str,
    handoff: Handoff,
    index: usize,
    processes: usize,
    conn: &mut redis::aio::MultiplexedConnection,
    (start_at, end_at): (u64, u64),
) -> Worked {
    let mut sections = Vec::new();
    let client = redis::Client::open(url).expect("the lock server's URL");
    let mut subscriber = client.get_async_pubsub().await.expect("a subscriber");
    subscriber
        .subscribe(format!("{RING}{index}"))
        .await
        .expect("SUBSCRIBE to the ring");
    let mut turns = subscriber.into_on_message();
    let mut publisher = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the lock server");
    let next = format!("{RING}{}", (index + 1) % processes.max(1));
    let line = RingLine::new(index, &next);
    if handoff != Handoff::Publish {
        // Every process waits in line from the start, as lockkit's waiters
        // do once they have asked.
        line.place(&mut publisher).await;
    }
    let deadline = start(start_at, end_at).await;
    let mut turn = index == 0;
    loop {
        if !turn {
            let wait = tokio::time::timeout_at(deadline + Duration::from_secs(10), turns.next());
            if !matches!(wait.await, Ok(Some(_))) {
                return (sections, Some("the ring's turn never came".to_owned()));
            }
        }
        turn = false;
        let done = if Instant::now() < deadline {
            let acquired = wall_ns();
            let place = section(conn).await;
            Some(json!([place, acquired, wall_ns()]))
        } else {
            None
        };
        let heard: i64 = match handoff {
            Handoff::Publish => publisher.publish(&next, "turn").await.expect("PUBLISH"),
            Handoff::ReleaseThenPlace => line.release(&mut publisher, false).await,
            Handoff::ReleasePlacing => line.release(&mut publisher, done.is_some()).await,
        };
        let Some(done) = done else {
            return (sections, None);
        };
        sections.push(done);
        if heard != 1 {
            return (sections, Some(format!("{heard} workers heard the turn")));
        }
        if handoff == Handoff::ReleaseThenPlace {
            line.place(&mut publisher).await;
        }
    }
}

/// A ring process's release and place in line, by lockkit's default mode's
/// commands (see [`RING_RELEASE`] and [`RING_PLACE`]), on keys of the ring's
/// own that outlive no run by more than the lock's TTL.
struct RingLine {
    release: redis::Script,
    place: redis::Script,
    /// The keys of each script, in its order.
    release_keys: [String; 5],
    place_keys: [String; 6],
    /// This process's owner token (36 characters, as lockkit's) and waiter
    /// id, the next process's channel, and the lock's TTL in ms.
    owner: String,
    waiter: String,
    next: String,
    ttl: String,
}

impl RingLine {
    /// How long a place in line lasts without being asked for again (ms).
    const PLACE_MS: &str = "3000";
    /// How long a reservation lasts (ms).
    const RESERVED_MS: &str = "1000";

    fn new(index: usize, next: &str) -> Self {
        Self {
            release: redis::Script::new(RING_RELEASE),
            place: redis::Script::new(RING_PLACE),
            release_keys: ["lock", "waiting", "fence", "line", "turns"].map(Self::key),
            place_keys: ["lock", "fence", "readers", "waiting", "line", "turns"].map(Self::key),
            owner: format!("{index:08x}-0000-4000-8000-{index:012x}"),
            waiter: format!("{index:016x}"),
            next: next.to_owned(),
            ttl: TTL.as_millis().to_string(),
        }
    }

    fn key(part: &str) -> String {
        format!("{RING}{{line}}:{part}")
    }

    /// The release: the head of the line granted, the next process told;
    /// with `placing`, this process's place in line kept by the same
    /// script. Answers the processes that heard the turn.
    async fn release(&self, conn: &mut redis::aio::MultiplexedConnection, placing: bool) -> i64 {
        let mut call = self.release.prepare_invoke();
        for key in &self.release_keys {
            call.key(key);
        }
        call.arg(&self.owner)
            .arg(&self.next)
            .arg("1")
            .arg(&self.waiter)
            .arg(Self::RESERVED_MS)
            .arg("1");
        if placing {
            call.arg(Self::PLACE_MS)
                .arg(stamp())
                .arg(&self.ttl)
                .arg(&self.owner);
        }
        call.invoke_async(conn).await.expect("the ring's release")
    }

    /// The refused waiting acquire that takes this process's place in line.
    async fn place(&self, conn: &mut redis::aio::MultiplexedConnection) {
        let mut call = self.place.prepare_invoke();
        for key in &self.place_keys {
            call.key(key);
        }
        call.arg(&self.owner)
            .arg(&self.ttl)
            .arg("1")
            .arg("1")
            .arg(&self.waiter)
            .arg(Self::PLACE_MS)
            .arg("")
            .arg(stamp());
        let _: i64 = call
            .invoke_async(conn)
            .await
            .expect("the ring's place in line");
    }
}

/// A stamp as lockkit's waiters send (µs on a clock of their own).
fn stamp() -> u64 {
    wall_ns() / 1000
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

/// The kernel's ticks per second in `/proc/<pid>/stat`, `USER_HZ`: 100 on
/// Linux, whatever the kernel's own tick.
const USER_HZ: u64 = 100;

/// The processes of `backend`'s lock servers (`None` for SQLite, which
/// has no server; a `None` pid for a server that is not running).
fn lock_server_pids(servers: &Servers, backend: Deployment) -> Option<Vec<Option<u32>>> {
    use Deployment::*;
    Some(match backend {
        Redis | Redlock3 | Redlock5 => servers.redis()[..backend.redis_masters()]
            .iter()
            .map(FaultControl::pid)
            .collect(),
        Zk => vec![servers.zk().pid()],
        Etcd => vec![servers.etcd().pid()],
        PgLease | PgRow | PgAdvisory => vec![servers.pg().pid()],
        MariaDbLease | MariaDbRow | MariaDbNamed => vec![servers.my().pid()],
        _ => return None,
    })
}

/// The CPU time the lock servers' processes have used so far, their
/// children that ended counted too (PostgreSQL's backends, once their
/// sessions closed), from `/proc/<pid>/stat` (in the kernel's ticks of
/// 10 ms); `None` for SQLite, which has no server, or if a figure is
/// missing.
fn server_cpu(servers: &Servers, backend: Deployment) -> Option<Duration> {
    let mut sum = 0;
    for pid in lock_server_pids(servers, backend)? {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        // The fields after the command's name (in parentheses, which may
        // hold spaces): utime, stime, cutime and cstime are the 14th to
        // 17th of the line, the 12th to 15th after the name.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        for field in fields.get(11..15)? {
            sum += field.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_millis(sum * 1000 / USER_HZ))
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

/// The CPU time a run used: its workers' loops, and the lock servers'
/// processes (none without a figure).
#[derive(Clone, Copy)]
struct Cpu {
    clients: Duration,
    servers: Option<Duration>,
}

/// A library's figures: one run's, or the sum of its interleaved rounds
/// (see [`Row::absorb`]).
struct Row {
    backend: Deployment,
    /// The library, lockkit's URL parameters, how the run started.
    client: Library,
    flavour: Flavour,
    processes: usize,
    sections: usize,
    /// How long the workers looped, over every round.
    run: Duration,
    /// Consecutive grants (counted within each round).
    pairs: usize,
    /// Every handoff to another process, sorted.
    handoffs: Vec<Duration>,
    /// Every critical section, from the grant to the `release` call,
    /// sorted.
    held: Vec<Duration>,
    /// Every step from a `release` call to the same process's next grant
    /// (a straight-back grant: their count is the straight-back grants),
    /// sorted.
    returns: Vec<Duration>,
    /// The lock servers' commands over every round (none without a count).
    commands: Option<u64>,
    /// The CPU time used over every round.
    cpu: Cpu,
    /// Critical sections per second, round by round (paired with the
    /// other libraries' rounds of the same backend and runtime).
    rounds: Vec<f64>,
    /// Whether the counter and the sections agree (no two holders at once).
    books: bool,
    errors: Vec<String>,
}

impl Row {
    #[allow(clippy::too_many_arguments)]
    fn of(
        backend: Deployment,
        client: Library,
        flavour: Flavour,
        processes: usize,
        run: Duration,
        mut sections: Vec<(usize, Section)>,
        counted: u64,
        commands: Option<u64>,
        cpu: Cpu,
        errors: Vec<String>,
    ) -> Row {
        sections.sort_by_key(|(_, (place, _, _))| *place);
        let places_unique = sections.windows(2).all(|w| w[0].1.0 + 1 == w[1].1.0);
        let books = counted == sections.len() as u64
            && places_unique
            && sections.first().is_none_or(|(_, s)| s.0 == 0);
        // From a release call to the next grant: to another process (a
        // handoff) or back to the same one.
        let steps = |same: bool| {
            let mut steps: Vec<Duration> = sections
                .windows(2)
                .filter(|w| (w[0].0 == w[1].0) == same)
                .map(|w| Duration::from_nanos(w[1].1.1.saturating_sub(w[0].1.2)))
                .collect();
            steps.sort();
            steps
        };
        let (handoffs, returns) = (steps(false), steps(true));
        let mut held: Vec<Duration> = sections
            .iter()
            .map(|(_, (_, acquired, released))| {
                Duration::from_nanos(released.saturating_sub(*acquired))
            })
            .collect();
        held.sort();
        Row {
            backend,
            client,
            flavour,
            processes,
            sections: sections.len(),
            run,
            pairs: sections.len().saturating_sub(1),
            handoffs,
            held,
            returns,
            commands,
            cpu,
            rounds: vec![sections.len() as f64 / run.as_secs_f64()],
            books,
            errors,
        }
    }

    /// Adds the figures of another round of the same library.
    fn absorb(&mut self, round: Row) {
        self.sections += round.sections;
        self.run += round.run;
        self.pairs += round.pairs;
        for (all, more) in [
            (&mut self.handoffs, round.handoffs),
            (&mut self.held, round.held),
            (&mut self.returns, round.returns),
        ] {
            all.extend(more);
            all.sort();
        }
        self.commands = self.commands.zip(round.commands).map(|(a, b)| a + b);
        self.cpu.clients += round.cpu.clients;
        self.cpu.servers = self.cpu.servers.zip(round.cpu.servers).map(|(a, b)| a + b);
        self.rounds.extend(round.rounds);
        self.books &= round.books;
        self.errors.extend(round.errors);
    }

    fn per_second(&self) -> f64 {
        self.sections as f64 / self.run.as_secs_f64()
    }

    fn straight_back(&self) -> Option<f64> {
        (self.pairs > 0).then(|| self.returns.len() as f64 / self.pairs as f64)
    }

    fn commands_per_handoff(&self) -> Option<f64> {
        self.commands
            .filter(|_| self.pairs > 0)
            .map(|n| n as f64 / self.sections as f64)
    }

    /// This row's throughput over `base`'s, round by round (rounds in
    /// which `base` made no section left out), and their median.
    fn paired_ratio(&self, base: &Row) -> Option<(f64, Vec<f64>)> {
        let ratios: Vec<f64> = self
            .rounds
            .iter()
            .zip(&base.rounds)
            .filter(|(_, b)| **b > 0.0)
            .map(|(a, b)| a / b)
            .collect();
        (!ratios.is_empty()).then(|| (median(ratios.clone()), ratios))
    }

    /// CPU time per critical section: the workers' and the lock
    /// servers'.
    fn cpu_per_section(&self) -> (Option<Duration>, Option<Duration>) {
        let per = |d: Duration| {
            u32::try_from(self.sections)
                .ok()
                .filter(|&n| n > 0)
                .map(|n| d / n)
        };
        (per(self.cpu.clients), self.cpu.servers.and_then(per))
    }

    /// The share of `cores` cores that the workers and the lock servers
    /// kept busy over the run; `None` without the servers' figure.
    fn cores_busy(&self, cores: usize) -> Option<f64> {
        let used = self.cpu.clients + self.cpu.servers?;
        let offered = self.run.as_secs_f64() * cores as f64;
        (offered > 0.0).then(|| used.as_secs_f64() / offered)
    }

    fn line(&self) -> String {
        let (clients_cpu, servers_cpu) = self.cpu_per_section();
        format!(
            "| {}{} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            self.backend.label(),
            self.client.2.label(),
            label(self.client),
            self.flavour.name(),
            self.processes,
            self.sections,
            self.per_second(),
            share(self.straight_back()),
            duration(percentile(&self.handoffs, 50.0)),
            duration(percentile(&self.handoffs, 99.0)),
            self.commands_per_handoff()
                .map_or("—".into(), |c| format!("{c:.1}")),
            duration(clients_cpu),
            duration(servers_cpu),
            match (self.books, self.errors.first()) {
                (true, None) => "OK".to_owned(),
                (true, Some(e)) => format!("OK; error: {}", e.replace('|', "/")),
                (false, _) => "**overlap or lost section**".to_owned(),
            },
        )
    }
}

fn summary(
    mode: RunMode,
    processes: usize,
    run: Duration,
    rounds: usize,
    placement: &str,
    rows: &[Row],
) -> String {
    let mut out = format!(
        "## {processes} processes on one name ({} run, {} s per library, backend, runtime and process count, in {rounds} interleaved rounds)\n\n\
         Each process one client, looping `acquire` → two round trips to another Redis server → `release`. \
         Runtime: the workers' tokio runtime, multi-thread (a worker thread per core it may use) or current-thread. \
         {placement} \
         Straight back: of consecutive grants, the share that went to the process that had just released. \
         Handoff: from the holder's `release` call to the next holder's `acquire` returning. \
         Commands per handoff: the lock servers' own count over the run ÷ critical sections (on Redis the commands that scripts call count too; lockkit also runs with {quarter} processes, to show whether that count grows with the waiters). \
         One instance held by a dead client: a lease on the lock's key on one of the three instances outlives the run, so every grant needs both others. \
         The floors (Redis): no lock; each process waits for a message on a channel of its own on the lock's Redis server and, its section done, hands over to the next process, written by hand with redis-rs: by one `PUBLISH` to its channel (what a handoff between processes through that server costs at least); by a script of the commands of lockkit's default-mode release, then a script of those of its place in line (as before the release kept the place); by one script of both (the default mode's server work). \
         CPU per section: the CPU time the workers' loops used (every process, every thread, waiters included; from each thread's `schedstat`), and that the lock servers' processes used (from `/proc/<pid>/stat`, in ticks of 10 ms), ÷ critical sections. The sections run one at a time, so a library's throughput is bounded by the time on that one path (the lock server's time for each of the holder's requests, on the server's one thread; the holder's own client; the wake-ups between processes), not by the machine's cores as such: the CPU table says how busy the loops kept them. \
         Books: the counter the sections advanced agrees with the sections (no two holders at once).\n\n\
         | backend | library | runtime | processes | critical sections | per second | straight back | handoff p50 | handoff p99 | server commands per handoff | client CPU per section | lock server CPU per section | books |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label(),
        run.as_secs(),
        quarter = processes / 4,
    );
    for row in rows {
        let _ = writeln!(out, "{}", row.line());
    }
    out.push_str(&targets(rows, processes));
    out.push_str(&floors(rows, processes));
    out.push_str(&cpu_table(rows, processes));
    out.push_str(&steps_table(rows, processes));
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

/// The run of `library` on `backend` with `processes` on `flavour`, if it ran.
fn find(
    rows: &[Row],
    backend: Deployment,
    library: Library,
    flavour: Flavour,
    processes: usize,
) -> Option<&Row> {
    rows.iter().find(|r| {
        r.backend == backend
            && r.client == library
            && r.flavour == flavour
            && r.processes == processes
    })
}

/// The targets of lockkit's default mode, each judged on this run's rows:
/// at most a quarter of the grants straight back, server commands per
/// handoff that do not grow with the waiters (where they must not), and
/// at least the throughput of every peer that ran on the same backend and
/// runtime; the last also for the barging mode, where it ran.
fn targets(rows: &[Row], processes: usize) -> String {
    let lockkit = |start: Start| (Entrant::Client(Client::Lockkit), NONE, start);
    let mut out = format!(
        "\n### Targets of lockkit's default mode, judged on this run\n\n\
         Straight back: at most {:.0} % of the grants at {processes} processes. \
         Commands per handoff (Redis, Redlock, etcd and the SQL lease modes, multi-thread runtime): with {processes} processes \
         at most {COMMANDS_GROWTH_MAX} × the figure with {} (four times the waiters). \
         Throughput: at least that of every peer that ran on the same backend and runtime, with as many processes, \
         judged on the median over rounds of lockkit's throughput ÷ the peer's in the same round; \
         also judged for lockkit's barging mode (`barging=true`: waiters ask on the backoff, in no line), where it ran, whose straight-back share is not held to the default mode's bound, \
         and for lockkit without fencing tokens (`fencing=false`), where it ran.\n\n\
         | backend | runtime | target | lockkit | yardstick | lockkit ÷ yardstick | verdict |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        STRAIGHT_BACK_MAX * 100.0,
        processes / 4,
    );
    let verdict = |pass: bool| if pass { "PASS" } else { "MISS" };
    for row in rows {
        let (entrant, _, start) = row.client;
        let label = row.backend.label();
        let runtime = row.flavour.name();
        if row.client == lockkit(Start::Clean) && row.processes == processes {
            if let Some(share) = row.straight_back() {
                let _ = writeln!(
                    out,
                    "| {label} | {runtime} | straight back | {:.0} % | ≤ {:.0} % | — | {} |",
                    share * 100.0,
                    STRAIGHT_BACK_MAX * 100.0,
                    verdict(share <= STRAIGHT_BACK_MAX),
                );
            }
            if row.flavour == Flavour::Multi && commands_bounded(row.backend) {
                let fewer = find(rows, row.backend, row.client, row.flavour, processes / 4)
                    .and_then(Row::commands_per_handoff);
                let line = match (row.commands_per_handoff(), fewer) {
                    (Some(many), Some(few)) => format!(
                        "{many:.1} | {few:.1} with {} processes | {:.2} | {}",
                        processes / 4,
                        many / few,
                        verdict(many <= few * COMMANDS_GROWTH_MAX),
                    ),
                    (Some(many), None) => {
                        format!(
                            "{many:.1} | — | — | no run with {} processes",
                            processes / 4
                        )
                    }
                    (None, _) => "— | — | — | no server to count".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "| {label} | {runtime} | commands per handoff | {line} |"
                );
            }
        } else if let Entrant::Client(peer) = entrant
            && peer != Client::Lockkit
            && let Some(ours) = find(
                rows,
                row.backend,
                lockkit(start),
                row.flavour,
                row.processes,
            )
        {
            let mut judged = vec![("throughput", ours)];
            for (mode, params) in [
                ("throughput, `barging=true`", BARGING),
                ("throughput, `barging=true&fencing=false`", BARGING_UNFENCED),
                ("throughput, `fencing=false`", UNFENCED),
            ] {
                let barging = (Entrant::Client(Client::Lockkit), params, start);
                if let Some(barging) = find(rows, row.backend, barging, row.flavour, row.processes)
                {
                    judged.push((mode, barging));
                }
            }
            for (target, ours) in judged {
                let (ratio, verdict) = match ours.paired_ratio(row) {
                    Some((ratio, rounds)) => (
                        format!(
                            "{ratio:.3} (median of the rounds' {})",
                            rounds
                                .iter()
                                .map(|r| format!("{r:.2}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        verdict(ratio >= 1.0),
                    ),
                    None => ("—".to_owned(), "no round to pair"),
                };
                let _ = writeln!(
                    out,
                    "| {label}{} | {runtime} | {target} | {:.0}/s | {:.0}/s ({}) | {ratio} | {verdict} |",
                    start.label(),
                    ours.per_second(),
                    row.per_second(),
                    peer.library(),
                );
            }
        }
    }
    out
}

/// lockkit's modes and the peers beside the floors of a handoff between
/// processes (the ring's forms), on each runtime where the floors ran.
fn floors(rows: &[Row], processes: usize) -> String {
    let floor = |row: &Row, handoff: Handoff| {
        rows.iter().find(|r| {
            r.client.0 == Entrant::Ring(handoff)
                && r.backend == row.backend
                && r.flavour == row.flavour
                && r.processes == processes
        })
    };
    let bases: Vec<&Row> = rows
        .iter()
        .filter(|r| r.client.0 == Entrant::Ring(Handoff::Publish) && r.processes == processes)
        .collect();
    if bases.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n### Against the floors of a handoff between processes\n\n\
         Critical sections per second over those of each floor on the same backend and runtime, with {processes} processes. \
         Every floor is a ring that hands every section to the next process and never back, written by hand with redis-rs: \
         by one `PUBLISH` (the least a handoff between processes through that server costs); \
         by the default mode's release script, then the releasing process's place in line by a second script (as lockkit's default mode asked again before its release kept the place); \
         by one script that does both (the default mode's release, which keeps the releasing process's place, so that asking again sends nothing: its server work, without its client). \
         A library above 1 gives grants straight back: a process that keeps the lock skips the handoff every floor pays.\n\n\
         | backend | runtime | library | per second | × `PUBLISH` ring | × release then place | × release placing | straight back |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for base in bases {
        let same = rows.iter().filter(|r| {
            r.backend == base.backend
                && r.flavour == base.flavour
                && r.processes == processes
                && r.client.2 == Start::Clean
        });
        for row in same {
            let ratios: Vec<String> = HANDOFFS
                .iter()
                .map(|&h| match floor(row, h) {
                    Some(f) if f.per_second() > 0.0 && row.client.0 != Entrant::Ring(h) => {
                        format!("{:.2}", row.per_second() / f.per_second())
                    }
                    _ => "—".to_owned(),
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0}/s | {} | {} |",
                base.backend.label(),
                base.flavour.name(),
                label(row.client),
                row.per_second(),
                ratios.join(" | "),
                share(row.straight_back()),
            );
        }
    }
    out
}

/// Each peer run with `processes` processes from a clean start, with the
/// runs to set beside it: lockkit's (every mode) on the same backend and
/// runtime, then the peer's own.
fn beside_peers(rows: &[Row], processes: usize) -> Vec<(&Row, Vec<&Row>)> {
    let clean = |r: &&Row| r.processes == processes && r.client.2 == Start::Clean;
    rows.iter()
        .filter(clean)
        .filter(|r| matches!(r.client.0, Entrant::Client(c) if c != Client::Lockkit))
        .map(|peer| {
            let group = rows
                .iter()
                .filter(clean)
                .filter(|r| {
                    r.backend == peer.backend
                        && r.flavour == peer.flavour
                        && r.client.0 == Entrant::Client(Client::Lockkit)
                })
                .chain([peer])
                .collect();
            (peer, group)
        })
        .collect()
}

/// Where the CPU goes: each library's CPU time per critical section, the
/// workers' and the lock servers', beside the peer's on the same backend
/// and runtime (with `processes` processes, from a clean start).
fn cpu_table(rows: &[Row], processes: usize) -> String {
    let groups = beside_peers(rows, processes);
    if groups.is_empty() {
        return String::new();
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut out = format!(
        "\n### CPU time per critical section, against the peer\n\n\
         The CPU time of the workers' loops and of the lock servers' processes, ÷ critical sections, with {processes} processes, beside the peer's on the same backend and runtime; \
         the section's own work (two round trips to another Redis server) is in every library's client figure. \
         The lock server's time is spent while the holder waits for its answer: on the one path the sections take, one after another. \
         Cores busy: the workers' and the lock servers' CPU time over the run's time on the machine's {cores} cores; below 100 %, the machine had CPU to spare, and what bounds the throughput is the time on that path, not the CPU the waiters use beside it.\n\n\
         | backend | runtime | library | client CPU per section | × peer | lock server CPU per section | × peer | cores busy |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}", a.as_secs_f64() / b.as_secs_f64()),
        _ => "—".to_owned(),
    };
    for (peer, group) in groups {
        let (peer_client, peer_server) = peer.cpu_per_section();
        for row in group {
            let (client, server) = row.cpu_per_section();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.backend.label(),
                row.flavour.name(),
                label(row.client),
                duration(client),
                ratio(client, peer_client),
                duration(server),
                ratio(server, peer_server),
                row.cores_busy(cores)
                    .map_or("—".into(), |busy| format!("{:.0} %", busy * 100.0)),
            );
        }
    }
    out
}

/// Where a section's time goes: each library's time per critical section
/// split into the section itself and the step from its `release` call to
/// the next grant, back to the same process or to another one, beside the
/// peer's on the same backend and runtime (with `processes` processes,
/// from a clean start).
fn steps_table(rows: &[Row], processes: usize) -> String {
    let groups = beside_peers(rows, processes);
    if groups.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n### Where a section's time goes, against the peer\n\n\
         With {processes} processes, each library's time per critical section (the run ÷ its sections) is the section itself \
         (from the grant to the `release` call: two round trips to another Redis server, the same work in every library) \
         and the step from the `release` call to the next grant: back to the same process (its release and its next `acquire`), \
         or to another process (the handoff), in the mix of the straight-back share. \
         Medians over every section of the run; the time per section also counts the longer steps the medians leave out.\n\n\
         | backend | runtime | library | time per section | section p50 | release → next grant, same process, p50 | release → next grant, another process, p50 | straight back |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for (_, group) in groups {
        for row in group {
            let each = (row.sections > 0).then(|| row.run.div_f64(row.sections as f64));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.backend.label(),
                row.flavour.name(),
                label(row.client),
                duration(each),
                duration(percentile(&row.held, 50.0)),
                duration(percentile(&row.returns, 50.0)),
                duration(percentile(&row.handoffs, 50.0)),
                share(row.straight_back()),
            );
        }
    }
    out
}
