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
    // The fail points named in `FAILPOINTS` (failpoints build only; docs/COORDINATOR.md). A
    // panic there is a crash of the node: abort, as `panic = "abort"` would, so that no
    // runtime or spawned task catches it and the process goes on half alive.
    #[cfg(feature = "failpoints")]
    let _fail_points = {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            std::process::abort();
        }));
        fault::fail::FailScenario::setup()
    };
    coordinator::logging::init(coordinator::command::DEFAULT_LOG, false);
    match coordinator::command::run(Cli::parse().node).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podctl-coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}
