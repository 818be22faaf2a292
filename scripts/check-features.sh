#!/usr/bin/env bash
# The facade `lockkit` builds cleanly (clippy, warnings denied) with no
# feature and with each feature on its own (`full`, every feature, is the
# workspace's `--all-features` run in scripts/test.sh); and with no backend
# compiled in, every backend URL names the feature it needs
# (`LockError::BackendNotCompiled`). Called by scripts/test.sh.
#
# Clippy lints every workspace member it builds, not only the one named, so
# each run also lints the backend crate the feature turns on, and
# lockkit-fence with the store the feature turns on there (`postgres` its
# `postgres` alone, and so on; no feature, none): the stores on their own.
# lockkit-sql's own tests are linted with each dialect alone as well.
set -euo pipefail
cd "$(dirname "$0")/.."

for features in "" redis redlock zk etcd postgres mysql sqlite cli metrics tower; do
    echo "check-features: lockkit with features [${features:-none}]" >&2
    cargo clippy --quiet -p lockkit --no-default-features ${features:+--features "$features"} \
        --all-targets -- -D warnings
done

# lockkit-sql's own targets (its unit tests among them) with each dialect
# alone: the runs above lint the crate as a dependency only.
for features in postgres mysql sqlite; do
    echo "check-features: lockkit-sql with features [$features]" >&2
    cargo clippy --quiet -p lockkit-sql --no-default-features --features "$features" \
        --all-targets -- -D warnings
done

echo "check-features: URLs of backends that are not compiled in" >&2
cargo test --quiet -p lockkit --no-default-features --test connect
