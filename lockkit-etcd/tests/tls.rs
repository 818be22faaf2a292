//! TLS to a real etcd server that requires client certificates
//! (`--client-cert-auth`): with the URL's `ca_file`, `cert_file` and
//! `key_file` the lock works; a client that does not trust the server's
//! authority, or has no certificate of its own, or speaks plain HTTP, is
//! refused, within its connect timeout, without a panic.

use std::time::Duration;

use lockkit_core::{DistributedLock, LockError, LockOptions};
use lockkit_testkit::{EtcdServer, EtcdServerTls, TestCerts, TestServer};

fn refused(result: lockkit_core::Result<lockkit_etcd::EtcdLock>, why: &str) {
    let error = result.map(|_| ()).expect_err(why);
    assert!(
        matches!(
            error,
            LockError::Unavailable { .. } | LockError::Backend { .. }
        ),
        "{why}: {error}"
    );
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let certs = TestCerts::generate().expect("openssl makes a test CA");
    let server = EtcdServer::try_start_tls(EtcdServerTls {
        cert_file: certs.path("server.crt"),
        key_file: certs.path("server.key"),
        client_ca_file: Some(certs.ca()),
    })
    .await
    .expect("etcd starts with TLS");
    let path = |file: &str| certs.path(file).to_str().unwrap().to_owned();
    let base = format!("{}/tls?connect_timeout=1s", server.url());

    let url = format!(
        "{base}&ca_file={}&cert_file={}&key_file={}",
        path("ca.crt"),
        path("client.crt"),
        path("client.key")
    );
    let locks = lockkit_etcd::connect(&url)
        .await
        .expect("connects over TLS");
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let guard = locks.acquire("over-tls", &opts).await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert!(
        locks
            .try_acquire("over-tls", &opts)
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();

    // The private CA is not among the system's roots.
    refused(
        lockkit_etcd::connect(&format!("{base}&tls=true")).await,
        "a server whose authority is not trusted",
    );
    // The server checks clients: no certificate, no connection.
    refused(
        lockkit_etcd::connect(&format!("{base}&ca_file={}", path("ca.crt"))).await,
        "a client without a certificate",
    );
    // Plain HTTP to a TLS port.
    refused(
        lockkit_etcd::connect(&base).await,
        "plain HTTP to a TLS port",
    );
}
