//! [`Driver`]: how a backend declares itself to `lockkit::connect`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::Result;
use crate::lock::DistributedLock;

/// What a [`Driver`]'s connect function returns: a client behind the trait.
pub type ConnectFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'a>>;

/// A driver's connect function: a URL of one of its schemes in, a client out.
pub type ConnectFn = for<'a> fn(&'a str) -> ConnectFuture<'a>;

/// One backend's declaration: its name, the URL schemes it serves, the cargo
/// feature of the `lockkit` facade that compiles it in, and its connect
/// function.
///
/// Every backend crate exports one (`lockkit_redis::DRIVER`, …); the facade's
/// `lockkit::connect` walks the list of the compiled-in ones, and
/// `lockkit::Registry` takes third-party drivers beside them.
///
/// ```
/// use lockkit_core::backend::{Driver, ConnectFuture, boxed_connect};
/// use lockkit_core::MemoryLock;
///
/// fn connect(url: &str) -> ConnectFuture<'_> {
///     boxed_connect(async move { MemoryLock::from_url(&url.replacen("my-mem", "memory", 1)) })
/// }
///
/// const MY_DRIVER: Driver = Driver::new("my-mem", &["my-mem"], connect);
/// assert!(MY_DRIVER.serves("MY-MEM"));
/// assert_eq!(MY_DRIVER.feature(), None);
/// ```
#[derive(Clone, Copy)]
pub struct Driver {
    name: &'static str,
    schemes: &'static [&'static str],
    feature: Option<&'static str>,
    connect: ConnectFn,
}

impl Driver {
    /// A driver named `name` (used in logs, errors and tables) that serves
    /// the URL `schemes` (lower case, without `://`) with `connect`.
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        connect: ConnectFn,
    ) -> Self {
        Driver {
            name,
            schemes,
            feature: None,
            connect,
        }
    }

    /// The cargo feature of the `lockkit` facade that compiles this driver
    /// in (built-in drivers only).
    pub const fn with_feature(mut self, feature: &'static str) -> Self {
        self.feature = Some(feature);
        self
    }

    /// The backend's name, e.g. `redis`.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The URL schemes it serves, e.g. `["redis", "rediss", …]`.
    pub const fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// The facade's cargo feature that compiles it in, if it is built in.
    pub const fn feature(&self) -> Option<&'static str> {
        self.feature
    }

    /// Whether it serves `scheme` (case-insensitive).
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }

    /// Connects to `url`, which has one of [`schemes`](Self::schemes).
    pub fn connect<'a>(&self, url: &'a str) -> ConnectFuture<'a> {
        (self.connect)(url)
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .finish_non_exhaustive()
    }
}

/// Boxes a backend's own `connect` future as a [`ConnectFuture`], for
/// writing a [`ConnectFn`] in one line.
pub fn boxed_connect<'a, L, F>(connect: F) -> ConnectFuture<'a>
where
    L: DistributedLock + 'static,
    F: Future<Output = Result<L>> + Send + 'a,
{
    Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn DistributedLock>) })
}
