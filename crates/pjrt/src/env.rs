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
