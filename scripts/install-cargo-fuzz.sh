#!/usr/bin/env bash
# Installs the pinned cargo-fuzz into .tools/cargo-fuzz-<version>/ from crates.io (unless that
# version is already on PATH) and prints the directory to put on PATH. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.13.1
dest=.tools/cargo-fuzz-$version

if command -v cargo-fuzz >/dev/null && [ "$(cargo-fuzz --version 2>/dev/null)" = "cargo-fuzz $version" ]; then
  dirname "$(command -v cargo-fuzz)"
  exit 0
fi
if [ ! -x "$dest/bin/cargo-fuzz" ]; then
  echo "install-cargo-fuzz: cargo-fuzz $version into $dest" >&2
  cargo install cargo-fuzz --version "$version" --locked --root "$dest" >&2
fi
echo "$PWD/$dest/bin"
