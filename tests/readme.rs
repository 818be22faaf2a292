//! The README's backend table is generated from the backends' `Capabilities`.
//! It lists every backend, so the check needs them all compiled in (CI runs
//! with `--all-features`).
#![cfg(all(feature = "redis", feature = "redlock", feature = "zk"))]

#[test]
fn readme_capabilities_table_is_current() {
    let rows = [
        ("memory", lockkit::core::MEMORY_CAPABILITIES),
        ("redis", lockkit::redis::REDIS_CAPABILITIES),
        ("redlock", lockkit::redlock::REDLOCK_CAPABILITIES),
        ("zookeeper", lockkit::zk::ZK_CAPABILITIES),
    ];
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
