//! The race at the resource: 16 writers on 4 client processes take one
//! Redis lock in turn and write, fenced, to PostgreSQL (`lockkit_fence` in
//! the `INSERT`) and Redis (the fence script). Every fourth holder is
//! stopped with SIGSTOP past its lease; the next holder writes; then the
//! stopped one is resumed and writes as if it still held the lock. Both
//! stores must refuse every resumed writer, accept every other, and keep
//! histories whose tokens never go down.
//!
//! The test drives each section (a writer writes only when told), so what
//! it asserts does not depend on timing: a resumed holder writes after the
//! next holder's write has committed.

use std::collections::VecDeque;
use std::process::Stdio;
use std::time::Duration;

use lockkit_faults::fence_race::{PG_HISTORY, prepare, redis_history};
use lockkit_testkit::{PostgresServer, RedisServer, TestServer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

const CLIENTS: u32 = 4;
const WRITERS: u32 = 4;
const SECTIONS: usize = 24;
/// The lease: a stopped holder loses the lock after it.
const TTL: &str = "1s";
/// Bound of a wait for a worker's next line (a hang, not a slow machine).
const LINE_LIMIT: Duration = Duration::from_secs(60);

struct Worker {
    child: Child,
    stdin: ChildStdin,
}

impl Worker {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().expect("running")).expect("a pid"))
    }

    async fn write(&mut self, writer: u32) {
        self.stdin
            .write_all(format!("write {writer}\n").as_bytes())
            .await
            .expect("tell the worker to write");
    }
}

#[derive(Debug)]
enum Line {
    Holding {
        client: u32,
        writer: u32,
        token: u64,
    },
    Wrote {
        client: u32,
        writer: u32,
        token: u64,
        pg: bool,
        redis: bool,
    },
}

fn parse(line: &str) -> Option<Line> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let small = |i: usize| u32::try_from(number(i)?).ok();
    match *fields.first()? {
        "holding" => Some(Line::Holding {
            client: small(1)?,
            writer: small(2)?,
            token: number(3)?,
        }),
        "wrote" => Some(Line::Wrote {
            client: small(1)?,
            writer: small(2)?,
            token: number(3)?,
            pg: *fields.get(4)? == "pg=ok",
            redis: *fields.get(5)? == "redis=ok",
        }),
        _ => None,
    }
}

/// The token and the two stores' verdicts of a `wrote` line.
fn verdicts(line: &Line) -> (u64, bool, bool) {
    match *line {
        Line::Wrote {
            token, pg, redis, ..
        } => (token, pg, redis),
        Line::Holding { .. } => panic!("not a write: {line:?}"),
    }
}

/// The workers' lines, in the order they were printed per worker.
struct Lines {
    rx: mpsc::UnboundedReceiver<Line>,
    held_back: VecDeque<Line>,
}

impl Lines {
    async fn next(&mut self) -> Line {
        if let Some(line) = self.held_back.pop_front() {
            return line;
        }
        tokio::time::timeout(LINE_LIMIT, self.rx.recv())
            .await
            .expect("a worker line within the limit")
            .expect("the workers are alive")
    }

    /// The next line that `want` accepts; the others are kept for later.
    async fn next_matching(&mut self, want: impl Fn(&Line) -> bool) -> Line {
        let mut skipped = Vec::new();
        let found = loop {
            let line = self.next().await;
            if want(&line) {
                break line;
            }
            skipped.push(line);
        };
        for line in skipped.into_iter().rev() {
            self.held_back.push_front(line);
        }
        found
    }
}

async fn start_workers(lock_url: &str, pg_url: &str, redis_url: &str) -> (Vec<Worker>, Lines) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for client in 0..CLIENTS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockkit-faults"))
            .args(["fence-worker", "--lock-url", lock_url, "--pg-url", pg_url])
            .args(["--redis-url", redis_url, "--ttl", TTL])
            .args([
                "--client",
                &client.to_string(),
                "--writers",
                &WRITERS.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a fence worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match parse(&line) {
                    Some(parsed) => {
                        let _ = tx.send(parsed);
                    }
                    None => panic!("a fence worker printed {line:?}"),
                }
            }
        });
        workers.push(Worker { child, stdin });
    }
    (
        workers,
        Lines {
            rx,
            held_back: VecDeque::new(),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holders_writes_are_refused_at_both_stores() {
    let (postgres, redis) = tokio::join!(PostgresServer::start(), RedisServer::start());
    prepare(&postgres.url(), &redis.url())
        .await
        .expect("prepare the stores");
    let (mut workers, mut lines) = start_workers(&redis.url(), &postgres.url(), &redis.url()).await;

    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    let mut section = 0;
    while section < SECTIONS {
        let Line::Holding {
            client,
            writer,
            token,
        } = lines
            .next_matching(|l| matches!(l, Line::Holding { .. }))
            .await
        else {
            unreachable!()
        };
        section += 1;
        if section % 4 != 0 {
            workers[client as usize].write(writer).await;
            let wrote = lines
                .next_matching(|l| matches!(l, Line::Wrote { client: c, writer: w, .. } if *c == client && *w == writer))
                .await;
            let (written, pg, redis) = verdicts(&wrote);
            assert_eq!(written, token, "the writer wrote with the token it held");
            assert!(
                pg && redis,
                "holder {client}/{writer} with token {token} was refused: {wrote:?}"
            );
            accepted.push(token);
            continue;
        }
        // Stop the holder before it writes; its lease runs out, and the
        // next holder (in another process) takes the lock and writes.
        let stopped = workers[client as usize].pid();
        kill(stopped, Signal::SIGSTOP).expect("SIGSTOP the holder");
        let Line::Holding {
            client: next_client,
            writer: next_writer,
            token: next_token,
        } = lines
            .next_matching(|l| matches!(l, Line::Holding { client: c, .. } if *c != client))
            .await
        else {
            unreachable!()
        };
        assert!(
            next_token > token,
            "the next holder's token {next_token} is above {token}"
        );
        workers[next_client as usize].write(next_writer).await;
        let wrote = lines
            .next_matching(|l| matches!(l, Line::Wrote { client: c, writer: w, .. } if *c == next_client && *w == next_writer))
            .await;
        let (written, pg, redis) = verdicts(&wrote);
        assert_eq!(written, next_token);
        assert!(pg && redis, "the next holder was refused: {wrote:?}");
        accepted.push(next_token);
        section += 1;
        // Resume the stopped holder: it writes as if it still held the lock.
        kill(stopped, Signal::SIGCONT).expect("SIGCONT the holder");
        workers[client as usize].write(writer).await;
        let wrote = lines
            .next_matching(|l| matches!(l, Line::Wrote { client: c, writer: w, .. } if *c == client && *w == writer))
            .await;
        let (written, pg, redis) = verdicts(&wrote);
        assert_eq!(
            written, token,
            "the resumed holder writes with its old token"
        );
        assert!(
            !pg && !redis,
            "the resumed holder's stale write got through: {wrote:?}"
        );
        refused.push(token);
    }
    for worker in &mut workers {
        let _ = worker.child.start_kill();
    }

    // What the stores kept: every accepted write, in token order, and none
    // of the refused ones.
    let pg_tokens: Vec<u64> = postgres
        .psql(&format!("SELECT token FROM {PG_HISTORY} ORDER BY id"))
        .await
        .expect("read the history")
        .lines()
        .map(|t| t.parse().expect("a token"))
        .collect();
    let redis_tokens: Vec<u64> = redis
        .command(&["LRANGE", &redis_history(), "0", "-1"])
        .await
        .expect("read the list")
        .split_whitespace()
        .map(|entry| {
            entry
                .split(':')
                .next()
                .and_then(|t| t.parse().ok())
                .expect("token:client:writer")
        })
        .collect();
    for (store, history) in [("postgres", &pg_tokens), ("redis", &redis_tokens)] {
        assert_eq!(
            history, &accepted,
            "{store} kept exactly the accepted writes, in order"
        );
        assert!(
            history.windows(2).all(|w| w[0] <= w[1]),
            "{store}: a token went down: {history:?}"
        );
        for token in &refused {
            assert!(
                !history.contains(token),
                "{store} kept the stale write of {token}"
            );
        }
    }
    assert!(refused.len() >= 4, "pauses: {refused:?}");
}
