//! The two traits every test server implements: [`TestServer`] (start it,
//! find it) and [`FaultControl`] (pause, resume, kill and restart it).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use crate::clock::ServerClock;
use crate::process::{ProcessSlot, ServerError};

/// Fault injection on a server process the testkit started: what fault
/// tests and the fault suite do to servers. Object-safe, so a deployment can
/// hand out `&dyn FaultControl` for whichever of its servers a test picks.
///
/// Implementors give the process and how to start it again; the rest is
/// provided.
#[async_trait::async_trait]
pub trait FaultControl: Send + Sync {
    /// The server's process.
    fn process(&self) -> &ProcessSlot;

    /// Kills the server if it runs, then starts it again on the same port,
    /// in the same directory and with the same options, and waits until it
    /// is ready. On failure the server stays killed.
    async fn try_restart(&self) -> Result<(), ServerError>;

    /// The server's PID, `None` while it is killed (or has died).
    fn pid(&self) -> Option<u32> {
        self.process().pid()
    }

    /// Freezes the server with SIGSTOP (returning once all its threads
    /// stopped; for PostgreSQL, its backends and other children too):
    /// connections are still accepted by the kernel but nothing is answered
    /// until [`resume`](Self::resume). Does nothing while the server is
    /// killed.
    fn pause(&self) {
        self.process().pause();
    }

    /// Continues a paused server with SIGCONT.
    fn resume(&self) {
        self.process().resume();
    }

    /// Kills the server with SIGKILL (for PostgreSQL, its backends and other
    /// children too) and reaps it. The port and directory are kept for
    /// [`restart`](Self::restart). Idempotent.
    fn kill(&self) {
        self.process().kill();
    }

    /// The server's wall clock, if it was started with one that a test can
    /// move (see [`ServerClock`]).
    fn clock(&self) -> Option<&ServerClock> {
        self.process().clock()
    }

    /// Like [`try_restart`](Self::try_restart).
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started.
    async fn restart(&self) {
        if let Err(e) = self.try_restart().await {
            panic!("cannot restart the server: {e}");
        }
    }
}

/// A real server run by the testkit as a child process: on a free loopback
/// port, in a temporary directory of its own, killed when dropped and when
/// the test process dies. A missing binary is a loud error that says how to
/// install it (`scripts/install-services.sh`).
#[async_trait::async_trait]
pub trait TestServer: FaultControl + Sized + 'static {
    /// Starts a server with the default options and waits until it is ready.
    async fn try_start() -> Result<Self, ServerError>;

    /// Like [`try_start`](Self::try_start).
    ///
    /// # Panics
    ///
    /// With the [`ServerError`]'s message when it cannot be started, e.g.
    /// when the server is not installed.
    async fn start() -> Self {
        Self::try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// The TCP port (the same across restarts).
    fn port(&self) -> u16;

    /// The address the server binds: 127.0.0.1, or its network namespace's
    /// (see [`Fabric`](crate::Fabric)).
    fn host(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    /// `HOST:PORT`.
    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host(), self.port())
    }

    /// A lockkit URL of this server with the default settings.
    fn url(&self) -> String;

    /// The server's directory (data, configuration, logs); removed when the
    /// server is dropped.
    fn dir(&self) -> &Path;
}

/// The [`FaultControl`], [`TestServer`] and `Debug` impls of a server of
/// one process (fields `process`, `port` and `dir`, and an inherent `async
/// fn launch`): started by `start`, reached at `url`, shown with its port,
/// pid, directory and the `debug` fields; with `kill_on_drop`, its `Drop`
/// too, which kills the process before its directory goes.
macro_rules! one_process_server {
    (
        $server:ident,
        start: $start:expr,
        url: |$this:ident| $url:expr,
        $(host: |$hosted:ident| $host:expr,)?
        debug: |$shown:ident| { $($field:literal => $value:expr),* $(,)? }
        $(, $kill:ident)? $(,)?
    ) => {
        impl ::std::fmt::Debug for $server {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let $shown = self;
                f.debug_struct(stringify!($server))
                    .field("port", &self.port)
                    .field("pid", &$crate::server::FaultControl::pid(self))
                    .field("dir", &self.dir.path())
                    $(.field($field, $value))*
                    .finish()
            }
        }

        #[async_trait::async_trait]
        impl $crate::server::FaultControl for $server {
            fn process(&self) -> &$crate::process::ProcessSlot {
                &self.process
            }

            async fn try_restart(&self) -> Result<(), $crate::process::ServerError> {
                self.launch().await
            }
        }

        #[async_trait::async_trait]
        impl $crate::server::TestServer for $server {
            async fn try_start() -> Result<$server, $crate::process::ServerError> {
                $start.await
            }

            fn port(&self) -> u16 {
                self.port
            }

            $(
                fn host(&self) -> ::std::net::IpAddr {
                    let $hosted = self;
                    $host
                }
            )?

            fn url(&self) -> String {
                let $this = self;
                $url
            }

            fn dir(&self) -> &::std::path::Path {
                self.dir.path()
            }
        }

        $(one_process_server!(@$kill $server);)?
    };
    (@kill_on_drop $server:ident) => {
        impl Drop for $server {
            fn drop(&mut self) {
                // Before the temporary directory is removed.
                $crate::server::FaultControl::kill(self);
            }
        }
    };
}

pub(crate) use one_process_server;
