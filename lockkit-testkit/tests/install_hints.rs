//! A server whose binaries are missing fails to start with an error that
//! names what is missing and says how to install it, for every harness.

mod common;

use common::assert_not_installed;
use lockkit_testkit::{MariaDbServer, PostgresServer, RedisServer, ZkServer};

#[tokio::test]
async fn missing_binaries_say_how_to_install() {
    let redis = RedisServer::builder().binary("/nonexistent/redis-server");
    assert_not_installed(redis.try_start().await, "/nonexistent/redis-server");
    let postgres = PostgresServer::builder().bin_dir("/nonexistent/pg/bin");
    assert_not_installed(postgres.try_start().await, "/nonexistent/pg/bin/postgres");
    let mariadb = MariaDbServer::builder().bin_dir("/nonexistent/mariadb/bin");
    assert_not_installed(
        mariadb.try_start().await,
        "/nonexistent/mariadb/bin/mariadbd",
    );
    let zk = ZkServer::builder().jar("/nonexistent/zookeeper.jar");
    assert_not_installed(zk.try_start().await, "/nonexistent/zookeeper.jar");
}
