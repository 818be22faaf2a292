//! The hand-written ZooKeeper lock cycle: `create` an EPHEMERAL_SEQUENTIAL
//! node, list the directory, `delete` the node — the requests of the lock
//! recipe with nothing around them.

use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

/// The raw nodes' name before the sequence: lockkit's form, with a fixed
/// owner.
pub const RAW_ZK_PREFIX: &str = "_c_00000000-0000-4000-8000-000000000000-lock-";

/// A `zookeeper-client` session of its own on `connect_string`, with
/// lockkit's default session timeout.
pub async fn zk_session(connect_string: &str) -> Client {
    Client::connector()
        .with_session_timeout(lockkit_zk::DEFAULT_SESSION_TIMEOUT)
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
