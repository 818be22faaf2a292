#!/usr/bin/env bash
# The whole cross-backend comparison in one command, against servers the
# testkit starts on loopback ports (scripts/install-services.sh installs
# them):
#
#   1. the criterion suite `compare` (cycle, try_fail, handoff, raw_floor per
#      backend, then paired rounds of those cycles with the shared and
#      permit ones) with its Markdown table and chart, `cycle_overhead` (the Redis and
#      Redlock cycles over their raw floors, one client, blocks interleaved,
#      7 runs on each runtime flavour), `etcd` (the etcd cycle paired with
#      its raw floor, and the 16-way handoff, on both runtime flavours),
#      then `family` (shared and permit
#      cycles paired with the exclusive one, on both runtime flavours) and
#      `family_peers` (against distributed-lock 0.2 and Curator, and 16
#      readers scaling), `processes` (16 worker processes on one name,
#      beside rslock and distributed-lock) and `cluster_pubsub` (the
#      messages a release costs a Redis Cluster's nodes); scripts/reports.sh
#      makes each summary a page of docs/reports/;
#   2. the seckill load generator on every backend, and rslock beside Redis;
#   3. the scaling curves (contenders, keys) with their charts;
#   4. the lease density of 1 000 000 auto-renewed Redis leases (renewals
#      batched); `scripts/reports.sh density` makes its page;
#   5. the cost of a cycle in 1, 4 and 16 processes while another client
#      holds 10 to 10 000 names (`scripts/reports.sh held-names`).
#
# Everything lands in target/lockkit-bench/ (summaries, JSON, SVG and PNG).
# LOCKKIT_BENCH_BACKENDS=redis,zk limits steps 1-3 to some backends;
# LOCKKIT_BENCH_QUICK=1 shrinks everything to a quick look. Takes about
# 30 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-services.sh
out=target/lockkit-bench
mkdir -p "$out"
backends=${LOCKKIT_BENCH_BACKENDS:-memory,redis,redlock3,redlock5,zk,etcd,pg-lease,pg-row,pg-advisory,mariadb-lease,mariadb-row,mariadb-named,sqlite-lease}

LOCKKIT_BENCH_CPUS=0 cargo bench -p lockkit-benches --bench compare
cargo bench -p lockkit-benches --bench cycle_overhead
cargo bench -p lockkit-benches --bench etcd
LOCKKIT_BENCH_CPUS=0 cargo bench -p lockkit-benches --bench family
cargo bench -p lockkit-benches --bench family_peers
cargo bench -p lockkit-benches --bench processes
cargo bench -p lockkit-benches --bench cluster_pubsub
cargo build --release -p lockkit-benches --bin lockkit-load --bin lockkit-scale

if [ "${LOCKKIT_BENCH_QUICK:-}" = 1 ]; then
    load=(-c 100 -n 2000 --stock 1000)
    curves=(--contenders 1,16,256 --keys 1,100 --point 1s)
    density=(--leases 10000)
    held=(--names 10,100,1000 --point 1s)
else
    load=(-c 1000 -n 20000 --stock 10000)
    curves=()
    density=()
    held=()
fi

# The headline scenario: one key, 1 000 tasks, 20 000 requests, stock 10 000.
target/release/lockkit-load --start "$backends" "${load[@]}" --compare-rslock \
    --markdown "$out/seckill-summary.md" | tee "$out/load-summary.txt"
# The same across 8 processes, with rslock and distributed-lock on the same
# servers.
target/release/lockkit-load --start redis,redlock5,pg-advisory,mariadb-named,zk "${load[@]}" \
    --processes 8 --compare-rslock --compare-distributed-lock \
    --markdown "$out/seckill-processes-summary.md" | tee "$out/load-processes-summary.txt"
target/release/lockkit-scale curves --backends "$backends" "${curves[@]}"
target/release/lockkit-scale density "${density[@]}"
# memory:// is one process's store: the held-names workers would not share it.
held_backends=$(tr ',' '\n' <<<"$backends" | grep -vx memory | paste -sd, -)
target/release/lockkit-scale held-names --backends "$held_backends" "${held[@]}"
echo "bench.sh: results in $out" >&2
