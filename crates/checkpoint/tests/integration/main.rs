//! Integration tests of podctl-checkpoint: one binary (shared fixtures, one link step).
//!
//! The S3 and GCS tests start moto and fake-gcs-server from the project's venv on free loopback
//! ports; they fail with "run scripts/setup.sh --test" when the emulators are not installed.

// The workspace names this crate `checkpoint` everywhere else; so do its tests.
extern crate podctl_checkpoint as checkpoint;

mod common;
mod gcs;
mod kill;
mod lifecycle;
mod roundtrip;
mod s3;
