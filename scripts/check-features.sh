#!/usr/bin/env bash
# The facade `lockkit` builds cleanly (clippy, warnings denied) with no
# feature and with each feature on its own, lockkit-fence too (`full`, every feature, is the
# workspace's `--all-features` run in scripts/test.sh); and with no backend
# compiled in, every backend URL names the feature it needs
# (`LockError::BackendNotCompiled`). Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

for features in "" redis redlock zk etcd postgres mysql sqlite cli metrics tower; do
    echo "check-features: lockkit with features [${features:-none}]" >&2
    cargo clippy --quiet -p lockkit --no-default-features ${features:+--features "$features"} \
        --all-targets -- -D warnings
done

# lockkit-fence: each store on its own (the facade turns them on with the
# backends of the same name), the library only: its tests need every store
# and run in the workspace's `--all-features` run.
for features in "" postgres mysql sqlite redis etcd tower; do
    echo "check-features: lockkit-fence with features [${features:-none}]" >&2
    cargo clippy --quiet -p lockkit-fence --no-default-features ${features:+--features "$features"} \
        -- -D warnings
done

echo "check-features: URLs of backends that are not compiled in" >&2
cargo test --quiet -p lockkit --no-default-features --test connect
