//! A fence store opened from its URL: what `lockkit fence install` and
//! `lockkit fence check` work on.

use std::fmt;
use std::time::Duration;

use lockkit_core::FencingToken;

use crate::error::{FenceError, Result};

/// The stores a URL can name, by scheme.
pub const SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "sqlite",
    "redis",
    "rediss",
    "etcd",
];

/// A store that keeps fences, opened from its own URL (the URL its clients
/// use; for etcd, `etcd://host:port[,host:port…]`). Every call is bounded
/// by the timeout it was opened with.
pub struct Store {
    kind: Kind,
    timeout: Duration,
}

enum Kind {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "redis")]
    Redis(::redis::aio::MultiplexedConnection),
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::KvClient>),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("store", &self.name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What `install` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Installed {
    /// The table (and on PostgreSQL and MySQL the function) exist now.
    Created,
    /// The store needs nothing installed (Redis, etcd).
    NothingNeeded,
}

/// The SQL that `install` runs on the store a URL names, for a DBA to run
/// by hand; `None` for stores that need nothing or are not compiled in.
pub fn install_sql(url: &str) -> Option<String> {
    let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
    let found: Option<(&[&str], bool)> = match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Some((crate::postgres::INSTALL, false)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Some((crate::mysql::INSTALL, true)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Some((crate::sqlite::INSTALL, false)),
        _ => None,
    };
    let (statements, mysql) = found?;
    let mut out = String::new();
    for statement in statements {
        // The mysql client ends a statement at `;` unless told otherwise.
        if mysql && statement.starts_with("CREATE FUNCTION") {
            out.push_str("DELIMITER $$\n");
            out.push_str(statement);
            out.push_str(" $$\nDELIMITER ;\n");
        } else {
            out.push_str(statement);
            out.push_str(";\n");
        }
    }
    Some(out)
}

impl Store {
    /// Connects to the store `url` names, within `timeout`.
    pub async fn open(url: &str, timeout: Duration) -> Result<Store> {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        let kind = bounded("connect", timeout, open_kind(scheme, url, timeout)).await?;
        Ok(Store { kind, timeout })
    }

    /// The store's name, e.g. `postgres`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            #[cfg(feature = "postgres")]
            Kind::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            Kind::MySql(_) => "mysql",
            #[cfg(feature = "sqlite")]
            Kind::Sqlite(_) => "sqlite",
            #[cfg(feature = "redis")]
            Kind::Redis(_) => "redis",
            #[cfg(feature = "etcd")]
            Kind::Etcd(_) => "etcd",
        }
    }

    /// Creates what the store needs to keep fences, idempotently.
    pub async fn install(&self) -> Result<Installed> {
        let work = async {
            match &self.kind {
                #[cfg(feature = "postgres")]
                Kind::Postgres(pool) => crate::postgres::install(pool)
                    .await
                    .map(|()| Installed::Created),
                #[cfg(feature = "mysql")]
                Kind::MySql(pool) => crate::mysql::install(pool)
                    .await
                    .map(|()| Installed::Created),
                #[cfg(feature = "sqlite")]
                Kind::Sqlite(pool) => crate::sqlite::install(pool)
                    .await
                    .map(|()| Installed::Created),
                #[allow(unreachable_patterns)]
                _ => Ok(Installed::NothingNeeded),
            }
        };
        bounded("install", self.timeout, work).await
    }

    /// Admits `token` for `resource` (records it), or refuses it as stale.
    pub async fn check(&self, resource: &str, token: FencingToken) -> Result<()> {
        let work = async {
            match &self.kind {
                #[cfg(feature = "postgres")]
                Kind::Postgres(pool) => crate::postgres::check(pool, resource, token).await,
                #[cfg(feature = "mysql")]
                Kind::MySql(pool) => crate::mysql::check(pool, resource, token).await,
                #[cfg(feature = "sqlite")]
                Kind::Sqlite(pool) => crate::sqlite::check(pool, resource, token).await,
                #[cfg(feature = "redis")]
                Kind::Redis(conn) => crate::redis::check(&mut conn.clone(), resource, token).await,
                #[cfg(feature = "etcd")]
                Kind::Etcd(kv) => {
                    crate::etcd::check(&mut kv.as_ref().clone(), resource, token).await
                }
            }
        };
        bounded("check", self.timeout, work).await
    }
}

async fn bounded<T>(
    what: &str,
    timeout: Duration,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(FenceError::store(
            "fence",
            format!("{what} did not finish within {timeout:?}"),
            None,
        )),
    }
}

async fn open_kind(scheme: &str, url: &str, timeout: Duration) -> Result<Kind> {
    match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect(url)
            .await
            .map(Kind::Postgres)
            .map_err(|e| unreachable_store("postgres", e)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let url = url.replacen("mariadb://", "mysql://", 1);
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(timeout)
                .connect(&url)
                .await
                .map(Kind::MySql)
                .map_err(|e| unreachable_store("mysql", e))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            use std::str::FromStr;
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
                .map_err(|e| unreachable_store("sqlite", e))?
                .create_if_missing(true)
                .busy_timeout(timeout);
            sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(timeout)
                .connect_with(options)
                .await
                .map(Kind::Sqlite)
                .map_err(|e| unreachable_store("sqlite", e))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let client = ::redis::Client::open(url).map_err(|e| unreachable_store("redis", e))?;
            let config = ::redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout));
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map(Kind::Redis)
                .map_err(|e| unreachable_store("redis", e))
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            let hosts = url["etcd://".len()..]
                .split(['/', '?'])
                .next()
                .unwrap_or_default();
            if hosts.contains('@') {
                return Err(FenceError::store(
                    "etcd",
                    "`lockkit fence` takes etcd://host:port[,host:port…] without credentials; \
                     use lockkit_fence::etcd with your own client for auth and TLS",
                    None,
                ));
            }
            let endpoints: Vec<String> = hosts
                .split(',')
                .filter(|host| !host.is_empty())
                .map(|host| {
                    if host.contains(':') {
                        format!("http://{host}")
                    } else {
                        format!("http://{host}:2379")
                    }
                })
                .collect();
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(timeout)
                .with_timeout(timeout);
            etcd_client::Client::connect(endpoints, Some(options))
                .await
                .map(|client| Kind::Etcd(Box::new(client.kv_client())))
                .map_err(|e| unreachable_store("etcd", e))
        }
        _ => Err(FenceError::store(
            "fence",
            format!(
                "no fence store for the scheme {scheme:?} in this build (known: {})",
                SCHEMES.join(", ")
            ),
            None,
        )),
    }
}

fn unreachable_store<E: std::error::Error + Send + Sync + 'static>(
    store: &'static str,
    error: E,
) -> FenceError {
    FenceError::store(
        store,
        format!("cannot connect: {error}"),
        Some(Box::new(error) as _),
    )
}
