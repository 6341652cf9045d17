//! Installing podctl as its users do (issue 28), as an unprivileged user (`nobody` through
//! setpriv when the test runs as root, as CI does; the current user otherwise):
//! - the wheel: scripts/build-wheel.sh builds it from the tests' debug build, compiling no
//!   dependency again (`--reuse-only`: features that differed once made this test compile ~160
//!   crates, 20 minutes of CI with the build directory locked), pip installs it into a new
//!   virtual environment in a temporary directory, and the user, whose HOME is another
//!   temporary directory and whose environment names no checkout, writes a 5-step job there and
//!   launches it: the run record appears there and the bundle in the user's cache directory;
//!   `podctl doctor` passes, and fails naming the fix once the CPU plugin is removed;
//! - README command 1's setup (scripts/setup.sh) in a copy of the checkout, with tmux and
//!   prometheus absent from PATH: it succeeds, and the test command's setup (`--test`) stops at
//!   once naming the command that installs them.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The unprivileged user when the test runs as root.
const NOBODY: u32 = 65534;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// `program` run as the unprivileged user, with exactly `env` as its environment.
fn as_user(program: &Path, env: &[(&str, String)]) -> Command {
    let mut command = match is_root() {
        true => {
            let mut command = Command::new("setpriv");
            command.args([
                "--reuid",
                &NOBODY.to_string(),
                "--regid",
                &NOBODY.to_string(),
                "--clear-groups",
                "--",
            ]);
            command.arg(program);
            command
        }
        false => Command::new(program),
    };
    command.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    command
}

/// A directory the unprivileged user owns (the test's temporary directories are root's, 0700).
fn user_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    give_to_user(path);
    path.to_path_buf()
}

fn give_to_user(path: &Path) {
    if is_root() {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
}

/// Lets the unprivileged user into a directory of the test (read and search, not write).
fn open_to_user(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn text(output: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A Python 3.11-3.13 the unprivileged user can run (pyenv's under /root is not one).
fn python_for_user(path: &str) -> PathBuf {
    let in_range = "import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))";
    let env = [("PATH", path.to_string())];
    for dir in std::env::split_paths(path) {
        for name in ["python3", "python3.13", "python3.12", "python3.11"] {
            let python = dir.join(name);
            if python.exists()
                && as_user(&python, &env).args(["-c", in_range]).status().is_ok_and(|s| s.success())
            {
                return python;
            }
        }
    }
    panic!("no Python 3.11-3.13 that an unprivileged user can run on {path}")
}

const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[test]
fn the_wheel_trains_a_job_from_any_directory_as_an_unprivileged_user() {
    let root = root();
    let scratch = tempfile::tempdir().unwrap();
    open_to_user(scratch.path());
    let dist = scratch.path().join("dist");
    let built = Command::new(root.join("scripts/build-wheel.sh"))
        .args(["--debug", "--reuse-only", "--out"])
        .arg(&dist)
        .output()
        .unwrap();
    assert!(built.status.success(), "scripts/build-wheel.sh --debug:\n{}", text(&built));
    let wheel = PathBuf::from(String::from_utf8_lossy(&built.stdout).lines().last().unwrap().trim());
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("podctl-") && name.ends_with(".whl"), "{name}");

    // A new virtual environment, the wheel installed as pip installs it (dependencies from PyPI,
    // or pip's cache).
    let venv = scratch.path().join("venv");
    let python = python_for_user(SYSTEM_PATH);
    let made = Command::new(&python).args(["-m", "venv"]).arg(&venv).output().unwrap();
    assert!(made.status.success(), "{}", text(&made));
    let pip = Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(pip.status.success(), "pip install {name}:\n{}", text(&pip));
    open_to_user(&venv);

    // The user: HOME elsewhere, a job in a directory of its own, no variable naming the checkout.
    let home_dir = tempfile::tempdir().unwrap();
    open_to_user(home_dir.path());
    let home = user_dir(&home_dir.path().join("user"));
    let work = user_dir(&home.join("experiments"));
    let env = [
        ("PATH", format!("{}:{SYSTEM_PATH}", venv.join("bin").display())),
        ("HOME", home.display().to_string()),
        ("LANG", "C.UTF-8".to_string()),
    ];
    let checkout = root.display().to_string();
    assert!(
        env.iter().all(|(_, v)| !v.contains(&checkout))
            && !venv.starts_with(&root)
            && !home.starts_with(&root)
    );
    let podctl = venv.join("bin/podctl");
    let run = |args: &[&str]| as_user(&podctl, &env).args(args).current_dir(&work).output().unwrap();

    let doctor = run(&["doctor"]);
    let report = text(&doctor);
    assert!(doctor.status.success(), "podctl doctor:\n{report}");
    for check in ["podctl", "python", "jax", "plugin", "cache"] {
        assert!(
            report.lines().any(|l| l.starts_with("ok") && l.split_whitespace().nth(1) == Some(check)),
            "{check}:\n{report}"
        );
    }
    assert!(report.contains(&format!("installed in {}", venv.display())), "{report}");
    assert!(report.contains(&home.join(".cache/podctl").display().to_string()), "{report}");

    std::fs::write(
        work.join("job.yaml"),
        "name: from-the-wheel\nmodel: tiny\nmesh: { ici: { fsdp: 2, tp: 1 } }\nbatch: { global: 8, micro: 4 }\n\
         seq_len: 128\nsteps: 5\ndata: { kind: arithmetic }\n",
    )
    .unwrap();
    let launch = run(&["launch", "job.yaml"]);
    assert!(launch.status.success(), "podctl launch:\n{}", text(&launch));
    let record = work.join("runs/from-the-wheel");
    let metrics = std::fs::read_to_string(record.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 5, "{metrics}");
    assert!(record.join("summary.json").exists());
    let bundles = std::fs::read_dir(home.join(".cache/podctl/bundles")).unwrap();
    assert!(
        bundles.flatten().any(|b| b.path().join("manifest.json").exists()),
        "no bundle in the user's cache"
    );

    // Without the plugin, doctor names it and the command that installs it.
    let plugin = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"))
        .find(|p| p.exists())
        .expect("the wheel installed the CPU plugin");
    std::fs::rename(&plugin, plugin.with_extension("so.removed")).unwrap();
    let doctor = run(&["doctor"]);
    let report = text(&doctor);
    assert_eq!(doctor.status.code(), Some(1), "{report}");
    let line = report.lines().find(|l| l.starts_with("FAIL  plugin")).unwrap_or_else(|| panic!("{report}"));
    let python3 = venv.join("bin/python3").display().to_string();
    let fix = format!("{python3} -m pip install --force-reinstall 'xla-cpu-pjrt==0.0.1'");
    assert!(line.ends_with(&format!("; fix: {fix}")), "{line}");
    assert_eq!(report.lines().filter(|l| l.starts_with("FAIL")).count(), 1, "{report}");
    // And that command fixes it (run by the environment's owner).
    let fixed = Command::new("sh")
        .args(["-c", &format!("{fix} --quiet --disable-pip-version-check")])
        .output()
        .unwrap();
    assert!(fixed.status.success(), "{fix}:\n{}", text(&fixed));
    let doctor = run(&["doctor"]);
    assert!(doctor.status.success(), "podctl doctor after the fix:\n{}", text(&doctor));
}

/// Copies `from` into `to` (what setup.sh reads: its scripts and the exporter), skipping caches.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    give_to_user(to);
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "__pycache__" || name == ".pytest_cache" {
            continue;
        }
        let (source, target) = (entry.path(), to.join(&name));
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&source, &target);
        } else {
            std::fs::copy(&source, &target).unwrap();
            give_to_user(&target);
        }
    }
}

/// A directory of links to every program on PATH but `absent`.
fn path_without(absent: &[&str], dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for source in std::env::split_paths(SYSTEM_PATH) {
        for entry in std::fs::read_dir(&source).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let link = dir.join(&name);
            if !absent.iter().any(|a| name == *a) && !link.exists() {
                std::os::unix::fs::symlink(entry.path(), link).unwrap();
            }
        }
    }
    open_to_user(dir);
    dir.display().to_string()
}

#[test]
fn readme_command_1s_setup_needs_no_root_and_no_test_tools() {
    let root = root();
    let scratch = tempfile::tempdir().unwrap();
    open_to_user(scratch.path());
    let checkout = user_dir(&scratch.path().join("podctl"));
    for dir in ["scripts", "models"] {
        copy_tree(&root.join(dir), &checkout.join(dir));
    }
    let path = path_without(&["tmux", "prometheus", "promtool"], &scratch.path().join("bin"));
    let env = [
        ("PATH", path.clone()),
        ("HOME", user_dir(&scratch.path().join("home")).display().to_string()),
        ("LANG", "C.UTF-8".to_string()),
    ];
    let bash = Path::new("/bin/bash");
    let setup = as_user(bash, &env).arg("scripts/setup.sh").current_dir(&checkout).output().unwrap();
    assert!(setup.status.success(), "scripts/setup.sh:\n{}", text(&setup));
    let imports = as_user(&checkout.join(".venv/bin/python"), &env)
        .args(["-c", "import jax, podctl_models.export, xla_plugins.xla_cpu_pjrt; print(jax.__version__)"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&imports.stdout).trim(), "0.10.2", "{}", text(&imports));

    // The test command's setup stops before installing anything, naming what is missing and the fix.
    let test_setup =
        as_user(bash, &env).args(["scripts/setup.sh", "--test"]).current_dir(&checkout).output().unwrap();
    let report = text(&test_setup);
    assert_eq!(test_setup.status.code(), Some(1), "{report}");
    for missing in ["tmux is missing", "prometheus is missing", "sudo scripts/install-test-tools.sh"] {
        assert!(report.contains(missing), "{missing}:\n{report}");
    }
    assert!(!report.contains("test.lock into .venv"), "{report}");
}
