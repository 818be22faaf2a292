//! `lockkit::connect(url)`: a backend chosen by URL scheme.

use std::sync::Arc;

use lockkit_core::{DistributedLock, LockError, MemoryLock, Result};

/// Every scheme lockkit knows, with the cargo feature that provides it.
const SCHEMES: &[(&str, &str)] = &[
    ("memory", "(always on)"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+cluster", "redis"),
    ("redis+sentinel", "redis"),
    ("redlock", "redlock"),
    ("zk", "zk"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
];

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
/// | `postgres://`, `postgresql://` | PostgreSQL, `?mode=lease` (default), `row`, `advisory` (`lockkit::sql`) | `postgres` |
/// | `mysql://`, `mariadb://` | MySQL/MariaDB, `?mode=lease` (default), `row`, `named` (`lockkit::sql`) | `mysql` |
/// | `sqlite://path`, `sqlite::memory:` | SQLite lease rows (`lockkit::sql`) | `sqlite` |
///
/// The connection is eager: an unreachable server gives
/// [`LockError::Unavailable`] within the connect timeout, and the client
/// reconnects on its own afterwards. A known scheme whose feature is off gives
/// [`LockError::BackendNotCompiled`] naming the feature; an unknown scheme gives
/// [`LockError::InvalidUrl`]. Passwords in the URL never appear in errors.
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
    let scheme = scheme_of(url)?;
    match scheme.as_str() {
        "memory" => Ok(Arc::new(MemoryLock::from_url(url)?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "redis+sentinel" => {
            Ok(Arc::new(lockkit_redis::connect(url).await?))
        }
        #[cfg(feature = "redlock")]
        "redlock" => Ok(Arc::new(lockkit_redlock::connect(url).await?)),
        #[cfg(feature = "zk")]
        "zk" => Ok(Arc::new(lockkit_zk::connect(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(lockkit_sql::connect(url).await?)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(lockkit_sql::connect(url).await?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(lockkit_sql::connect(url).await?)),
        known => match SCHEMES.iter().find(|(name, _)| *name == known) {
            Some((_, feature)) => Err(LockError::BackendNotCompiled {
                scheme: known.to_owned(),
                feature,
            }),
            None => Err(LockError::invalid_url(
                url,
                format!(
                    "unknown scheme {known:?}; known schemes: {}",
                    SCHEMES
                        .iter()
                        .map(|(s, _)| *s)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
    }
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
}
