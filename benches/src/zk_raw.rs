//! The hand-written ZooKeeper lock cycle: `create` an EPHEMERAL_SEQUENTIAL
//! node, list the directory, `delete` the node — the requests of the lock
//! recipe with nothing around them; and a permit in Curator's semaphore
//! layout, written the same way.

use std::time::Duration;

use zookeeper_client::{Acls, Client, Connector, CreateMode, Error as ZkError};

/// The raw nodes' name before the sequence: lockkit's form, with a fixed
/// owner.
pub const RAW_ZK_PREFIX: &str = "_c_00000000-0000-4000-8000-000000000000-lock-";

/// A `zookeeper-client` session of its own on `connect_string`, with
/// lockkit's default session timeout.
pub async fn zk_session(connect_string: &str) -> Client {
    let connector = Client::connector().with_session_timeout(lockkit_zk::DEFAULT_SESSION_TIMEOUT);
    session(connector, connect_string).await
}

/// A `zookeeper-client` session on `connect_string` that outlasts
/// criterion's pauses, as [`crate::connect_patient`]'s clients do: session
/// and connection timeouts (the client times requests by the latter) of
/// 30 s.
pub async fn zk_session_patient(connect_string: &str) -> Client {
    let connector = Client::connector()
        .with_session_timeout(PATIENT_TIMEOUT)
        .with_connection_timeout(PATIENT_TIMEOUT);
    session(connector, connect_string).await
}

/// The timeouts of [`zk_session_patient`].
const PATIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A session that `connector` opens on `connect_string` (panics if none).
async fn session(connector: Connector, connect_string: &str) -> Client {
    connector
        .connect(connect_string)
        .await
        .expect("a zookeeper-client session")
}

/// Creates `dir` and its parents as persistent nodes if they are missing.
pub async fn zk_mkdir(client: &Client, dir: &str) {
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    match client.mkdir(dir, &persistent).await {
        Ok(()) | Err(ZkError::NodeExists) => {}
        Err(error) => panic!("mkdir {dir}: {error}"),
    }
}

/// `create` of an `EPHEMERAL_SEQUENTIAL` node under `dir`; its path.
pub async fn zk_create_node(client: &Client, dir: &str) -> String {
    let prefix = format!("{dir}/{RAW_ZK_PREFIX}");
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, sequence) = client
        .create(&prefix, &[], &options)
        .await
        .expect("create an EPHEMERAL_SEQUENTIAL node");
    format!("{prefix}{sequence}")
}

/// `delete` of the node at `path`.
pub async fn zk_delete_node(client: &Client, path: &str) {
    client.delete(path, None).await.expect("delete the node");
}

/// The children of `dir`; none when it does not exist (lockkit's lock
/// directories are container nodes, which the server removes once empty).
pub async fn zk_children(client: &Client, dir: &str) -> Vec<String> {
    match client.list_children(dir).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => Vec::new(),
        Err(error) => panic!("list_children {dir}: {error}"),
    }
}

/// The raw lock cycle in `dir` (which must exist and be empty): create our
/// node, list the directory (ours must be the only contender, so the lock
/// is ours), delete the node.
pub async fn zk_raw_cycle(client: &Client, dir: &str) {
    let path = zk_create_node(client, dir).await;
    let children = client.list_children(dir).await.expect("list_children");
    assert!(
        children.len() == 1 && path.ends_with(&children[0]),
        "raw ZooKeeper cycle: the directory holds {children:?}"
    );
    zk_delete_node(client, &path).await;
}

/// The leases' nodes' name before the sequence, as Curator's
/// `InterProcessSemaphoreV2` and lockkit name them, with a fixed owner.
const RAW_ZK_LEASE_PREFIX: &str = "_c_00000000-0000-4000-8000-000000000000-lease-";

/// A permit of a semaphore in Curator's `InterProcessSemaphoreV2` layout,
/// written by hand: `dir/locks` is its mutex and `dir/leases` its permits
/// (both must exist, and be empty). The four requests of a free mutex and
/// a free permit go in one round trip (the mutex node, the mutex's listing,
/// the lease node, the leases' listing; a session's requests run in the
/// order sent), then the mutex node and the lease node are deleted, at
/// once. This is the floor of the layout that Curator's clients share, the
/// yardstick of a ZooKeeper permit beside the lock cycle.
pub async fn zk_raw_permit_cycle(client: &Client, dir: &str, permits: usize) {
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (mutex_dir, leases) = (format!("{dir}/locks"), format!("{dir}/leases"));
    let mutex_prefix = format!("{mutex_dir}/{RAW_ZK_PREFIX}");
    let lease_prefix = format!("{leases}/{RAW_ZK_LEASE_PREFIX}");
    // The client sends each request when it is called, in this order.
    let mutex_created = client.create(&mutex_prefix, &[], &options);
    let mutex_listed = client.list_children(&mutex_dir);
    let lease_created = client.create(&lease_prefix, &[], &options);
    let leases_listed = client.list_children(&leases);
    let (mutex_created, mutex_listed, lease_created, leases_listed) =
        tokio::join!(mutex_created, mutex_listed, lease_created, leases_listed);
    let (_, mutex_seq) = mutex_created.expect("create the mutex node");
    let (_, lease_seq) = lease_created.expect("create the lease node");
    let mutex_node = format!("{mutex_prefix}{mutex_seq}");
    let lease_node = format!("{lease_prefix}{lease_seq}");
    let holders = mutex_listed.expect("list the mutex");
    let granted = leases_listed.expect("list the leases");
    assert!(
        holders.len() == 1 && mutex_node.ends_with(&holders[0]),
        "raw ZooKeeper permit: the mutex holds {holders:?}"
    );
    assert!(
        granted.len() <= permits && granted.iter().any(|l| lease_node.ends_with(l)),
        "raw ZooKeeper permit: the leases are {granted:?}"
    );
    let (mutex_deleted, lease_deleted) = tokio::join!(
        client.delete(&mutex_node, None),
        client.delete(&lease_node, None)
    );
    mutex_deleted.expect("delete the mutex node");
    lease_deleted.expect("delete the lease node");
}
