//! The README's backend table is generated from the backends' `Capabilities`.
//! It lists every backend, so the check needs them all compiled in (CI runs
//! with `--all-features`).
#![cfg(all(
    feature = "redis",
    feature = "redlock",
    feature = "zk",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]

use lockkit::sql::{Database, Mode};

fn sql(mode: Mode, database: Database) -> lockkit::Capabilities {
    mode.capabilities(database)
        .unwrap_or_else(|| panic!("{mode} on {database}"))
}

#[test]
fn readme_capabilities_table_is_current() {
    let rows = [
        ("memory", lockkit::core::MEMORY_CAPABILITIES),
        ("redis", lockkit::redis::REDIS_CAPABILITIES),
        (
            "redis cluster, sentinel (without `wait_replicas`)",
            lockkit::redis::REDIS_REPLICATED_CAPABILITIES,
        ),
        ("redlock", lockkit::redlock::REDLOCK_CAPABILITIES),
        ("zookeeper", lockkit::zk::ZK_CAPABILITIES),
        ("postgres lease", sql(Mode::Lease, Database::Postgres)),
        (
            "postgres row, advisory",
            sql(Mode::Advisory, Database::Postgres),
        ),
        ("mysql lease", sql(Mode::Lease, Database::MySql)),
        ("mysql row, named", sql(Mode::Named, Database::MySql)),
        ("sqlite lease", sql(Mode::Lease, Database::Sqlite)),
    ];
    // Rows that name two modes stand for both.
    assert_eq!(
        sql(Mode::Row, Database::Postgres),
        sql(Mode::Advisory, Database::Postgres)
    );
    assert_eq!(
        sql(Mode::Row, Database::MySql),
        sql(Mode::Named, Database::MySql)
    );
    let table = lockkit::Capabilities::markdown_table(&rows);

    let readme = include_str!("../README.md");
    let start = readme
        .find("<!-- capabilities:start -->\n")
        .expect("start marker")
        + 28;
    let end = readme
        .find("<!-- capabilities:end -->")
        .expect("end marker");
    assert_eq!(
        &readme[start..end],
        table,
        "README.md's capability table is out of date; replace it with:\n{table}"
    );
}
