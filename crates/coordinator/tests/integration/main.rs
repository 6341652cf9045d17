//! Integration tests of podctl-coordinator: one binary (shared fixtures, one link step).
//!
//! - `local`: an in-process single node (local mode) with simulated workers: a job to the end,
//!   worker loss and replacement, checkpoints through the checkpoint crate, KV, logs, run record.
//! - `metrics`: `/metrics` scraped during a job: steps, checkpoint bytes, a lease expiry and its
//!   recovery, the Raft term and commit index.
//! - `security`: tokens, client certificates, generation fencing, job isolation.
//! - `hostile`: oversized RPCs, one job's token against another job, `..` in keys, no token in
//!   logs or on disk.
//! - `kubernetes`: the controller inside a node against a Kubernetes API server on loopback:
//!   a job's pods, a deleted pod as a preemption and its replacement, `--kube-context` routes.
//! - `cluster`: three `podctl-coordinator` processes on loopback: SIGKILL the leader mid-run,
//!   restart it (it catches up by snapshot), stop and restart all three.
//!
//! Simulated workers are real gRPC clients built on the client crate (`podctl-client`); they do what
//! docs/PROTOCOL.md asks of a worker, with a sleep in place of the train step.

// The workspace names this crate `coordinator` everywhere else; so do its tests.
extern crate podctl_coordinator as coordinator;

mod cluster;
mod common;
mod hostile;
mod kubernetes;
mod local;
mod metrics;
mod security;
mod sim;
