//! `lockkit::connect(url)` and the [`Registry`] of backends it walks.

use std::sync::Arc;

use lockkit_core::backend::Driver;
use lockkit_core::{DistributedLock, LockError, Result};

/// One built-in backend: the facade's cargo feature that compiles it in, its
/// URL schemes (known even when the feature is off, for
/// [`LockError::BackendNotCompiled`]), and its driver when compiled in. A
/// test checks that the schemes here are the driver's own.
struct Builtin {
    feature: &'static str,
    schemes: &'static [&'static str],
    driver: Option<Driver>,
}

/// Every built-in backend, in the order of the docs' tables. Adding a
/// backend means one line here (and its driver in its own crate).
const BUILTINS: &[Builtin] = &[
    Builtin {
        feature: "(always on)",
        schemes: &["memory"],
        driver: Some(lockkit_core::MEMORY_DRIVER),
    },
    Builtin {
        feature: "redis",
        schemes: &["redis", "rediss", "redis+cluster", "redis+sentinel"],
        #[cfg(feature = "redis")]
        driver: Some(lockkit_redis::DRIVER),
        #[cfg(not(feature = "redis"))]
        driver: None,
    },
    Builtin {
        feature: "redlock",
        schemes: &["redlock"],
        #[cfg(feature = "redlock")]
        driver: Some(lockkit_redlock::DRIVER),
        #[cfg(not(feature = "redlock"))]
        driver: None,
    },
    Builtin {
        feature: "zk",
        schemes: &["zk"],
        #[cfg(feature = "zk")]
        driver: Some(lockkit_zk::DRIVER),
        #[cfg(not(feature = "zk"))]
        driver: None,
    },
    Builtin {
        feature: "etcd",
        schemes: &["etcd"],
        #[cfg(feature = "etcd")]
        driver: Some(lockkit_etcd::DRIVER),
        #[cfg(not(feature = "etcd"))]
        driver: None,
    },
    Builtin {
        feature: "postgres",
        schemes: &["postgres", "postgresql"],
        #[cfg(feature = "postgres")]
        driver: Some(lockkit_sql::POSTGRES_DRIVER),
        #[cfg(not(feature = "postgres"))]
        driver: None,
    },
    Builtin {
        feature: "mysql",
        schemes: &["mysql", "mariadb"],
        #[cfg(feature = "mysql")]
        driver: Some(lockkit_sql::MYSQL_DRIVER),
        #[cfg(not(feature = "mysql"))]
        driver: None,
    },
    Builtin {
        feature: "sqlite",
        schemes: &["sqlite"],
        #[cfg(feature = "sqlite")]
        driver: Some(lockkit_sql::SQLITE_DRIVER),
        #[cfg(not(feature = "sqlite"))]
        driver: None,
    },
];

/// Every URL scheme lockkit itself knows, compiled in or not, in the order
/// of the docs' tables (`memory`, `redis`, `rediss`, …).
pub fn known_schemes() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().flat_map(|b| b.schemes.iter().copied())
}

/// The backends a URL can name: the built-in ones that are compiled in, and
/// any registered on purpose.
///
/// [`connect`] uses [`Registry::builtin`]. A program with a backend of its
/// own (a crate that exports a [`Driver`]) registers it and connects through
/// the registry; a registered driver takes precedence over a built-in one
/// with the same scheme.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit::Result<()> {
/// use lockkit::Registry;
/// use lockkit::core::MemoryLock;
/// use lockkit::core::backend::{ConnectFuture, Driver, boxed_connect};
///
/// // A third-party backend: here, an in-process store under its own scheme.
/// fn connect_scratch(_url: &str) -> ConnectFuture<'_> {
///     boxed_connect(async { Ok(MemoryLock::with_store(lockkit::MemoryStore::new())) })
/// }
/// const SCRATCH: Driver = Driver::new("scratch", &["scratch"], connect_scratch);
///
/// let mut registry = Registry::builtin();
/// registry.register(SCRATCH);
/// let locks = registry.connect("scratch://").await?;
/// assert!(locks.try_acquire("job", &lockkit::LockOptions::new()).await?.is_some());
/// assert!(registry.drivers().any(|d| d.name() == "memory"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// Registered drivers, newest first, then the built-in ones.
    drivers: Vec<Driver>,
    builtins: bool,
}

impl Registry {
    /// An empty registry: no backend at all, not even `memory://`.
    pub fn new() -> Self {
        Registry::default()
    }

    /// The built-in backends whose cargo features are on.
    pub fn builtin() -> Self {
        Registry {
            drivers: BUILTINS.iter().filter_map(|b| b.driver).collect(),
            builtins: true,
        }
    }

    /// Adds `driver`; it serves its schemes from now on, before any driver
    /// registered earlier or built in.
    pub fn register(&mut self, driver: Driver) -> &mut Self {
        self.drivers.insert(0, driver);
        self
    }

    /// The drivers, in the order they are tried.
    pub fn drivers(&self) -> impl Iterator<Item = &Driver> {
        self.drivers.iter()
    }

    /// The driver that serves `scheme`, if any.
    pub fn driver(&self, scheme: &str) -> Option<&Driver> {
        self.drivers.iter().find(|d| d.serves(scheme))
    }

    /// Connects to the backend named by `url`'s scheme; see [`connect`].
    pub async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let scheme = scheme_of(url)?;
        if let Some(driver) = self.driver(&scheme) {
            return driver.connect(url).await;
        }
        if self.builtins
            && let Some(builtin) = BUILTINS.iter().find(|b| b.schemes.contains(&&*scheme))
        {
            return Err(LockError::BackendNotCompiled {
                scheme,
                feature: builtin.feature,
            });
        }
        let mut known: Vec<&str> = self
            .drivers
            .iter()
            .flat_map(|d| d.schemes())
            .copied()
            .collect();
        if self.builtins {
            known.extend(
                known_schemes()
                    .filter(|s| !known.contains(s))
                    .collect::<Vec<_>>(),
            );
        }
        Err(LockError::invalid_url(
            url,
            format!(
                "unknown scheme {scheme:?}; known schemes: {}",
                known.join(", ")
            ),
        ))
    }
}

/// Connects to the backend named by `url`'s scheme.
///
/// | scheme | backend | cargo feature |
/// | --- | --- | --- |
/// | `memory://` | in-process store shared by the whole process | always on |
/// | `redis://`, `rediss://` | one Redis server (`lockkit::redis`) | `redis` |
/// | `redis+cluster://h1:p1,h2:p2` | Redis Cluster, from these seed nodes (`lockkit::redis`) | `redis` |
/// | `redis+sentinel://s1:p1,s2:p2/master-name` | the master Redis Sentinel names, followed across failovers (`lockkit::redis`) | `redis` |
/// | `redlock://h1:p1,h2:p2,h3:p3` | Redlock over N Redis masters (`lockkit::redlock`) | `redlock` |
/// | `zk://h1:p1,h2:p2/root` | ZooKeeper (`lockkit::zk`) | `zk` |
/// | `etcd://h1:p1,h2:p2/prefix` | etcd (`lockkit::etcd`) | `etcd` |
/// | `postgres://`, `postgresql://` | PostgreSQL, `?mode=lease` (default), `row`, `advisory` (`lockkit::sql`) | `postgres` |
/// | `mysql://`, `mariadb://` | MySQL/MariaDB, `?mode=lease` (default), `row`, `named` (`lockkit::sql`) | `mysql` |
/// | `sqlite://path`, `sqlite::memory:` | SQLite lease rows (`lockkit::sql`) | `sqlite` |
///
/// The connection is eager: a server that is not up yet (its port closed,
/// or open and still starting) is tried again with backoff (10 ms doubling
/// to 500 ms, jittered) until the connect timeout, so services started
/// together need no start order; one still unreachable then gives
/// [`LockError::Unavailable`]. A refusal that trying again cannot change
/// (a wrong password) ends at once. The client reconnects on its own
/// afterwards. A known scheme whose feature is off gives
/// [`LockError::BackendNotCompiled`] naming the feature; an unknown scheme gives
/// [`LockError::InvalidUrl`]. Passwords in the URL never appear in errors.
/// A backend of your own goes through a [`Registry`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit::Result<()> {
/// use lockkit::{LockError, LockOptions};
///
/// let locks = lockkit::connect("memory://").await?;
/// let guard = locks.acquire("report", &LockOptions::new()).await?;
/// guard.release().await?;
///
/// let err = lockkit::connect("carrier-pigeon://coop").await.unwrap_err();
/// assert!(matches!(err, LockError::InvalidUrl { .. }));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    Registry::builtin().connect(url).await
}

/// The scheme of `url`, lower-cased: everything before the first `:`.
fn scheme_of(url: &str) -> Result<String> {
    let scheme = match url.split_once(':') {
        Some((scheme, _)) if !scheme.is_empty() => scheme,
        _ => {
            return Err(LockError::invalid_url(
                url,
                "missing scheme, e.g. redis://host:6379",
            ));
        }
    };
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(LockError::invalid_url(
            url,
            format!("{scheme:?} is not a URL scheme"),
        ));
    }
    Ok(scheme.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(scheme_of("Redis://h").unwrap(), "redis");
        assert_eq!(scheme_of("sqlite::memory:").unwrap(), "sqlite");
        assert_eq!(
            scheme_of("redis+cluster://a:1,b:2").unwrap(),
            "redis+cluster"
        );
        for bad in ["", "://x", "no-scheme", "1abc://x", "a b://x"] {
            assert!(
                matches!(scheme_of(bad), Err(LockError::InvalidUrl { .. })),
                "{bad:?}"
            );
        }
    }

    /// The facade's table names each compiled-in driver's own schemes, so
    /// that a scheme is declared once, in its backend crate.
    #[test]
    fn builtin_schemes_are_the_drivers_own() {
        for builtin in BUILTINS {
            if let Some(driver) = builtin.driver {
                assert_eq!(builtin.schemes, driver.schemes(), "{}", driver.name());
                if let Some(feature) = driver.feature() {
                    assert_eq!(builtin.feature, feature, "{}", driver.name());
                }
            }
        }
        let mut all: Vec<&str> = known_schemes().collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a scheme is served by two built-ins");
    }

    #[test]
    fn registered_drivers_come_first() {
        fn connect(url: &str) -> lockkit_core::backend::ConnectFuture<'_> {
            lockkit_core::backend::boxed_connect(async move {
                Err::<lockkit_core::MemoryLock, _>(LockError::unavailable("mine", url.to_owned()))
            })
        }
        let mut registry = Registry::builtin();
        registry.register(Driver::new("mine", &["memory"], connect));
        assert_eq!(registry.driver("MEMORY").map(Driver::name), Some("mine"));
        assert!(Registry::new().driver("memory").is_none());
    }
}
