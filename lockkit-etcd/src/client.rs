//! The etcd requests the lock makes, each bounded by the command timeout,
//! with etcd's errors mapped onto `LockError`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, GetResponse, Identity, TlsOptions, Txn,
    TxnResponse,
};
use lockkit_core::backend::connect_retrying;
use lockkit_core::{LockError, Result};
use tokio::time::Instant;

use crate::deletions::{Deletes, Deletions};
use crate::error::{BACKEND, Resend, map_error, resend};
use crate::leases::LeasePool;
use crate::settings::{EtcdSettings, EtcdTls, KEEP_ALIVE_INTERVAL};

/// A client of one etcd cluster. Every request takes the one sub-client it
/// needs (`kv_client()`, `lease_client()`, `watch_client()`): a clone of
/// the whole `etcd_client::Client` is some 3.7 KB and a dozen reference
/// counts.
#[derive(Clone)]
pub(crate) struct Etcd {
    /// Shared: every holding and every task it spawns keeps a clone.
    client: Arc<Client>,
    settings: Arc<EtcdSettings>,
    /// The one watch of deletions the client's waiters share.
    deletions: Arc<Deletions>,
    /// Leases of released holdings, for the next acquires.
    leases: Arc<LeasePool>,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The TTL a lease of `ttl` gets: whole seconds (etcd's unit), rounded up,
/// at least one.
fn whole_seconds(ttl: Duration) -> Duration {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

/// What `etcd-client` is given for TLS: the URL's authorities (else the
/// system's roots) and client certificate. Verification is always on.
fn tls_options(tls: &EtcdTls) -> TlsOptions {
    let mut options = TlsOptions::new();
    options = match &tls.ca {
        Some(pem) => options.ca_certificate(Certificate::from_pem(pem)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.identity {
        options = options.identity(Identity::from_pem(cert, key));
    }
    options
}

impl Etcd {
    /// Connects and checks that the cluster answers (a read of the prefix),
    /// tried again while it does not, within the connect timeout.
    pub(crate) async fn connect(settings: EtcdSettings) -> Result<Etcd> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(settings.connect_timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, settings.command_timeout);
        if let Some((user, password)) = &settings.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &settings.tls {
            options = options.with_tls(tls_options(tls));
        }
        let limit = settings.connect_timeout;
        let settings = Arc::new(settings);
        // A cluster still starting is tried again within the connect timeout.
        let etcd = connect_retrying(BACKEND, "connect", limit, |left| {
            let (options, settings) = (options.clone(), settings.clone());
            async move {
                let connect = Client::connect(settings.endpoints.clone(), Some(options));
                let client = tokio::time::timeout(left, connect)
                    .await
                    .map_err(|_| {
                        LockError::unavailable(
                            BACKEND,
                            format!("connect: no answer within {limit:?}"),
                        )
                    })?
                    .map_err(|error| map_error("connect", error))?;
                let etcd = Etcd {
                    client: Arc::new(client),
                    settings,
                    deletions: Arc::default(),
                    leases: Arc::default(),
                };
                let probe = GetOptions::new().with_count_only();
                etcd.bounded("reach the cluster", left, Resend::Repeatable, || {
                    let (mut kv, prefix) = (etcd.client.kv_client(), etcd.settings.prefix.clone());
                    let probe = probe.clone();
                    async move { kv.get(prefix, Some(probe)).await }
                })
                .await?;
                Ok(etcd)
            }
        })
        .await?;
        tracing::debug!(url = %etcd.settings.redacted_url, "connected");
        Ok(etcd)
    }

    /// The key prefix of the locks.
    pub(crate) fn prefix(&self) -> &str {
        &self.settings.prefix
    }

    /// Runs one request made by `request`, bounded by `limit`. A request
    /// that never left (its member's connection could not be opened, as
    /// after a member restarted: `etcd-client` reconnects lazily), or with
    /// [`Resend::Repeatable`] one whose connection broke under it, is sent
    /// again, after a short pause, while `limit` allows; any other failure
    /// is told at once.
    async fn bounded<T, F>(
        &self,
        what: &str,
        limit: Duration,
        which: Resend,
        request: impl FnMut() -> F,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + limit;
        match tokio::time::timeout(limit, resend(what, Some(deadline), which, request)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(map_error(what, error)),
            Err(_) => Err(LockError::unavailable(
                BACKEND,
                format!("{what}: no answer within {limit:?}"),
            )),
        }
    }

    /// Runs one request made by `request`, bounded by the command timeout.
    async fn timed<T, F>(&self, what: &str, which: Resend, request: impl FnMut() -> F) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.bounded(what, self.settings.command_timeout, which, request)
            .await
    }

    /// A lease for a new holding of `ttl`, and when it was last known alive
    /// (its server expiry is a whole TTL or more after that): a released
    /// one of the same TTL renewed (see [`crate::leases`]), else a new one.
    pub(crate) async fn lease(&self, ttl: Duration) -> Result<(i64, Instant)> {
        let ttl = whole_seconds(ttl);
        loop {
            let (kept, stale) = self.leases.take(ttl);
            stale.into_iter().for_each(|lease| self.revoke_later(lease));
            let Some(lease) = kept else {
                break;
            };
            let sent = Instant::now();
            match self.keep_alive(lease).await {
                Ok(Some(_)) => return Ok((lease, sent)),
                // Expired while it was kept: try the next one.
                Ok(None) => {}
                Err(error) => {
                    self.revoke_later(lease);
                    return Err(error);
                }
            }
        }
        let sent = Instant::now();
        Ok((self.grant(ttl).await?, sent))
    }

    /// Keeps `lease` (of `ttl`, its key deleted, alive at `alive_at`) for
    /// the next holding of this client.
    pub(crate) fn keep_lease(&self, lease: i64, ttl: Duration, alive_at: Instant) {
        if let Some(evicted) = self.leases.put(lease, whole_seconds(ttl), alive_at) {
            self.revoke_later(evicted);
        }
    }

    /// Revokes `lease` in a task of its own (outside a runtime, or when
    /// that fails, it ends with its TTL).
    pub(crate) fn revoke_later(&self, lease: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a lease cannot be revoked outside a runtime; it ends with its TTL");
            return;
        };
        let etcd = self.clone();
        runtime.spawn(async move {
            if let Err(error) = etcd.revoke(lease).await {
                tracing::warn!(%error, "could not revoke a lease; it ends with its TTL");
            }
        });
    }

    /// A new lease of `ttl` (whole seconds, at least one: etcd's unit).
    pub(crate) async fn grant(&self, ttl: Duration) -> Result<i64> {
        let seconds = i64::try_from(whole_seconds(ttl).as_secs()).unwrap_or(i64::MAX);
        let granted = self
            .timed("grant a lease", Resend::Unsent, || {
                let mut leases = self.client.lease_client();
                async move { leases.grant(seconds, None).await }
            })
            .await?;
        Ok(granted.id())
    }

    /// Revokes `lease` (and deletes its keys); `false` if it was gone.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<bool> {
        match self
            .timed("revoke the lease", Resend::Unsent, || {
                let mut leases = self.client.lease_client();
                async move { leases.revoke(lease).await }
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(LockError::Backend { message, .. }) if message.contains("lease not found") => {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// One keep-alive of `lease`: its remaining TTL, `None` once it expired
    /// or was revoked (an answer of TTL 0, or etcd-client's "lease not
    /// found").
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<Option<Duration>> {
        let once = || async {
            let answer = async {
                let (mut keeper, mut stream) = self.client.lease_client().keep_alive(lease).await?;
                keeper.keep_alive().await?;
                stream.message().await
            };
            match answer.await {
                Err(etcd_client::Error::LeaseKeepAliveError(message))
                    if message.contains("lease not found") =>
                {
                    Ok(None)
                }
                answer => answer,
            }
        };
        let answer = self
            .timed("keep the lease alive", Resend::Repeatable, once)
            .await?;
        Ok(answer
            .filter(|a| a.ttl() > 0)
            .map(|a| Duration::from_secs(a.ttl().max(0) as u64)))
    }

    /// The remaining TTL of `lease`, `None` once it is gone.
    pub(crate) async fn lease_ttl(&self, lease: i64) -> Result<Option<Duration>> {
        let answer = self
            .timed("read the lease", Resend::Repeatable, || {
                let mut leases = self.client.lease_client();
                async move { leases.time_to_live(lease, None).await }
            })
            .await?;
        Ok((answer.ttl() >= 0).then(|| Duration::from_secs(answer.ttl() as u64)))
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.timed(what, Resend::Unsent, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<GetResponse> {
        let key = key.into();
        self.timed(what, Resend::Repeatable, || {
            let (mut kv, key, options) = (self.client.kv_client(), key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        })
        .await
    }

    /// A wait for the deletions of the keys under `dir`, told by the
    /// client's one watch of its prefix (see [`crate::deletions`]), in place
    /// when this returns (bounded by the command timeout). A deletion just
    /// before it may not be told: read the keys once it is in place.
    pub(crate) async fn watch_deletes(&self, dir: &str) -> Result<Deletes> {
        let watched = format!("{}/", self.settings.prefix);
        self.deletions
            .register(
                &self.client,
                &watched,
                dir.as_bytes(),
                self.settings.command_timeout,
            )
            .await
    }
}
