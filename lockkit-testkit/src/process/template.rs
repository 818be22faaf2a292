//! Template data directories, built once per machine and copied per server.

use std::fs::{self};
use std::future::Future;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Uid;

use super::*;

/// The directory under the system's temporary directory where template data
/// directories are kept (see [`ensure_template`]).
pub(crate) const TEMPLATES_DIR: &str = "lockkit-testkit-templates";

/// `<tmp>/lockkit-testkit-templates`: where template data directories are
/// kept unless a builder names another directory.
pub(crate) fn default_templates_root() -> PathBuf {
    std::env::temp_dir().join(TEMPLATES_DIR)
}

/// Returns the template directory `root/name`, building it first unless it
/// exists.
///
/// `build` fills a new, empty directory beside it
/// (`root/name.build-XXXXXX`), which is then renamed into place, so a
/// template that exists is complete. Builders racing for one template (tasks
/// of this process, or other processes: cargo nextest runs each test in its
/// own) build their own directories; the first rename wins and the others
/// discard theirs. Within this process builds are serialised, so the work is
/// done once. A failed build is removed.
///
/// `root` is created if missing, world-writable and sticky like `/tmp`, so
/// that the templates of different users (each keyed by its owner) can live
/// side by side.
pub(crate) async fn ensure_template<F, Fut>(
    root: &Path,
    name: &str,
    build: F,
) -> Result<PathBuf, ServerError>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = Result<(), ServerError>>,
{
    static BUILDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let template = root.join(name);
    if template.is_dir() {
        return Ok(template);
    }
    let _building = BUILDING.lock().await;
    if template.is_dir() {
        return Ok(template);
    }
    create_shared_dir(root)?;
    let build_dir = tempfile::Builder::new()
        .prefix(&format!("{name}.build-"))
        .tempdir_in(root)
        .map_err(|source| ServerError::Io {
            what: format!("create a directory in {} to build {name}", root.display()),
            source,
        })?;
    let started = Instant::now();
    build(build_dir.path().to_path_buf()).await?;
    publish_template(build_dir, &template)?;
    tracing::debug!(
        "built the template {} in {:?}",
        template.display(),
        started.elapsed()
    );
    Ok(template)
}

/// Renames a finished build to `template`, or discards it when another
/// builder got there first.
pub(crate) fn publish_template(
    build: tempfile::TempDir,
    template: &Path,
) -> Result<(), ServerError> {
    match fs::rename(build.path(), template) {
        Ok(()) => {
            // Nothing is left at the build's path to remove.
            let _ = build.keep();
            Ok(())
        }
        Err(_) if template.is_dir() => {
            tracing::debug!(
                "{} was built by another process meanwhile; discarding ours",
                template.display()
            );
            Ok(())
        }
        Err(source) => Err(ServerError::Io {
            what: format!("move {} to {}", build.path().display(), template.display()),
            source,
        }),
    }
}

/// Creates `dir` (and its parents) unless it exists; a directory this
/// process creates is made world-writable and sticky, like `/tmp`.
pub(crate) fn create_shared_dir(dir: &Path) -> Result<(), ServerError> {
    if dir.is_dir() {
        return Ok(());
    }
    let io_error = |source| ServerError::Io {
        what: format!("create {}", dir.display()),
        source,
    };
    fs::create_dir_all(dir).map_err(io_error)?;
    let ours = fs::metadata(dir).map_err(io_error)?.uid() == Uid::effective().as_raw();
    if ours {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).map_err(io_error)?;
    }
    Ok(())
}

/// Copies the directory `template` to `dest` (which must not exist) with
/// `cp -a`: modes, owners and timestamps preserved.
pub(crate) async fn copy_template(template: &Path, dest: &Path) -> Result<(), ServerError> {
    let mut cp = tokio::process::Command::new("cp");
    cp.arg("-a").arg("--").arg(template).arg(dest);
    run_helper(
        &format!("cp -a {} {}", template.display(), dest.display()),
        &mut cp,
        Duration::from_secs(60),
    )
    .await
    .map(drop)
}
