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

/// glibc's malloc settings for XLA's CPU runtime, which takes every buffer a program runs with
/// from malloc and frees it when the execution ends: transparent huge pages under malloc, and
/// freed memory kept for the next step rather than handed back and faulted in again page by page
/// (allocations up to 32 MiB served from the heap, up to 256 MiB of free heap kept, the heap
/// grown 64 MiB at a time). Keys glibc does not know (before 2.35, or another C library) are
/// ignored.
const MALLOC_TUNABLES: [(&str, &str); 4] = [
    ("glibc.malloc.hugetlb", "1"),
    ("glibc.malloc.mmap_threshold", "33554432"),
    ("glibc.malloc.trim_threshold", "268435456"),
    ("glibc.malloc.top_pad", "67108864"),
];

/// Restarts this process (same executable, arguments and pid) with [`MALLOC_TUNABLES`] added to
/// `GLIBC_TUNABLES`, unless it already sets `glibc.malloc.hugetlb` (the user's choice, or this
/// restart's); a key the user set keeps the user's value. Measured on the GRPO step of
/// `examples/grpo-arith.yaml` over 36 steps: 6.5 M page faults and a median step of 0.96 s with
/// glibc's defaults, 70 k and 0.68-0.75 s with these. glibc reads its tunables only when a
/// process starts, hence the restart: call it first thing in `main`, only in commands that run
/// programs. Returns only if it did not restart (already set, or the restart failed, which is
/// logged).
pub fn restart_with_malloc_for_xla() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !cfg!(target_os = "linux") || tunables.contains(MALLOC_TUNABLES[0].0) {
        return;
    }
    let mut settings: Vec<String> = tunables.split(':').filter(|s| !s.is_empty()).map(String::from).collect();
    for (key, value) in MALLOC_TUNABLES {
        if !tunables.contains(key) {
            settings.push(format!("{key}={value}"));
        }
    }
    let error = match std::env::current_exe() {
        Ok(exe) => {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("GLIBC_TUNABLES", settings.join(":"))
                .exec()
        }
        Err(error) => error,
    };
    tracing::debug!(%error, "running with glibc's malloc defaults: restarting failed");
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
