//! Runs one coordinator node (the container image and process tests use it), or makes
//! development certificates: [`coordinator::command`] has the flags, and `podctl coordinator`
//! is the same command.
#![forbid(unsafe_code)]

// The workspace names this crate `coordinator` everywhere else.
extern crate podctl_coordinator as coordinator;

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(version, about = "A podctl coordinator node")]
struct Cli {
    #[command(flatten)]
    node: coordinator::command::NodeCommand,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| coordinator::command::DEFAULT_LOG.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match coordinator::command::run(Cli::parse().node).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podctl-coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}
