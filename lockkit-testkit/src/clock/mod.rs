//! Servers whose wall clock a test can move: the clock faults of the fault
//! suite (a server's clock that leaps forward, then back).
//!
//! A server started with a [`ServerClock`] runs with `LD_PRELOAD` of a small
//! library of lockkit's own (`shift.c`, compiled with `cc` once per machine
//! and source), which adds an offset to `CLOCK_REALTIME`, `gettimeofday` and
//! `time`, read from a file in the server's directory. Monotonic clocks are
//! untouched. (Debian's libfaketime 0.9.10 does not start Debian's
//! redis-server 7.0.15: its jemalloc reads the clock while libfaketime
//! initialises. This library reads every clock through the raw system call
//! and never allocates.)
//!
//! It reaches what a server reads through libc: redis-server, mariadbd,
//! postgres and the JVM (ZooKeeper). etcd is written in Go, whose runtime
//! reads the clock through the vDSO without libc, so its clock cannot be
//! moved this way.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::process::{
    ServerError, copy_setting, create_shared_dir, default_templates_root, find_binary, run_tool,
};

/// The library's source.
const SOURCE: &str = include_str!("shift.c");

/// The environment variable naming the offset file.
const OFFSET_FILE_ENV: &str = "LOCKKIT_CLOCK_OFFSET_FILE";

/// How old the library's last read of the offset may be before it reads
/// the file again (see `shift.c`).
const OFFSET_REREAD: std::time::Duration = std::time::Duration::from_millis(1);

/// The offset file's name in a server's directory.
const OFFSET_FILE: &str = "clock-offset-ms";

const CC_HINT: &str = "a C compiler (`cc`) builds the clock library for clock faults: \
                       `apt-get install gcc` (scripts/install-services.sh installs it)";

/// The wall clock of one server, which [`set_offset_ms`](Self::set_offset_ms)
/// moves while the server runs (also across its restarts).
#[derive(Debug)]
pub struct ServerClock {
    file: PathBuf,
}

impl ServerClock {
    /// A clock at offset 0 whose file lives in `dir` (the server's
    /// directory), readable by the server whatever user it runs as.
    pub(crate) fn in_dir(dir: &Path) -> Result<Self, ServerError> {
        let clock = ServerClock {
            file: dir.join(OFFSET_FILE),
        };
        clock.set_offset_ms(0)?;
        Ok(clock)
    }

    /// Moves the server's wall clock to `offset_ms` milliseconds away from
    /// the machine's (negative: behind), and returns once every clock read
    /// the server makes from then on sees it: the library reads the offset
    /// again when its last read is a millisecond old, so this waits out
    /// that millisecond (twice over) after writing it.
    pub fn set_offset_ms(&self, offset_ms: i64) -> Result<(), ServerError> {
        let io_error = |source| ServerError::Io {
            what: format!("write the clock offset {}", self.file.display()),
            source,
        };
        // Written beside it and renamed over it: a read sees one whole value.
        let next = self.file.with_extension("next");
        fs::write(&next, format!("{offset_ms}\n")).map_err(io_error)?;
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&next, fs::Permissions::from_mode(0o644)).map_err(io_error)?;
        fs::rename(&next, &self.file).map_err(io_error)?;
        std::thread::sleep(OFFSET_REREAD * 2);
        Ok(())
    }

    /// The offset set last, in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        fs::read_to_string(&self.file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `command` with the library preloaded and this clock's file named.
    pub(crate) fn wrap(&self, command: &Command) -> Result<Command, ServerError> {
        let library = library()?;
        let mut wrapped = Command::new(command.get_program());
        wrapped.args(command.get_args());
        copy_setting(command, &mut wrapped);
        let mut preload = OsString::from(library);
        if let Some(other) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(other);
        }
        wrapped
            .env("LD_PRELOAD", preload)
            .env(OFFSET_FILE_ENV, &self.file);
        Ok(wrapped)
    }
}

/// The compiled library: `<templates root>/clock-shift-<hash>.so`, built
/// once per machine and source (beside a temporary name, then renamed, so
/// that test processes racing to build it each see a whole file).
fn library() -> Result<&'static Path, ServerError> {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    if let Some(path) = LIBRARY.get() {
        return Ok(path);
    }
    let root = default_templates_root();
    create_shared_dir(&root)?;
    let path = root.join(format!("clock-shift-{:016x}.so", fnv1a(SOURCE.as_bytes())));
    if !path.is_file() {
        build(&root, &path)?;
    }
    Ok(LIBRARY.get_or_init(|| path))
}

fn build(root: &Path, path: &Path) -> Result<(), ServerError> {
    let cc = find_binary("cc", CC_HINT)?;
    let io_error = |what: String| move |source| ServerError::Io { what, source };
    let work = tempfile::Builder::new()
        .prefix("clock-shift.build-")
        .tempdir_in(root)
        .map_err(io_error(format!(
            "create a directory in {}",
            root.display()
        )))?;
    let source = work.path().join("shift.c");
    fs::write(&source, SOURCE).map_err(io_error(format!("write {}", source.display())))?;
    let built = work.path().join("shift.so");
    let mut compile = Command::new(&cc);
    compile
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&built)
        .arg(&source);
    run_tool("cc, compiling the clock library,", &mut compile, CC_HINT)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&built, fs::Permissions::from_mode(0o755))
        .map_err(io_error(format!("chmod {}", built.display())))?;
    fs::rename(&built, path).map_err(io_error(format!("move the library to {}", path.display())))
}

/// FNV-1a, 64 bits: names the library after its source.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
