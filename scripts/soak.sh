#!/usr/bin/env bash
# The soak: a bounded mixed workload (exclusive holders writing to a fenced
# resource, readers and writers, semaphore permits, an election, short-lived
# names) on every backend at once, servers paused and restarted at random,
# the client process's resident memory and open descriptors sampled every
# 10 s. Fails when either grows more than 10 % past its first minute, when a
# backend that claims fencing lets a stale write through, or when a name is
# still held after the client is done. Writes DIR/soak.md.
#
#   scripts/soak.sh [MINUTES] [more lockkit-faults soak options…]
#   e.g. scripts/soak.sh 30     (the soak report; about 32 minutes)
#        scripts/soak.sh 2 --backends redis,zk
#
# A run of 30 minutes or more also writes target/lockkit-bench/soak-summary.md,
# which `scripts/reports.sh soak` makes the page docs/reports/soak.md.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
shift || true
scripts/install-services.sh
summary=()
if awk -v m="$minutes" 'BEGIN { exit !(m >= 30) }'; then
    summary=(--summary target/lockkit-bench/soak-summary.md)
fi
cargo run -q -p lockkit-faults -- soak --minutes "$minutes" --out target/soak "${summary[@]}" "$@"
