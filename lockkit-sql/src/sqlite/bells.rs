//! Release bells of `lease` mode on SQLite: files beside the database whose
//! changes wake the waiters of other processes (Linux, through inotify).
//!
//! A release writes one byte to the bell of its name's bucket,
//! `<database>-lockkit-bells/<bucket>` ([`BUCKETS`] files at most, however
//! many names are used). A client with waiters watches that directory once
//! and wakes its waiters of the names whose bucket rang; waiters of another
//! name in the same bucket wake for nothing and wait again. A release that
//! reserves the lock for the client at the head of the name's line rings
//! that client's own bell instead, `client-<bucket>` (the bucket of the
//! client's id, [`BUCKETS`] files at most however many clients come and
//! go), which wakes every waiter of the clients of that bucket, and passes
//! on the turns that none of their waiters wants any longer (see
//! [`Turns`]). Where there are no bells (another system, an in-memory
//! database, a directory that cannot be made) waiters back off, never past
//! the holder's expiry, as they do without bells.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lockkit_core::backend::{NotifyHub, ReleaseWatch};

use crate::lease::Turns;

/// How many bell files a database has at most.
pub(super) const BUCKETS: u64 = 64;

/// The bucket of `name`: FNV-1a, so that every client, whatever its build,
/// rings and watches the same file for a name.
fn bucket(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % BUCKETS
}

/// The directory of the bells of the database file at `database`.
pub(crate) fn bells_dir(database: &Path) -> PathBuf {
    let mut dir = database.as_os_str().to_owned();
    dir.push("-lockkit-bells");
    PathBuf::from(dir)
}

/// The file name of the bell of the clients of `client`'s bucket.
fn client_bell(client: &str) -> String {
    Bell::Client(bucket(client)).file_name()
}

/// How the file name of a clients' bell begins (see [`Bell::file_name`]).
const CLIENT_BELL_PREFIX: &str = "client-";

/// A bell file: a bucket of names' (see [`bucket`]), or a bucket of
/// clients' (see [`client_bell`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bell {
    Name(u64),
    Client(u64),
}

impl Bell {
    /// How many bell files there are.
    const SLOTS: usize = 2 * BUCKETS as usize;

    /// Where the bell's file is kept among [`SLOTS`](Self::SLOTS).
    fn slot(self) -> usize {
        match self {
            Bell::Name(bucket) => bucket as usize,
            Bell::Client(bucket) => (BUCKETS + bucket) as usize,
        }
    }

    /// The file's name in the bells' directory.
    fn file_name(self) -> String {
        match self {
            Bell::Name(bucket) => bucket.to_string(),
            Bell::Client(bucket) => format!("{CLIENT_BELL_PREFIX}{bucket}"),
        }
    }
}

/// A client's bells: the files it rang (kept open), and its watch.
#[derive(Debug)]
pub(super) struct Bells {
    /// `None` where there are no bells.
    dir: Option<PathBuf>,
    /// This client's own bell (see [`client_bell`]).
    own: String,
    /// What the client does when its own bell rings; none without a line.
    turns: Option<Turns>,
    hub: NotifyHub,
    /// The bell files rung so far, kept open: by [`Bell::slot`].
    rung: Mutex<Vec<Option<File>>>,
    /// Once the first waiter asked: the task that reads the watch, or why
    /// there is none.
    watching: Mutex<Option<Watching>>,
}

#[derive(Debug)]
enum Watching {
    On(tokio::task::AbortHandle),
    Off,
}

impl Bells {
    /// The bells of the database file at `database`, for the client
    /// `client` and its `turns`; none for `None` (an in-memory database)
    /// and on systems without inotify.
    pub(super) fn new(database: Option<&Path>, client: &str, turns: Option<Turns>) -> Self {
        Bells {
            dir: database
                .filter(|_| cfg!(target_os = "linux"))
                .map(bells_dir),
            own: client_bell(client),
            turns,
            hub: NotifyHub::new(),
            rung: Mutex::new(std::iter::repeat_with(|| None).take(Bell::SLOTS).collect()),
            watching: Mutex::new(None),
        }
    }

    /// Rings the bell of `name`'s bucket, if any client ever watched the
    /// bells (their directory exists). Failures are only traced: the
    /// waiters then find the release on their next try.
    pub(super) fn ring(&self, name: &str) {
        self.ring_file(Bell::Name(bucket(name)));
    }

    /// Rings the bell of `client` (see [`client_bell`]): its turn came.
    pub(super) fn ring_client(&self, client: &str) {
        self.ring_file(Bell::Client(bucket(client)));
    }

    /// Rings `bell`, opening its file the first time (each release rings
    /// one: the files stay open, and no name is formatted once they are).
    fn ring_file(&self, bell: Bell) {
        let Some(dir) = &self.dir else { return };
        let mut rung = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut rung[bell.slot()];
        if slot.is_none() {
            let path = dir.join(bell.file_name());
            match std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
            {
                Ok(file) => *slot = Some(file),
                // No directory: nobody has waited yet.
                Err(error) => {
                    tracing::trace!(path = %path.display(), %error, "no bell to ring");
                    return;
                }
            }
        }
        if let Some(file) = slot
            && let Err(error) = write_bell(file)
        {
            tracing::debug!(%error, "could not ring a release bell");
            *slot = None;
        }
    }

    /// A watch on `name`, woken when its bucket's bell rings; inactive where
    /// there are no bells or they cannot be watched.
    pub(super) fn watch(&self, name: &str) -> ReleaseWatch {
        let Some(dir) = &self.dir else {
            return ReleaseWatch::none();
        };
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        let watching = watching.get_or_insert_with(|| match start(dir, &self.own, self.hub.clone(), self.turns.clone()) {
            Ok(task) => Watching::On(task),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot watch the release bells; waiting by polling");
                Watching::Off
            }
        });
        match watching {
            Watching::On(_) => self.hub.watch(&Bell::Name(bucket(name)).file_name()).0,
            Watching::Off => ReleaseWatch::none(),
        }
    }
}

impl Drop for Bells {
    fn drop(&mut self) {
        let watching = self.watching.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(Watching::On(task)) = watching.take() {
            task.abort();
        }
    }
}

/// One byte written at the start of a bell file.
#[cfg(unix)]
fn write_bell(file: &File) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_at(file, &[1], 0).map(drop)
}

#[cfg(not(unix))]
fn write_bell(_: &File) -> std::io::Result<()> {
    Ok(())
}

/// Makes the bells' directory, watches it, and spawns the task that wakes
/// the waiters of each bucket that rings, and every waiter when the
/// client's own bell (`own`) rings, its turns then passing on those that
/// no waiter wants.
#[cfg(target_os = "linux")]
fn start(
    dir: &Path,
    own: &str,
    hub: NotifyHub,
    turns: Option<Turns>,
) -> std::io::Result<tokio::task::AbortHandle> {
    use futures_util::StreamExt as _;
    use inotify::{Inotify, WatchMask};

    std::fs::create_dir_all(dir)?;
    let inotify = Inotify::init()?;
    inotify.watches().add(dir, WatchMask::MODIFY)?;
    let mut events = inotify.into_event_stream([0_u8; 1024])?;
    let own = own.to_owned();
    let task = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => match event.name.as_deref().and_then(|n| n.to_str()) {
                    Some(bell) if bell == own => {
                        hub.notify_all();
                        if let Some(turns) = &turns {
                            turns.came_for_some();
                        }
                    }
                    Some(bell) if bell.starts_with(CLIENT_BELL_PREFIX) => {}
                    Some(bucket) => {
                        hub.notify(bucket);
                    }
                    None => {}
                },
                Err(error) => {
                    // Events may be lost: everyone looks again.
                    tracing::debug!(%error, "reading the release bells failed");
                    hub.notify_all();
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(task.abort_handle())
}

#[cfg(not(target_os = "linux"))]
fn start(
    _: &Path,
    _: &str,
    _: NotifyHub,
    _: Option<Turns>,
) -> std::io::Result<tokio::task::AbortHandle> {
    Err(std::io::Error::other("release bells need inotify (Linux)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_few_and_the_same_for_a_name() {
        assert_eq!(bucket("jobs"), bucket("jobs"));
        let buckets: std::collections::HashSet<u64> =
            (0..10_000).map(|i| bucket(&format!("name-{i}"))).collect();
        assert_eq!(
            buckets.len() as u64,
            BUCKETS,
            "names spread over every bucket"
        );
        assert!(buckets.iter().all(|b| *b < BUCKETS));
    }

    #[test]
    fn every_bell_has_a_slot_and_a_file_of_its_own() {
        let bells: Vec<Bell> = (0..BUCKETS)
            .flat_map(|b| [Bell::Name(b), Bell::Client(b)])
            .collect();
        let slots: std::collections::HashSet<usize> = bells.iter().map(|b| b.slot()).collect();
        let files: std::collections::HashSet<String> =
            bells.iter().map(|b| b.file_name()).collect();
        assert_eq!(slots.len(), Bell::SLOTS);
        assert!(slots.iter().all(|s| *s < Bell::SLOTS));
        assert_eq!(files.len(), Bell::SLOTS);
        assert_eq!(Bell::Name(7).file_name(), "7");
        assert_eq!(client_bell("c"), format!("client-{}", bucket("c")));
    }

    #[test]
    fn the_bells_sit_beside_the_database() {
        assert_eq!(
            bells_dir(Path::new("/var/lib/app/locks.db")),
            Path::new("/var/lib/app/locks.db-lockkit-bells")
        );
    }
}
