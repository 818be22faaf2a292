#!/usr/bin/env bash
# Packages every publishable crate of the workspace as crates.io would get it
# and builds each from its package alone (`cargo package` verifies them
# together, each against the others' packages): a path that escapes a crate,
# a missing README or license, or a file left out of a package fails here.
# The publishable crates are those whose manifest does not say
# `publish = false`.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t crates < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
for package in meta["packages"]:
    if package["id"] in members and package.get("publish") != []:
        print(package["name"])
')
if ((${#crates[@]} == 0)); then
    echo "package.sh: no publishable crate found" >&2
    exit 1
fi
args=()
for crate in "${crates[@]}"; do
    args+=(-p "$crate")
done
# --allow-dirty: CI packages the clone it was given; a developer may package
# uncommitted work to check it.
cargo package --allow-dirty "${args[@]}"
echo "package.sh: packaged and built ${#crates[@]} crates: ${crates[*]}" >&2
