//! Worker integration tests against the real CPU PJRT plugin and JAX (through the project's
//! Python environment, which `scripts/setup.sh` prepares).

extern crate podctl_worker as worker;

mod ckpt;
mod determinism;
mod grpo;
mod huggingface;
mod lineage;
mod lora;
mod members;
mod multislice;
mod parity;
mod peer;
mod support;
