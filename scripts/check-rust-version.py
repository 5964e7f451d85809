#!/usr/bin/env python3
"""Checks that the workspace's `rust-version` is true for its whole dependency tree.

Reads `cargo metadata` (every feature on, the locked versions) and walks the resolved graph from
the workspace's members. Every package a member builds with (normal and build dependencies, and
theirs) must need a Rust no newer than the workspace's `rust-version`: what a package needs is its
own `rust-version`, or, where it declares none, the first release of its edition. Dev-dependencies
are only built for the workspace's own tests, so they are reported, not held to it. Each member
must declare the workspace's `rust-version`.

This checks what the packages declare; the workspace's own code is held to its `rust-version` by
clippy's `incompatible_msrv` lint, which CI runs with `-D warnings`.

Usage, from anywhere in the repository: python3 scripts/check-rust-version.py
Exits 1, naming each offending package and the members that pull it in, when one needs a newer Rust.
"""
import json
import os
import subprocess
import sys
from collections import deque

# The first Rust release of each edition: the least a package without `rust-version` can need.
EDITION_MINIMUM = {"2015": "1.0", "2018": "1.31", "2021": "1.56", "2024": "1.85"}


def version(text):
    """`1.85`, `1.85.0` -> (1, 85, 0)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(str(p) for p in (v[:2] if v[2] == 0 else v))


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
        cwd=root, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    members = meta["workspace_members"]

    def needs(pkg):
        """What the package needs, and whether it says so itself."""
        if pkg.get("rust_version"):
            return version(pkg["rust_version"]), True
        return version(EDITION_MINIMUM.get(pkg["edition"], "1.0")), False

    declared = {packages[m]["rust_version"] for m in members}
    if len(declared) != 1 or None in declared:
        sys.exit(f"check-rust-version: the members declare {sorted(map(str, declared))}; "
                 "each should inherit the workspace's rust-version")
    workspace = version(declared.pop())

    # `kind` is None for a normal dependency, "build" or "dev" otherwise.
    edges = {}
    for node in meta["resolve"]["nodes"]:
        edges[node["id"]] = [(d["pkg"], {k["kind"] for k in d["dep_kinds"]}) for d in node["deps"]]

    def walk(starts):
        """Packages reachable through normal and build edges, each with the path that first
        reached it."""
        seen = dict(starts)
        queue = deque(seen)
        while queue:
            pid = queue.popleft()
            for dep, kinds in edges.get(pid, []):
                if kinds - {"dev"} and dep not in seen:
                    seen[dep] = seen[pid] + [dep]
                    queue.append(dep)
        return seen

    built = walk({m: [m] for m in members})
    dev_starts = {}
    for m in members:
        for dep, kinds in edges.get(m, []):
            if "dev" in kinds and dep not in built and dep not in dev_starts:
                dev_starts[dep] = [m, dep]
    dev_only = {p: path for p, path in walk(dev_starts).items() if p not in built}

    def name(pid):
        return f"{packages[pid]['name']} {packages[pid]['version']}"

    def newest(ids):
        return max((needs(packages[p])[0] for p in ids), default=(1, 0, 0))

    failures = []
    undeclared = []
    for pid, path in sorted(built.items(), key=lambda kv: name(kv[0])):
        need, declares = needs(packages[pid])
        if not declares:
            undeclared.append(packages[pid]["name"])
        if need > workspace:
            failures.append(f"  {name(pid)} needs Rust {show(need)}: "
                            + " -> ".join(packages[p]["name"] for p in path))

    print(f"check-rust-version: the workspace declares {show(workspace)}; "
          f"its {len(built)} packages need at least {show(newest(built))}")
    if undeclared:
        print(f"  declaring no rust-version (their edition's first release counted): "
              f"{', '.join(sorted(set(undeclared)))}")
    late_dev = [p for p in dev_only if needs(packages[p])[0] > workspace]
    if late_dev:
        print(f"  the tests' dev-dependencies need {show(newest(dev_only))}: "
              + ", ".join(sorted(name(p) for p in late_dev)))
    if failures:
        print("check-rust-version: these need a newer Rust than the workspace's rust-version; raise it "
              "or hold the dependency back:", file=sys.stderr)
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
