#![allow(clippy::print_stdout)]
//! What the fence at the resource costs: a fenced write over the same write
//! without the fence, one client in one process, on both runtime flavours.
//!
//! * PostgreSQL and MariaDB: a transaction that updates one row (`BEGIN`,
//!   `UPDATE`, `COMMIT`), and the same transaction fenced by
//!   `lockkit_fence(resource, token)` two ways: inside the `UPDATE` (the
//!   function as a row source, no extra round trip), and as a statement of
//!   its own first (`lockkit::fence::{postgres, mysql}::admit`); each write
//!   with the next token;
//! * Redis: `SET` of one key, and the same `SET` through the fence script
//!   (`FencedWrite`), each write with the next token;
//! * an HTTP service: a `tower` service answering a `PUT` in process, and
//!   the same service behind `FenceLayer` (the layer's cost per request).
//!
//! Each run interleaves 12 blocks of 40 plain and 40 fenced writes (after 2
//! warm-up blocks, the order alternating); a run's ratio is the median of
//! its blocks' fenced/plain ratios, and the verdict is on the median of 7
//! runs. The summary goes
//! to `target/lockkit-bench/fence-summary.md` (`scripts/reports.sh fence`
//! makes it a page of docs/reports/). `LOCKKIT_FENCE_STORES=postgres,redis`
//! measures only the stores whose names start so.
//!
//! `cargo bench -p lockkit-benches --bench fence`

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Request, Response};
use lockkit_benches::{
    CycleFixture, CycleKind, Interleaved, Limit, RunMode, median, runtime_of, save_summary,
};
use lockkit_core::FencingToken;
use lockkit_fence::http::{FenceLayer, Fences};
use lockkit_fence::redis::{FencedWrite, data_key};
use lockkit_testkit::{MariaDbServer, PostgresServer, RedisServer, TestServer, command_stat};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// Runs, blocks per run (after the warm-up blocks) and writes per block.
fn plan(mode: RunMode) -> (usize, usize, usize) {
    match mode {
        RunMode::Bench => (7, 12, 40),
        RunMode::Quick => (2, 5, 20),
        _ => (1, 1, 3),
    }
}

const WARM_UP_BLOCKS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Store {
    Postgres(PgForm),
    MariaDb(MariaDbForm),
    Redis,
    Http,
}

/// Where a PostgreSQL write carries its fence.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PgForm {
    /// In the `UPDATE` itself, as a row source (`FROM lockkit_fence(…)`):
    /// called once whatever the statement reads.
    Update,
    /// A statement of its own before the write (`admit`).
    Admit,
}

/// Where a MariaDB write carries its fence.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MariaDbForm {
    /// In the `WHERE` of an `UPDATE` that finds its row by key: called for
    /// each row the key finds.
    Where,
    /// In a derived table of the `UPDATE`, which the server materialises:
    /// called once whatever the statement reads.
    Derived,
    /// A statement of its own before the write (`admit`).
    Admit,
}

impl PgForm {
    /// The fenced `UPDATE` (binding the resource, then the token), or
    /// `None` where the fence is a statement of its own.
    fn fenced_update(self) -> Option<&'static str> {
        match self {
            PgForm::Update => Some(
                "UPDATE bench_fence SET hits = hits + 1 \
                 FROM lockkit_fence($1, $2) AS fence WHERE id = 1",
            ),
            PgForm::Admit => None,
        }
    }
}

impl MariaDbForm {
    /// The fenced `UPDATE` (binding the resource, then the token), or
    /// `None` where the fence is a statement of its own.
    fn fenced_update(self) -> Option<&'static str> {
        match self {
            MariaDbForm::Where => Some(
                "UPDATE bench_fence SET hits = hits + 1 \
                 WHERE id = 1 AND lockkit_fence(?, ?) IS NOT NULL",
            ),
            MariaDbForm::Derived => Some(
                "UPDATE bench_fence JOIN (SELECT lockkit_fence(?, ?) AS admitted) AS fence \
                 SET hits = hits + 1 WHERE id = 1",
            ),
            MariaDbForm::Admit => None,
        }
    }
}

impl Store {
    const ALL: [Store; 7] = [
        Store::Postgres(PgForm::Update),
        Store::Postgres(PgForm::Admit),
        Store::MariaDb(MariaDbForm::Where),
        Store::MariaDb(MariaDbForm::Derived),
        Store::MariaDb(MariaDbForm::Admit),
        Store::Redis,
        Store::Http,
    ];

    fn name(self) -> &'static str {
        match self {
            Store::Postgres(PgForm::Update) => "postgres, fence in the UPDATE",
            Store::Postgres(PgForm::Admit) => "postgres, admit() then UPDATE",
            Store::MariaDb(MariaDbForm::Where) => {
                "mariadb, fence in the UPDATE's WHERE (a row by key)"
            }
            Store::MariaDb(MariaDbForm::Derived) => {
                "mariadb, fence in a derived table of the UPDATE"
            }
            Store::MariaDb(MariaDbForm::Admit) => "mariadb, admit() then UPDATE",
            Store::Redis => "redis, FencedWrite",
            Store::Http => "http, FenceLayer",
        }
    }

    /// The target for fenced ÷ plain: on the fastest documented form of
    /// each store (the separate `admit` costs a round trip, and MariaDB's
    /// derived table a temporary table, reported; the tower layer's cost is
    /// reported per request).
    fn target(self) -> Option<f64> {
        match self {
            Store::Postgres(PgForm::Update) | Store::MariaDb(MariaDbForm::Where) => Some(1.3),
            Store::Redis => Some(1.2),
            Store::Postgres(PgForm::Admit)
            | Store::MariaDb(MariaDbForm::Derived | MariaDbForm::Admit)
            | Store::Http => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Write {
    Plain,
    Fenced,
}

impl CycleKind for Write {
    const ALL: &'static [Write] = &[Write::Plain, Write::Fenced];

    fn bench(self) -> &'static str {
        match self {
            Write::Plain => "plain_write",
            Write::Fenced => "fenced_write",
        }
    }
}

struct Servers {
    postgres: PostgresServer,
    mariadb: MariaDbServer,
    redis: RedisServer,
}

type HttpService = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// The clients of one store, on the runtime that measures them.
enum Client {
    Postgres(sqlx::PgPool, PgForm),
    MariaDb(sqlx::MySqlPool, MariaDbForm),
    Redis(redis::aio::MultiplexedConnection),
    Http {
        plain: HttpService,
        fenced: HttpService,
    },
}

struct Fixture {
    client: Client,
    tokens: AtomicU64,
}

/// One command's count and time in the Redis server's `INFO commandstats`.
#[derive(Clone, Copy, Debug, Default)]
struct CommandTime {
    calls: u64,
    usec: u64,
}

impl CommandTime {
    /// The server's own time a call (µs).
    fn per_call(self) -> f64 {
        self.usec as f64 / self.calls.max(1) as f64
    }
}

/// What the Redis server spent on the writes of one runtime's runs: `SET`
/// (the plain writes, and the two `SET`s each fenced write's script calls)
/// and `EVALSHA` (the fenced writes whole, their `SET`s included).
#[derive(Clone, Copy, Debug)]
struct ServerTimes {
    set: CommandTime,
    evalsha: CommandTime,
}

/// `cmdstat_<command>` of an `INFO commandstats` reply.
fn command_time(info: &str, command: &str) -> CommandTime {
    let stat = |stat: &str| command_stat(info, command, stat).unwrap_or(0);
    CommandTime {
        calls: stat("calls"),
        usec: stat("usec"),
    }
}

struct Run {
    plain_us: f64,
    fenced_us: f64,
    ratio: f64,
}

fn main() {
    let mode = RunMode::from_env();
    if mode == RunMode::List {
        return;
    }
    let boot = runtime_of("current_thread");
    let servers = boot.block_on(async {
        let (postgres, mariadb, redis) = tokio::join!(
            PostgresServer::start(),
            MariaDbServer::start(),
            RedisServer::start()
        );
        Servers {
            postgres,
            mariadb,
            redis,
        }
    });
    boot.block_on(prepare(&servers));
    let (runs, blocks, per_block) = plan(mode);
    let mut rows = Vec::new();
    // `LOCKKIT_FENCE_STORES=postgres,redis` measures only those stores.
    let only = std::env::var("LOCKKIT_FENCE_STORES").unwrap_or_default();
    let stores = Store::ALL.into_iter().filter(|store| {
        only.is_empty()
            || only
                .split(',')
                .any(|name| store.name().starts_with(name.trim()))
    });
    let mut server_times = Vec::new();
    for store in stores {
        for flavour in ["current_thread", "multi_thread"] {
            let rt = runtime_of(flavour);
            let fixture = rt.block_on(Fixture::new(&servers, store));
            rt.block_on(fixture.reset_redis_stats());
            let measured: Vec<Run> = (0..runs)
                .map(|_| rt.block_on(fixture.measure(blocks, per_block)))
                .collect();
            if let Some(times) = rt.block_on(fixture.redis_stats()) {
                println!(
                    "redis server {flavour}: SET {:.2} µs a call ({} calls), EVALSHA {:.2} µs a call ({} calls)",
                    times.set.per_call(),
                    times.set.calls,
                    times.evalsha.per_call(),
                    times.evalsha.calls
                );
                server_times.push((flavour, times));
            }
            for (i, run) in measured.iter().enumerate() {
                println!(
                    "{} {flavour} run {i}: plain {:.1} µs, fenced {:.1} µs, paired ratio {:.3}",
                    store.name(),
                    run.plain_us,
                    run.fenced_us,
                    run.ratio
                );
            }
            rows.push((store, flavour, measured));
        }
    }
    let mut out = summary(mode, &rows);
    out.push_str(&server_summary(&rows, &server_times));
    save_summary(mode, "fence", &out);
}

/// The fence and a one-row table on each SQL server.
async fn prepare(servers: &Servers) {
    let pg = sqlx::PgPool::connect(&servers.postgres.url())
        .await
        .expect("postgres");
    lockkit_fence::postgres::install(&pg)
        .await
        .expect("install on postgres");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS bench_fence (id int PRIMARY KEY, hits bigint NOT NULL); \
         INSERT INTO bench_fence VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    )
    .execute(&pg)
    .await
    .expect("the postgres table");
    let my = sqlx::MySqlPool::connect(&servers.mariadb.url())
        .await
        .expect("mariadb");
    lockkit_fence::mysql::install(&my)
        .await
        .expect("install on mariadb");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS bench_fence (id int PRIMARY KEY, hits bigint NOT NULL) ENGINE = InnoDB; \
         INSERT IGNORE INTO bench_fence VALUES (1, 0)",
    )
    .execute(&my)
    .await
    .expect("the mariadb table");
}

fn http_services() -> (HttpService, HttpService) {
    let handler = tower::service_fn(|request: Request<String>| async move {
        Ok::<_, Infallible>(Response::new(request.into_body()))
    });
    let fenced = ServiceBuilder::new()
        .layer(FenceLayer::new(
            Fences::new(),
            |request: &Request<String>| Some(request.uri().path().to_owned()),
        ))
        .service(handler);
    (
        BoxCloneSyncService::new(handler),
        BoxCloneSyncService::new(fenced),
    )
}

impl Fixture {
    async fn new(servers: &Servers, store: Store) -> Fixture {
        let client = match store {
            Store::Postgres(form) => Client::Postgres(
                sqlx::PgPool::connect(&servers.postgres.url())
                    .await
                    .expect("postgres"),
                form,
            ),
            Store::MariaDb(form) => Client::MariaDb(
                sqlx::MySqlPool::connect(&servers.mariadb.url())
                    .await
                    .expect("mariadb"),
                form,
            ),
            Store::Redis => {
                let client = redis::Client::open(servers.redis.url()).expect("a redis URL");
                Client::Redis(
                    client
                        .get_multiplexed_async_connection()
                        .await
                        .expect("redis"),
                )
            }
            Store::Http => {
                let (plain, fenced) = http_services();
                Client::Http { plain, fenced }
            }
        };
        // Tokens rise across fixtures: each store keeps its fence across runs.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros();
        Fixture {
            client,
            tokens: AtomicU64::new(u64::try_from(start).expect("a µs clock in u64")),
        }
    }

    async fn measure(&self, blocks: usize, per_block: usize) -> Run {
        Interleaved::<Write>::measure(self, WARM_UP_BLOCKS, per_block).await;
        let measured = Interleaved::<Write>::measure(self, blocks, per_block).await;
        let us = |kind| measured.median(kind).expect("measured blocks") / 1e3;
        Run {
            plain_us: us(Write::Plain),
            fenced_us: us(Write::Fenced),
            ratio: measured
                .paired_ratio(Write::Fenced, Write::Plain)
                .expect("measured blocks"),
        }
    }

    /// On Redis, clears the server's command counters (`CONFIG RESETSTAT`).
    async fn reset_redis_stats(&self) {
        if let Client::Redis(conn) = &self.client {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn.clone())
                .await
                .expect("CONFIG RESETSTAT");
        }
    }

    /// On Redis, what the server's command counters counted since
    /// [`reset_redis_stats`](Self::reset_redis_stats).
    async fn redis_stats(&self) -> Option<ServerTimes> {
        let Client::Redis(conn) = &self.client else {
            return None;
        };
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn.clone())
            .await
            .expect("INFO commandstats");
        Some(ServerTimes {
            set: command_time(&info, "set"),
            evalsha: command_time(&info, "evalsha"),
        })
    }

    fn next_token(&self) -> FencingToken {
        FencingToken::new(self.tokens.fetch_add(1, Ordering::Relaxed))
    }
}

/// One write in a transaction on `$pool`: plain, or fenced by `$update`
/// (the fenced `UPDATE`, where the form has one) or by `$fence::admit` first.
macro_rules! sql_write {
    ($pool:expr, $update:expr, $fenced:expr, $token:expr, $fence:path) => {{
        use $fence as fence;
        let mut tx = $pool.begin().await.expect("begin");
        match ($fenced, $update) {
            (true, Some(update)) => {
                sqlx::query(update)
                    .bind("bench")
                    .bind(lockkit_fence::bigint($token).expect("a BIGINT token"))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| fence::refusal(e, "bench", $token))
                    .expect("admitted");
            }
            (fenced, _) => {
                if fenced {
                    fence::admit(&mut tx, "bench", $token)
                        .await
                        .expect("admitted");
                }
                sqlx::query("UPDATE bench_fence SET hits = hits + 1 WHERE id = 1")
                    .execute(&mut *tx)
                    .await
                    .expect("update");
            }
        }
        tx.commit().await.expect("commit");
    }};
}

impl CycleFixture for Fixture {
    type Kind = Write;

    async fn run(&self, kind: Write) {
        let fenced = kind == Write::Fenced;
        let token = self.next_token();
        match &self.client {
            Client::Postgres(pool, form) => {
                sql_write!(
                    pool,
                    form.fenced_update(),
                    fenced,
                    token,
                    lockkit_fence::postgres
                );
            }
            Client::MariaDb(pool, form) => {
                sql_write!(
                    pool,
                    form.fenced_update(),
                    fenced,
                    token,
                    lockkit_fence::mysql
                );
            }
            Client::Redis(conn) => {
                let mut conn = conn.clone();
                let mut set = redis::cmd("SET");
                set.arg(data_key("bench", "body")).arg(token.get());
                if fenced {
                    FencedWrite::new("bench", token)
                        .expect("a valid resource")
                        .command(&set)
                        .run(&mut conn)
                        .await
                        .expect("admitted");
                } else {
                    set.query_async::<()>(&mut conn).await.expect("SET");
                }
            }
            Client::Http {
                plain,
                fenced: layered,
            } => {
                let service = if fenced { layered } else { plain };
                let request = Request::put("/reports/daily")
                    .header("Fencing-Token", token.get())
                    .body(String::from("body"))
                    .expect("a request");
                let response = service.clone().oneshot(request).await.expect("a response");
                assert_eq!(response.status(), http::StatusCode::OK);
            }
        }
    }
}

/// The median over `runs` of the plain and of the fenced write's time (µs).
fn medians(runs: &[Run]) -> (f64, f64) {
    (
        median(runs.iter().map(|r| r.plain_us).collect()),
        median(runs.iter().map(|r| r.fenced_us).collect()),
    )
}

fn summary(mode: RunMode, rows: &[(Store, &str, Vec<Run>)]) -> String {
    let mut out = format!(
        "## A fenced write over the same write without the fence, one client ({} run)\n\n\
         | store | runtime | plain write (median of run medians) | fenced write | × plain, each run (paired) | median of runs | target |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        mode.label()
    );
    for (store, flavour, runs) in rows {
        let each: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.ratio)).collect();
        let ratio = median(runs.iter().map(|r| r.ratio).collect());
        let (plain, fenced) = medians(runs);
        let (ratio, verdict) = match store.target() {
            Some(target) => Limit::AtMost(target).judge(Some(ratio)),
            None => (
                format!("{ratio:.2}"),
                format!("+{:.2} µs a request", fenced - plain),
            ),
        };
        out.push_str(&format!(
            "| {} | {} | {plain:.2} µs | {fenced:.2} µs | {} | {ratio} | {verdict} |\n",
            store.name(),
            flavour.replace('_', "-"),
            each.join(", "),
        ));
    }
    out
}

/// The Redis server's own time a write, beside what the fence added end to
/// end in the same runs.
fn server_summary(rows: &[(Store, &str, Vec<Run>)], times: &[(&str, ServerTimes)]) -> String {
    if times.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n## The Redis server's own time a write\n\n\
         From the server's `INFO commandstats` over the runs above (its counters cleared before each runtime's runs): a plain write is one `SET`, a fenced write one `EVALSHA` of the fence script, whose time includes the two `SET`s it calls (the fence's and the write's; `SET`'s own figure counts those too). The last column is the fenced write's extra time end to end (the medians above).\n\n\
         | runtime | `SET`, a call | `EVALSHA` of the fence script, a call | the script's extra server time | the fenced write's extra time, end to end |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for (flavour, t) in times {
        let Some((_, _, runs)) = rows
            .iter()
            .find(|(store, f, _)| *store == Store::Redis && f == flavour)
        else {
            continue;
        };
        let (plain, fenced) = medians(runs);
        let (set, script) = (t.set.per_call(), t.evalsha.per_call());
        out.push_str(&format!(
            "| {} | {set:.2} µs | {script:.2} µs | +{:.2} µs | +{:.2} µs |\n",
            flavour.replace('_', "-"),
            script - set,
            fenced - plain,
        ));
    }
    out
}
