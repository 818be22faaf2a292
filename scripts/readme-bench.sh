#!/usr/bin/env bash
# Copies benchmark summaries into README.md, so that the README's figures are
# a run's output and never typed by hand:
#
#   scripts/readme-bench.sh family family-peers
#
# replaces the text between `<!-- bench:<name>:start -->` and
# `<!-- bench:<name>:end -->` with target/lockkit-bench/<name>-summary.md
# (written by `cargo bench -p lockkit-benches --bench <bench>`; test-mode runs
# write none). The summary's titles become bold lines. Its charts,
# target/lockkit-bench/<name>-*.svg, are copied to docs/ (where the README
# shows them).
set -euo pipefail
cd "$(dirname "$0")/.."
for name in "$@"; do
    python3 - "$name" <<'PY'
import pathlib
import sys

name = sys.argv[1]
summary = pathlib.Path(f"target/lockkit-bench/{name}-summary.md")
if not summary.exists():
    sys.exit(f"{summary} is missing: run its benchmark first (not in test mode)")
lines = summary.read_text().strip().splitlines()
# A summary's titles (one per runtime flavour, say) become bold lines: as
# headings they would break the README's outline.
lines = ["**" + l[3:] + "**" if l.startswith("## ") else l for l in lines]
readme = pathlib.Path("README.md")
text = readme.read_text()
start, end = f"<!-- bench:{name}:start -->\n", f"<!-- bench:{name}:end -->"
if start not in text or end not in text:
    sys.exit(f"README.md has no {start.strip()} ... {end} block")
a, b = text.index(start) + len(start), text.index(end)
readme.write_text(text[:a] + "\n".join(lines) + "\n" + text[b:])
print(f"README.md: {name} block replaced from {summary}")
for chart in sorted(summary.parent.glob(f"{name}-*.svg")):
    pathlib.Path("docs", chart.name).write_bytes(chart.read_bytes())
    print(f"docs/{chart.name}: copied from {chart}")
PY
done
