#!/usr/bin/env bash
# Packages every publishable crate of the workspace as crates.io would get it
# and checks each from its package alone: a path that escapes a crate, a
# missing README or license, or a file left out of a package fails here.
# The publishable crates are those whose manifest does not say
# `publish = false`.
#
# `cargo package` would verify the packages by building each one (machine
# code for every dependency, once per package's own features: four and a
# half minutes on CI's two cores, for nothing the type check does not
# already catch). Instead the packages are unpacked side by side into a
# workspace of their own, whose `[patch.crates-io]` points each lockkit crate
# at its package, and each is `cargo check`ed on its own there (its default
# features; its lockkit dependencies from their packages), in this
# workspace's target directory and with its profile: dependencies already
# checked with the same features are not checked again.
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
target="${CARGO_TARGET_DIR:-target}"
packages="$target/packages"
rm -rf -- "$packages"
mkdir -p "$packages/unpacked"
args=()
names=()
# Each package's directory once unpacked: <name>-<version>.
dirs=()
for line in "${crates[@]}"; do
    read -r crate version <<<"$line"
    args+=(-p "$crate")
    names+=("$crate")
    dirs+=("$crate-$version")
done
# --allow-dirty: CI packages the clone it was given; a developer may package
# uncommitted work to check it.
cargo package --no-verify --allow-dirty --target-dir "$packages/build" "${args[@]}"

manifest="$packages/unpacked/Cargo.toml"
{
    echo "# Written by scripts/package.sh: the packages, each checked alone."
    echo "[workspace]"
    echo "members = ["
    printf '    "%s",\n' "${dirs[@]}"
    echo "]"
    echo 'resolver = "3"'
    echo
    echo "[patch.crates-io]"
    for i in "${!names[@]}"; do
        echo "${names[i]} = { path = \"${dirs[i]}\" }"
    done
    echo
    # The workspace's own profile, so that checked dependencies are shared.
    sed -n '/^\[profile\./,/^$/p' Cargo.toml
} >"$manifest"
for dir in "${dirs[@]}"; do
    tar -xzf "$packages/build/package/$dir.crate" -C "$packages/unpacked"
done
# The workspace's versions of the dependencies.
cp Cargo.lock "$packages/unpacked/"
log="$packages/check.log"
for crate in "${names[@]}"; do
    echo "package.sh: checking $crate from its package" >&2
    checked=0
    cargo check --quiet --manifest-path "$manifest" --target-dir "$target" -p "$crate" 2>"$log" ||
        checked=$?
    # The facade's package keeps the workspace's profile, which only the
    # root of a workspace may set: cargo says that it is ignored there.
    grep -v -e '^warning: profiles for the non root package will be ignored' \
        -e '^package: .*Cargo.toml$' -e '^workspace: .*Cargo.toml$' "$log" >&2 || true
    if ((checked != 0)); then
        echo "package.sh: $crate does not build from its package" >&2
        exit "$checked"
    fi
done
echo "package.sh: packaged and checked ${#names[@]} crates: ${names[*]}" >&2
