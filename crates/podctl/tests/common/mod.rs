//! What the end-to-end tests of the `podctl` binary share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The `podctl` binary under test, with the repository as its home (the exporter, the plugin)
/// and the tests' bundle cache.
pub fn podctl() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_podctl"));
    command.env("PODCTL_HOME", root()).env("PODCTL_CACHE", root().join("target/test-cache"));
    command
}
