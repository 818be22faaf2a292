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
        print(package["name"], package["version"])
')
if ((${#crates[@]} == 0)); then
    echo "package.sh: no publishable crate found" >&2
    exit 1
fi
# `cargo package` verifies the crates against a local registry of their
# packages. It unpacks each into $CARGO_HOME/registry/src/-<hash of the
# workspace path>/<name>-<version> and never unpacks that again, and it
# rebuilds a registry crate only when its version changes: a second run from
# the same path (CI reuses its checkout path) would build against the
# packages of the first. So the unpacked copies are removed first, and the
# packages are built in a target directory of their own, emptied each run.
registry_src="${CARGO_HOME:-$HOME/.cargo}/registry/src"
args=()
names=()
for line in "${crates[@]}"; do
    read -r crate version <<<"$line"
    args+=(-p "$crate")
    names+=("$crate")
    for stale in "$registry_src"/-*/"$crate-$version"; do
        if [[ -d $stale ]]; then
            rm -rf -- "$stale"
        fi
    done
done
# --allow-dirty: CI packages the clone it was given; a developer may package
# uncommitted work to check it.
verify_dir=target/package-verify
rm -rf -- "$verify_dir"
# The packages are built without debug info: the build only has to succeed.
# Of the workspace's profile (line tables only, none for dependencies), only
# the facade's package keeps a copy: the others would build with full debug
# info, and their dependencies a second time beside the facade's.
CARGO_PROFILE_DEV_DEBUG=false cargo package --allow-dirty --target-dir "$verify_dir" "${args[@]}"
echo "package.sh: packaged and built ${#names[@]} crates: ${names[*]}" >&2
