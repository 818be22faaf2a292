#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, then runs every
# test against real servers (started by lockkit-testkit on loopback ports), the
# doc tests (the README's and the guide's samples among them), clippy on every
# target and feature (and the facade with each feature on its own), the
# packaging of every publishable crate, rustfmt and rustdoc.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says how long it took (CI's budget is 35 minutes on a fresh
# machine; the log shows where they go).
step() {
    local started=$SECONDS
    "$@"
    echo "scripts/test.sh: $((SECONDS - started)) s: $*" >&2
}

tests() {
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run --workspace --all-features --no-fail-fast
    else
        cargo test --workspace --all-features --no-fail-fast --lib --bins --tests --examples
    fi
}

step scripts/install-services.sh

export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# A fresh clone has nothing to reuse: the incremental cache would only add
# gigabytes to the target directory.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step tests
# nextest does not run doc tests.
step cargo test --workspace --all-features --doc
# The benchmarks run once each (criterion's test mode) on the debug build, so
# that a broken benchmark fails CI without a second, optimised build. Built
# as the tests were (whole workspace, every feature), so that no dependency
# is compiled a second time with other features; this also builds the
# workspace's programs, which the steps below run from the target directory
# (`cargo run -p` would compile them again for one package's features).
step cargo test --workspace --all-features --bench '*'
bin="${CARGO_TARGET_DIR:-target}/debug"
# The load generator and the scaling tool, tiny runs on the debug build: the
# books must balance (exit status), and the charts must render.
step "$bin/lockkit-load" --start memory,sqlite-lease,redis -c 16 -n 400 --stock 200 --duration 30s --kind exclusive,shared,permits=3
# Across processes, with the peers on the same servers (their books too).
step "$bin/lockkit-load" --start redis,pg-advisory -c 8 -n 200 --stock 100 --duration 30s --processes 2 --compare-rslock --compare-distributed-lock
smoke_out=$(mktemp -d)
step "$bin/lockkit-scale" --out "$smoke_out" curves --backends memory,redis --contenders 1,16 --keys 1,10 --requests 400 --point 300ms
step "$bin/lockkit-scale" --out "$smoke_out" held-names --backends redis,sqlite-lease --names 10,100 --processes 1,2 --point 300ms
rm -rf "$smoke_out"
# The fault-injection suite, short version: every scenario on every backend it
# applies to, seconds each, against real servers. It fails when a run does not
# go end to end or a backend that claims fencing lets a stale write through.
# The full run is scripts/faults.sh. (The program was built with the tests:
# lockkit-faults' own tests run it.)
# Four runs at once (each on its own servers and ports): the runs mostly
# wait out leases and pauses, so four share the machine's two cores (on
# 1 Dec 2026 the short suite took 180 s at four at once, 321 s at two).
step "$bin/lockkit-faults" run --short --jobs 4 --out target/faults-short
# The soak, short form: two minutes of the mixed workload on every backend,
# servers paused and restarted; fails on growth of the client's memory or
# descriptors, an accepted stale write on a fencing backend, or a name left
# held. The 30-minute run is scripts/soak.sh.
step "$bin/lockkit-faults" soak --minutes 2 --out target/soak-short

step cargo clippy --workspace --all-targets --all-features -- -D warnings
step cargo clippy --workspace --all-targets --no-default-features -- -D warnings
step scripts/check-features.sh
# Every publishable crate, packaged and checked from its package alone.
step scripts/package.sh
step cargo fmt --all -- --check
RUSTDOCFLAGS="-D warnings" step cargo doc --workspace --all-features --no-deps
echo "scripts/test.sh: all green" >&2
