//! Release notifications on SQLite, from the file system: every commit
//! appends to the database's write-ahead log, and on Linux the kernel tells
//! a watcher of the log's directory (`inotify`) that the log was written. A
//! waiter of any name on the database tries again after each such write. A
//! release is one; a refused attempt changes no page and writes nothing, so
//! waiters do not wake one another. Other commits (grants, renewals of other
//! names) wake waiters too, for one attempt each. Elsewhere than Linux, and
//! for an in-memory database, waiters back off as in MySQL's `lease` mode.

use std::ffi::OsString;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;

use lockkit_core::backend::ReleaseWatch;

/// The watcher of one database's write-ahead log, started by the first
/// waiter and running while the client or a waiter's watch lives.
#[derive(Debug)]
pub(super) struct WalWatch {
    /// The directory of the database file.
    dir: PathBuf,
    /// The log's file name in it (`<database>-wal`).
    wal: OsString,
    /// A receiver of the running watcher's count of writes; `None` before
    /// the first waiter.
    started: Mutex<Option<tokio::sync::watch::Receiver<u64>>>,
}

impl WalWatch {
    /// The watcher of the log of the database file `database`; `None` where
    /// there is none to watch.
    pub(super) fn new(database: &Path) -> Option<WalWatch> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let database = std::path::absolute(database).ok()?;
        let mut wal = database.file_name()?.to_owned();
        wal.push("-wal");
        Some(WalWatch {
            dir: database.parent()?.to_owned(),
            wal,
            started: Mutex::new(None),
        })
    }

    /// A watch that fires after each write of the log.
    pub(super) fn watch(&self) -> ReleaseWatch {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_none() {
            match watch_log(&self.dir, self.wal.clone()) {
                Ok(receiver) => *started = Some(receiver),
                Err(error) => {
                    tracing::debug!(%error, dir = %self.dir.display(), "sqlite: cannot watch the write-ahead log; waiters back off");
                    return ReleaseWatch::none();
                }
            }
        }
        started
            .as_ref()
            .map_or_else(ReleaseWatch::none, |receiver| {
                ReleaseWatch::from_receiver(receiver.clone())
            })
    }
}

/// Starts a task that counts the writes of `dir/wal` until every receiver
/// is gone; the watch is registered before this returns, so no later write
/// goes unseen.
#[cfg(target_os = "linux")]
fn watch_log(dir: &Path, wal: OsString) -> std::io::Result<tokio::sync::watch::Receiver<u64>> {
    use futures_util::StreamExt as _;
    use inotify::{Inotify, WatchMask};

    let inotify = Inotify::init()?;
    // The directory, not the file: the log is created by the first write
    // after the last connection closed, and deleted then.
    inotify
        .watches()
        .add(dir, WatchMask::MODIFY | WatchMask::CREATE)?;
    let mut events = inotify.into_event_stream([0_u8; 4096])?;
    let (sender, receiver) = tokio::sync::watch::channel(0_u64);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = sender.closed() => break,
                event = events.next() => match event {
                    Some(Ok(event)) if event.name.as_deref() == Some(wal.as_os_str()) => {
                        sender.send_modify(|writes| *writes = writes.wrapping_add(1));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::warn!(%error, "sqlite: the write-ahead log's watcher failed; waiters back off");
                        break;
                    }
                    None => break,
                },
            }
        }
    });
    Ok(receiver)
}

#[cfg(not(target_os = "linux"))]
fn watch_log(_dir: &Path, _wal: OsString) -> std::io::Result<tokio::sync::watch::Receiver<u64>> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use sqlx::ConnectOptions as _;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

    use super::*;

    /// A commit by another connection fires a waiter's watch: the log's
    /// write is what wakes it, not a timer. (The bound is only there so a
    /// broken watcher fails rather than hangs.)
    #[tokio::test]
    async fn a_commit_fires_the_watch() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("locks.db");
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .connect()
            .await
            .expect("open the database");
        let watcher = WalWatch::new(&path).expect("a file database is watched");
        let mut watch = watcher.watch();
        assert!(watch.is_active());
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut conn)
            .await
            .expect("a commit");
        tokio::time::timeout(Duration::from_secs(30), watch.changed())
            .await
            .expect("the commit's write of the log fired the watch");
        // Later waiters share the running watcher.
        let mut second = watcher.watch();
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut conn)
            .await
            .expect("a commit");
        tokio::time::timeout(Duration::from_secs(30), second.changed())
            .await
            .expect("the second waiter's watch fired");
    }
}
