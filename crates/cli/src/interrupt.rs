//! Ctrl-C during a local run: the first asks the run to stop at the next step boundary, where
//! it saves a checkpoint (the run reads the request through [`worker::Control`]); a second ends
//! the process at once, with status 130 and without saving.

use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether Ctrl-C was pressed.
pub struct CtrlC {
    pressed: Arc<AtomicBool>,
}

impl CtrlC {
    /// Watches for SIGINT from now on (the handler is in place when this returns), saying
    /// `first` on the first and ending the process on the second; the watch is a task on
    /// `runtime` while the run trains on the calling thread.
    pub fn watch(first: &'static str, runtime: &tokio::runtime::Handle) -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let pressed = Arc::new(AtomicBool::new(false));
        let mut sigint = {
            let _inside = runtime.enter();
            signal(SignalKind::interrupt()).context("cannot watch for Ctrl-C")?
        };
        let flag = pressed.clone();
        runtime.spawn(async move {
            sigint.recv().await;
            flag.store(true, Ordering::SeqCst);
            eprintln!("\n{first} (Ctrl-C again stops at once, without saving)");
            sigint.recv().await;
            eprintln!("stopped at once (Ctrl-C twice)");
            std::process::exit(130);
        });
        Ok(Self { pressed })
    }
}

impl worker::Control for CtrlC {
    fn interrupted(&self, _done: u64) -> bool {
        self.pressed.load(Ordering::SeqCst)
    }
}
