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

/// How many times [`restart_with_malloc_for_xla`] restarts before it keeps what glibc gave.
const MAX_MALLOC_RESTARTS: u32 = 8;

/// The restarts so far, set by [`restart_with_malloc_for_xla`] only; its presence also says the
/// tunables are podctl's, not the user's.
const RESTARTS_VAR: &str = "PODCTL_MALLOC_RESTARTS";

/// Restarts this process (same executable, arguments and pid) with [`MALLOC_TUNABLES`] added to
/// `GLIBC_TUNABLES`, unless the user set `glibc.malloc.hugetlb`; a key the user set keeps the
/// user's value. Measured on the GRPO step of `examples/grpo-arith.yaml` over 36 steps: 5.8-6.5 M
/// page faults and a median step of 0.81-0.96 s with glibc's defaults, 70 k and 0.68-0.75 s
/// with these. glibc reads its tunables only when a process starts, hence the restart: call it
/// first thing in `main`, only in commands that run programs.
///
/// glibc 2.35-2.36 ignore `glibc.malloc.hugetlb=1` in about 4 processes of 10 (they compare the
/// sysfs mode string through an unterminated stack buffer, so the outcome follows address-space
/// randomization), and then every execution's temporaries (133 MiB for the example's gradient
/// step, mapped and unmapped at each execution) fault in 4 KiB at a time again. So the restarted
/// process checks that malloc's mappings are advised for huge pages, and restarts again if not,
/// up to [`MAX_MALLOC_RESTARTS`] times. Returns only if it did not restart (nothing to do, or the
/// restart failed, which is logged).
pub fn restart_with_malloc_for_xla() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let restarts = std::env::var(RESTARTS_VAR).ok().and_then(|n| n.parse::<u32>().ok());
    let settings = match restarts {
        None if tunables.contains(MALLOC_TUNABLES[0].0) => return,
        None => {
            let mut settings: Vec<String> =
                tunables.split(':').filter(|s| !s.is_empty()).map(String::from).collect();
            for (key, value) in MALLOC_TUNABLES {
                if !tunables.contains(key) {
                    settings.push(format!("{key}={value}"));
                }
            }
            settings.join(":")
        }
        Some(n) if n >= MAX_MALLOC_RESTARTS || !huge_pages_need_advice() || malloc_uses_huge_pages() => {
            // Children (a launch's local workers) check for themselves, with every try left.
            if single_threaded() {
                // SAFETY: this process has no other thread that could read the environment.
                unsafe { std::env::set_var(RESTARTS_VAR, "0") };
            }
            return;
        }
        Some(_) => tunables,
    };
    let error = match std::env::current_exe() {
        Ok(exe) => {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("GLIBC_TUNABLES", settings)
                .env(RESTARTS_VAR, (restarts.unwrap_or(0) + 1).to_string())
                .exec()
        }
        Err(error) => error,
    };
    tracing::debug!(%error, "running with glibc's malloc defaults: restarting failed");
}

/// Whether the kernel gives huge pages only to memory advised for them (`madvise` mode), the one
/// mode in which glibc advises its mappings (`always` needs no advice, `never` takes none).
fn huge_pages_need_advice() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|mode| mode.contains("[madvise]"))
}

/// Whether glibc's malloc advises its mappings for huge pages: a block above the mmap threshold
/// gets a mapping of its own, whose `VmFlags` in `/proc/self/smaps` include `hg` if it did.
fn malloc_uses_huge_pages() -> bool {
    const BLOCK: usize = 64 << 20;
    // SAFETY: a block this function owns and frees, never read or written.
    let block = unsafe { libc::malloc(BLOCK) };
    if block.is_null() {
        return false;
    }
    let advised = std::fs::read_to_string("/proc/self/smaps").is_ok_and(|smaps| {
        vm_flags_at(&smaps, block as usize).is_some_and(|flags| flags.split_whitespace().any(|f| f == "hg"))
    });
    // SAFETY: `block` came from `malloc` above and is freed once.
    unsafe { libc::free(block) };
    advised
}

/// The `VmFlags` line of the mapping in `smaps` (`/proc/<pid>/smaps`) that holds `address`.
fn vm_flags_at(smaps: &str, address: usize) -> Option<&str> {
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside {
                return Some(flags);
            }
        } else if let Some((start, end)) = line.split_once(' ').and_then(|(range, _)| range.split_once('-'))
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            inside = (start..end).contains(&address);
        }
    }
    None
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

    #[test]
    fn the_flags_of_the_mapping_that_holds_an_address() {
        let smaps = "\
1000-3000 rw-p 00000000 00:00 0
Size:                  8 kB
VmFlags: rd wr mr mw me ac
7f00000000-7f04000000 rw-p 00000000 00:00 0 
THPeligible:           1
VmFlags: rd wr mr mw me ac hg
";
        assert_eq!(vm_flags_at(smaps, 0x2fff), Some(" rd wr mr mw me ac"));
        assert_eq!(vm_flags_at(smaps, 0x7f00001000), Some(" rd wr mr mw me ac hg"));
        assert_eq!(vm_flags_at(smaps, 0x3000), None);
    }

    /// glibc ignores its huge-page tunable in some processes at random: without the check and
    /// the restarts that follow it, this fails about 4 times in 10. The test runs itself as three
    /// fresh child processes (`PODCTL_RESTART_CHILD` set), which restart and report.
    #[test]
    fn malloc_takes_huge_pages_after_the_restart() {
        if std::env::var_os("PODCTL_RESTART_CHILD").is_some() {
            restart_with_malloc_for_xla();
            println!("huge pages: {}", malloc_uses_huge_pages());
            return;
        }
        if !huge_pages_need_advice() {
            eprintln!("skipped: transparent huge pages are not in `madvise` mode here");
            return;
        }
        for _ in 0..3 {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "env::tests::malloc_takes_huge_pages_after_the_restart"])
                .args(["--nocapture", "--test-threads=1"])
                .env("PODCTL_RESTART_CHILD", "1")
                .env_remove("GLIBC_TUNABLES")
                .env_remove(RESTARTS_VAR)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.contains("huge pages: true"), "{stdout}");
        }
    }
}
