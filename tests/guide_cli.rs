//! Every `console` sample of the README and the guide, run as a reader
//! would type it: the `lockkit` binary on the PATH, a fresh working
//! directory per sample (so the default SQLite file starts empty), and the
//! servers a sample names started by the testkit.
//!
//! A sample is a fenced block tagged `console`: lines starting with `$ ` are
//! commands, run in one shell in order; the lines after a command are its
//! expected standard output. `[..]` in an expected line matches any text,
//! and a line `...` any number of lines. Every command must exit with 0 (a
//! sample that expects a failure shows it with `; echo "exit $?"`).
//!
//! Addresses: `127.0.0.1:6379` is replaced by a Redis server's, and
//! `$DATABASE_URL` is set to a PostgreSQL server's URL (with its `psql` on
//! the PATH), each started only for the samples that use it.
#![cfg(all(feature = "cli", feature = "redis", feature = "postgres"))]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lockkit_testkit::{PostgresServer, RedisServer, TestServer};
use tokio::process::Command;

/// Longest one sample may run.
const SAMPLE_LIMIT: Duration = Duration::from_secs(60);

/// The Redis address the samples are written with.
const SAMPLE_REDIS: &str = "127.0.0.1:6379";

#[derive(Debug)]
struct Sample {
    file: PathBuf,
    line: usize,
    commands: Vec<(String, Vec<String>)>,
}

/// The Markdown files whose samples are run: the README and every page of
/// the guide.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs/guide")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/guide") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn samples(file: &Path) -> Vec<Sample> {
    let text = std::fs::read_to_string(file).expect("a Markdown file");
    let mut out = Vec::new();
    let mut current: Option<Sample> = None;
    for (index, line) in text.lines().enumerate() {
        match current.as_mut() {
            None if line.trim_end() == "```console" => {
                current = Some(Sample {
                    file: file.to_owned(),
                    line: index + 1,
                    commands: Vec::new(),
                });
            }
            None => {}
            Some(_) if line.trim_end() == "```" => out.extend(current.take()),
            Some(sample) => {
                if let Some(command) = line.strip_prefix("$ ") {
                    sample.commands.push((command.to_owned(), Vec::new()));
                } else {
                    let Some((_, expected)) = sample.commands.last_mut() else {
                        panic!(
                            "{}:{}: output before any command",
                            file.display(),
                            index + 1
                        )
                    };
                    expected.push(line.to_owned());
                }
            }
        }
    }
    assert!(
        current.is_none(),
        "{}: an unclosed console block",
        file.display()
    );
    out
}

/// Whether `actual` matches `pattern`, where `[..]` stands for any text.
fn line_matches(pattern: &str, actual: &str) -> bool {
    let mut parts = pattern.split("[..]");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Whether `actual` matches `expected`, where a line `...` stands for any
/// number of lines.
fn lines_match(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, more)| line_matches(first, line) && lines_match(rest, more)),
    }
}

struct Servers {
    redis: Option<RedisServer>,
    postgres: Option<PostgresServer>,
}

impl Servers {
    async fn for_samples(samples: &[Sample]) -> Servers {
        let mentions = |needle: &str| {
            samples
                .iter()
                .any(|s| s.commands.iter().any(|(c, _)| c.contains(needle)))
        };
        Servers {
            redis: if mentions(SAMPLE_REDIS) {
                Some(RedisServer::start().await)
            } else {
                None
            },
            postgres: if mentions("$DATABASE_URL") {
                Some(PostgresServer::start().await)
            } else {
                None
            },
        }
    }

    fn rewrite(&self, command: &str) -> String {
        match &self.redis {
            Some(redis) => command.replace(SAMPLE_REDIS, &format!("127.0.0.1:{}", redis.port())),
            None => command.to_owned(),
        }
    }
}

/// Runs one sample; an error says what differed.
async fn run(sample: &Sample, servers: &Servers) -> Result<(), String> {
    const MARK: &str = "@@lockkit-sample-end";
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut script = String::from("set +e\n");
    for (command, _) in &sample.commands {
        script.push_str(&servers.rewrite(command));
        script.push_str(&format!("\nprintf '\\n{MARK} %s\\n' \"$?\"\n"));
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_lockkit"))
        .parent()
        .expect("the binary's directory");
    // With a PostgreSQL server, its client `psql` is on the PATH too, as
    // on a reader's machine with PostgreSQL installed.
    let psql = match &servers.postgres {
        Some(postgres) => format!("{}:", postgres.bin_dir().display()),
        None => String::new(),
    };
    let path = format!(
        "{}:{psql}{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut shell = Command::new("bash");
    shell
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("LOCKKIT_URL")
        .env_remove("LOCKKIT_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match &servers.postgres {
        Some(postgres) => shell.env("DATABASE_URL", postgres.url()),
        None => shell.env_remove("DATABASE_URL"),
    };
    let output = tokio::time::timeout(SAMPLE_LIMIT, shell.output())
        .await
        .map_err(|_| format!("ran longer than {SAMPLE_LIMIT:?}"))?
        .map_err(|e| format!("bash: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut sections = Vec::new();
    let mut current = Vec::new();
    for line in stdout.lines() {
        if let Some(status) = line.strip_prefix(MARK) {
            while current.last().is_some_and(|l: &&str| l.is_empty()) {
                current.pop();
            }
            sections.push((std::mem::take(&mut current), status.trim().to_owned()));
        } else {
            current.push(line);
        }
    }
    for (i, (command, expected)) in sample.commands.iter().enumerate() {
        let Some((actual, status)) = sections.get(i) else {
            return Err(format!("`{command}` did not finish\nstderr:\n{stderr}"));
        };
        if status != "0" {
            return Err(format!(
                "`{command}` exited with {status}\nstdout:\n{}\nstderr:\n{stderr}",
                actual.join("\n")
            ));
        }
        if !lines_match(expected, actual) {
            return Err(format!(
                "`{command}` printed\n{}\nwhere the sample shows\n{}\nstderr:\n{stderr}",
                actual.join("\n"),
                expected.join("\n")
            ));
        }
    }
    Ok(())
}

#[tokio::test]
#[allow(clippy::print_stdout, reason = "the count is for a reader of the run")]
async fn every_console_sample_runs_as_shown() {
    let samples: Vec<Sample> = documents().iter().flat_map(|f| samples(f)).collect();
    let commands: usize = samples.iter().map(|s| s.commands.len()).sum();
    assert!(
        samples.len() >= 10 && commands >= 20,
        "only {} samples with {commands} commands were found: the parser lost them",
        samples.len()
    );
    let servers = Servers::for_samples(&samples).await;
    let mut failures = Vec::new();
    for sample in &samples {
        if let Err(why) = run(sample, &servers).await {
            failures.push(format!("{}:{}: {why}", sample.file.display(), sample.line));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    println!(
        "{} samples, {commands} commands: all ran as shown",
        samples.len()
    );
}

/// Shell blocks are for other programs: a `lockkit` command in one would
/// escape the test above.
#[test]
fn lockkit_commands_appear_only_in_console_samples() {
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        let mut fence: Option<String> = None;
        for (index, line) in text.lines().enumerate() {
            if let Some(info) = line.trim_start().strip_prefix("```") {
                fence = match fence {
                    None => Some(info.trim().to_owned()),
                    Some(_) => None,
                };
                continue;
            }
            if let Some(info) = &fence
                && matches!(info.as_str(), "sh" | "bash" | "shell" | "")
            {
                let command = line.trim_start().trim_start_matches("$ ");
                assert!(
                    !command.starts_with("lockkit "),
                    "{}:{}: a lockkit command in a `{info}` block; make it a `console` sample",
                    file.display(),
                    index + 1
                );
            }
        }
    }
}

#[test]
fn the_matcher_matches_what_it_should() {
    assert!(line_matches("token [..]", "token 42"));
    assert!(line_matches("[..]", ""));
    assert!(line_matches("a [..] b [..]", "a x b y"));
    assert!(!line_matches("token [..]", "tok 42"));
    assert!(!line_matches("exit 75", "exit 0"));
    let lines = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(lines_match(&lines(&["...", "end"]), &["a", "b", "end"]));
    assert!(lines_match(&lines(&[]), &[]));
    assert!(!lines_match(&lines(&[]), &["unexpected"]));
    assert!(!lines_match(&lines(&["a"]), &["a", "b"]));
}
