//! The guide's tables that come from the code: the capability table of
//! "Choosing a backend" is generated from the backends' `Capabilities`, and
//! its URL table lists every scheme with its cargo feature. They list every
//! backend, so the checks need them all compiled in (CI runs with
//! `--all-features`).
#![cfg(feature = "full")]

use lockkit::sql::{Database, Mode};

fn sql(mode: Mode, database: Database) -> lockkit::Capabilities {
    mode.capabilities(database)
        .unwrap_or_else(|| panic!("{mode} on {database}"))
}

#[test]
fn the_guides_capability_table_is_current() {
    let rows = [
        ("memory", lockkit::core::backend::MEMORY_CAPABILITIES),
        ("redis", lockkit::redis::REDIS_CAPABILITIES),
        (
            "redis, `fair=true`",
            lockkit::redis::REDIS_FAIR_CAPABILITIES,
        ),
        (
            "redis, `barging=true`",
            lockkit::redis::REDIS_BARGING_CAPABILITIES,
        ),
        (
            "redis cluster, sentinel (without `wait_replicas`)",
            lockkit::redis::REDIS_REPLICATED_CAPABILITIES,
        ),
        ("redlock", lockkit::redlock::REDLOCK_CAPABILITIES),
        (
            "redlock, `barging=true`",
            lockkit::redlock::REDLOCK_BARGING_CAPABILITIES,
        ),
        ("zookeeper", lockkit::zk::ZK_CAPABILITIES),
        ("etcd", lockkit::etcd::ETCD_CAPABILITIES),
        ("postgres lease", sql(Mode::Lease, Database::Postgres)),
        ("postgres advisory", sql(Mode::Advisory, Database::Postgres)),
        ("postgres row", sql(Mode::Row, Database::Postgres)),
        ("mysql lease", sql(Mode::Lease, Database::MySql)),
        ("mysql named", sql(Mode::Named, Database::MySql)),
        ("mysql row", sql(Mode::Row, Database::MySql)),
        ("sqlite lease", sql(Mode::Lease, Database::Sqlite)),
    ];
    let table = lockkit::Capabilities::markdown_table(&rows);

    let readme = include_str!("../docs/guide/choosing-a-backend.md");
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
        "docs/guide/choosing-a-backend.md's capability table is out of date; replace it with:\n{table}"
    );
}

/// The schemes of the guide's URL table and of `connect`'s doc table, with
/// their cargo features, are the backends' own (`lockkit::known_schemes`,
/// checked against each driver by a unit test).
#[test]
fn the_guide_and_connect_docs_list_every_scheme() {
    let registry = lockkit::Registry::builtin();
    let expected: Vec<(String, String)> = lockkit::known_schemes()
        .map(|scheme| {
            let feature = registry
                .driver(scheme)
                .and_then(|d| d.feature())
                .unwrap_or("always on");
            (scheme.to_owned(), feature.to_owned())
        })
        .collect();
    for (doc, header) in [
        (
            include_str!("../docs/guide/choosing-a-backend.md"),
            "| URL | backend | cargo feature |",
        ),
        (
            include_str!("../src/connect.rs"),
            "/// | scheme | backend | cargo feature |",
        ),
    ] {
        let table = &doc[doc.find(header).expect("the URL table")..];
        let mut listed = Vec::new();
        for row in table.lines().skip(2) {
            let row = row.trim_start_matches("/// ");
            if !row.starts_with('|') {
                break;
            }
            let cells: Vec<&str> = row.split(" | ").collect();
            let feature = cells
                .last()
                .unwrap()
                .trim_end_matches(" |")
                .trim_matches('`');
            for code in cells[0].split('`').skip(1).step_by(2) {
                if let Some((scheme, _)) = code.split_once(':')
                    && !scheme.is_empty()
                    && !code.starts_with(':')
                {
                    let entry = (scheme.to_owned(), feature.to_owned());
                    if !listed.contains(&entry) {
                        listed.push(entry);
                    }
                }
            }
        }
        let mut listed_sorted = listed.clone();
        listed_sorted.sort();
        let mut expected_sorted = expected.clone();
        expected_sorted.sort();
        assert_eq!(listed_sorted, expected_sorted, "{header}");
    }
}
