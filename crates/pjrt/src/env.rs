//! The environment a plugin reads when it loads.

/// XLA's C++ logging threshold, read by the plugins (`0`: info and up, `1`: warnings and up).
const LOG_LEVEL_VAR: &str = "TF_CPP_MIN_LOG_LEVEL";

/// Keeps XLA's INFO lines off stderr: sets `TF_CPP_MIN_LOG_LEVEL=1` unless the user chose a
/// level. Call it first thing in `main`. It changes the environment only while this process has
/// a single thread, since changing it while another thread may read it is undefined behaviour
/// (why `std::env::set_var` is `unsafe`); otherwise it leaves it alone. Returns whether it set
/// the variable.
pub fn quiet_plugin_logs() -> bool {
    if std::env::var_os(LOG_LEVEL_VAR).is_some() || !single_threaded() {
        return false;
    }
    // SAFETY: this process has no other thread that could read the environment meanwhile
    // (checked just above, and only this thread could have started one since).
    unsafe { std::env::set_var(LOG_LEVEL_VAR, "1") };
    true
}

/// glibc's switch for transparent huge pages under malloc (glibc 2.35 and later; older ones and
/// other C libraries ignore it).
const HUGE_PAGE_MALLOC: &str = "glibc.malloc.hugetlb";

/// Restarts this process (same executable, arguments and pid) with glibc's malloc on transparent
/// huge pages, unless `GLIBC_TUNABLES` already sets `glibc.malloc.hugetlb` (the user's choice, or
/// this restart's). XLA's CPU runtime takes every buffer a program runs with from malloc; on
/// 4 KiB pages the kernel faults them in page by page at every step (a GRPO step of
/// `examples/grpo-arith.yaml`: 0.87-1.1 s, with huge pages 0.75-0.79 s). glibc reads its
/// tunables only when a process starts, hence the restart; call it first thing in `main`, and
/// only in commands that run programs. Returns only if it did not restart (the tunable is
/// already set, or the restart failed, which is logged).
pub fn restart_with_huge_page_malloc() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !cfg!(target_os = "linux") || tunables.contains(HUGE_PAGE_MALLOC) {
        return;
    }
    let tunables = match tunables.is_empty() {
        true => format!("{HUGE_PAGE_MALLOC}=1"),
        false => format!("{tunables}:{HUGE_PAGE_MALLOC}=1"),
    };
    let error = match std::env::current_exe() {
        Ok(exe) => {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("GLIBC_TUNABLES", tunables)
                .exec()
        }
        Err(error) => error,
    };
    tracing::debug!(%error, "running without huge pages under malloc: restarting failed");
}

/// Whether this process has exactly one thread (one entry in `/proc/self/task`).
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_another_thread_the_environment_is_left_alone() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || stopped.recv());
        assert!(!single_threaded());
        let before = std::env::var_os(LOG_LEVEL_VAR);
        assert!(!quiet_plugin_logs());
        assert_eq!(std::env::var_os(LOG_LEVEL_VAR), before);
        stop.send(()).unwrap();
        other.join().unwrap().unwrap();
    }
}
