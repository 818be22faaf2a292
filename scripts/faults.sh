#!/usr/bin/env bash
# The full fault-injection suite: every scenario on every backend, with a 2 s
# lease and 4 worker processes per run (28 minutes on 2 cores on 27 Nov). Writes
# DIR/report.md (the safety table) and DIR/timelines/*.svg (one picture per
# run); exits non-zero when a run does not go end to end or a backend that
# claims fencing accepts a stale write.
#
#   scripts/faults.sh [DIR] [more lockkit-faults run options…]
#   e.g. scripts/faults.sh target/faults --backends redis,zk --careful
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/faults}"
shift || true
scripts/install-services.sh
cargo run -q -p lockkit-faults -- run --out "$out" "$@"
