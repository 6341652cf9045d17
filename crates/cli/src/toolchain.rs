//! Where podctl finds what it runs: a Python environment with JAX and the exporter
//! (`podctl_models`), the PJRT plugins installed into it, and the cache of exported bundles.
//!
//! Two layouts, looked for in this order:
//! - **installed** (`pip install podctl-*.whl`): the binary is in an environment's scripts
//!   directory (`<env>/bin/podctl`), the exporter and the CPU plugin in that environment's
//!   `lib/python3.*/site-packages` (a virtual environment, or `~/.local` for `pip install --user`);
//! - **a checkout** (`scripts/setup.sh`): `models/` and `.venv/`, upwards from the binary or the
//!   working directory, or wherever `PODCTL_HOME` says.
//!
//! `PODCTL_PYTHON`, `PODCTL_PJRT_PLUGIN` and `PODCTL_CACHE` override their part. Bundles are
//! cached in the user's cache directory (`$XDG_CACHE_HOME/podctl`, else `~/.cache/podctl`;
//! `~/Library/Caches/podctl` on macOS); runs are written under the working directory.

use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The CPU plugin's file in a site-packages directory (PyPI's `xla-cpu-pjrt`).
pub const CPU_PLUGIN: &str = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
/// libtpu's plugin in a site-packages directory (PyPI's `libtpu`, the wheel's `tpu` extra).
pub const LIBTPU: &str = "libtpu/libtpu.so";
/// The pins the fixes name: the wheel's (pyproject.toml), quoted for a shell.
pub const CPU_PLUGIN_REQUIREMENT: &str = "'xla-cpu-pjrt==0.0.1'";
/// The wheel's `tpu` extra.
pub const LIBTPU_REQUIREMENT: &str = "'libtpu==0.0.42.1'";

/// How podctl was installed, which decides where its Python side is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// From the wheel, into the environment rooted here (`<prefix>/bin/podctl`).
    Installed { prefix: PathBuf },
    /// A checkout prepared by `scripts/setup.sh`.
    Checkout { home: PathBuf },
}

/// The tools of one podctl installation.
pub struct Toolchain {
    pub layout: Layout,
    /// The Python that has JAX and `podctl_models`.
    pub python: PathBuf,
    /// The directory that holds the `podctl_models` package (its sources key the bundle cache).
    pub models: PathBuf,
    /// Exported bundles, by content key, and compiled programs.
    pub cache: PathBuf,
}

impl Toolchain {
    pub fn discover() -> Result<Self> {
        let exe = std::env::current_exe().ok();
        let home = std::env::var_os("PODCTL_HOME").map(PathBuf::from);
        let layout = find_layout(home, exe.as_deref(), std::env::current_dir().ok().as_deref())?;
        let models = match &layout {
            Layout::Checkout { home } => home.join("models"),
            Layout::Installed { prefix } => site_packages(prefix)
                .into_iter()
                .find(|dir| dir.join("podctl_models").is_dir())
                .context("the podctl_models package left the environment podctl was installed into")?,
        };
        let python = match std::env::var_os("PODCTL_PYTHON") {
            Some(python) => PathBuf::from(python),
            None => default_python(&layout, &models)?,
        };
        if !python.exists() {
            bail!("the Python {} is missing; {}", python.display(), reinstall_hint(&layout));
        }
        let cache = cache_dir(|name| std::env::var_os(name))
            .context("no cache directory: HOME is not set; set HOME, XDG_CACHE_HOME or PODCTL_CACHE")?;
        Ok(Self { layout, python, models, cache })
    }

    /// The exporter's sources, which key the bundle cache; the exporter runs with this first on
    /// its `PYTHONPATH`.
    pub fn models_dir(&self) -> PathBuf {
        self.models.clone()
    }

    /// The site-packages directories of podctl's environment: where the binary was installed,
    /// and that of the Python it runs (`PODCTL_PYTHON` may name another environment).
    pub fn site_packages(&self) -> Vec<PathBuf> {
        let mut prefixes = match &self.layout {
            Layout::Installed { prefix } => vec![prefix.clone()],
            Layout::Checkout { home } => vec![home.join(".venv")],
        };
        // `<env>/bin/python` -> `<env>`; not canonicalized: a venv's python links elsewhere.
        if let Some(env) = self.python.parent().and_then(Path::parent) {
            prefixes.push(env.to_path_buf());
        }
        let mut dirs: Vec<PathBuf> = prefixes.iter().flat_map(|p| site_packages(p)).collect();
        dirs.dedup();
        dirs
    }

    /// `relative` (e.g. [`LIBTPU`]) in the first of [`Self::site_packages`] that has it.
    pub fn find_installed(&self, relative: &str) -> Option<PathBuf> {
        self.site_packages().into_iter().map(|dir| dir.join(relative)).find(|p| p.exists())
    }

    /// The PJRT plugin: the job's choice, else `PODCTL_PJRT_PLUGIN`, else the CPU plugin in
    /// podctl's Python environment.
    pub fn plugin(&self, from_job: Option<&Path>) -> Result<PathBuf> {
        self.find_plugin(from_job).with_context(|| {
            format!(
                "{}; install it with `{}`, or set runtime.plugin in the job or PODCTL_PJRT_PLUGIN",
                self.missing_plugin(),
                self.pip_install(CPU_PLUGIN_REQUIREMENT)
            )
        })
    }

    /// [`Self::plugin`], `None` when there is no CPU plugin to fall back on.
    pub fn find_plugin(&self, from_job: Option<&Path>) -> Option<PathBuf> {
        from_job
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("PODCTL_PJRT_PLUGIN").map(PathBuf::from))
            .or_else(|| self.find_installed(CPU_PLUGIN))
    }

    /// Where the CPU plugin was looked for.
    pub fn missing_plugin(&self) -> String {
        let dirs: Vec<String> = self.site_packages().iter().map(|d| d.display().to_string()).collect();
        format!("no CPU PJRT plugin ({CPU_PLUGIN}) in {}", dirs.join(", "))
    }

    /// The command that (re)installs `requirements` (quoted pip requirements) into podctl's
    /// Python environment, whether they are missing or broken.
    pub fn pip_install(&self, requirements: &str) -> String {
        format!("{} -m pip install --force-reinstall {requirements}", self.python.display())
    }
}

/// Where bundles and compiled programs are cached: `PODCTL_CACHE`, else the user's cache
/// directory (XDG's on Linux, `~/Library/Caches` on macOS); `None` without a HOME. `env` reads
/// a variable.
pub fn cache_dir(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(dir) = env("PODCTL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let home = || env("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let base = if cfg!(target_os = "macos") {
        home().map(|h| h.join("Library/Caches"))
    } else {
        // The XDG spec ignores a relative XDG_CACHE_HOME.
        env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute())
            .or_else(|| home().map(|h| h.join(".cache")))
    };
    base.map(|b| b.join("podctl"))
}

/// `PODCTL_HOME`, else an environment the binary was installed into, else a checkout above the
/// binary or the working directory.
fn find_layout(podctl_home: Option<PathBuf>, exe: Option<&Path>, cwd: Option<&Path>) -> Result<Layout> {
    if let Some(home) = podctl_home {
        return Ok(Layout::Checkout { home });
    }
    let prefix = exe.and_then(Path::parent).and_then(Path::parent);
    if let Some(prefix) = prefix
        && site_packages(prefix).iter().any(|dir| dir.join("podctl_models").is_dir())
    {
        return Ok(Layout::Installed { prefix: prefix.to_path_buf() });
    }
    let is_home = |dir: &Path| dir.join("models/podctl_models").is_dir();
    [exe, cwd]
        .into_iter()
        .flatten()
        .find_map(|start| start.ancestors().find(|d| is_home(d)))
        .map(|home| Layout::Checkout { home: home.to_path_buf() })
        .context(
            "cannot find podctl's Python side (JAX and the exporter): install podctl into a virtual \
             environment (`pip install podctl-*.whl`, scripts/build-wheel.sh builds it), or run it from a \
             checkout prepared by scripts/setup.sh, or set PODCTL_HOME to that checkout",
        )
}

/// `<prefix>/lib/python3.*/site-packages`, newest Python first.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { return Vec::new() };
    let mut dirs: Vec<(u32, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let minor = e.file_name().to_str()?.strip_prefix("python3.")?.parse().ok()?;
            let dir = e.path().join("site-packages");
            dir.is_dir().then_some((minor, dir))
        })
        .collect();
    dirs.sort_by_key(|b| std::cmp::Reverse(b.0));
    dirs.into_iter().map(|(_, dir)| dir).collect()
}

/// The Python of a layout: the checkout's `.venv`, or the one beside the installed binary (a
/// virtual environment's), else `python3.X` on PATH for the site-packages podctl went into
/// (`pip install --user`).
fn default_python(layout: &Layout, models: &Path) -> Result<PathBuf> {
    let prefix = match layout {
        Layout::Checkout { home } => return Ok(home.join(".venv/bin/python")),
        Layout::Installed { prefix } => prefix,
    };
    let bin = prefix.join("bin");
    if let Some(python) = ["python3", "python"].iter().map(|n| bin.join(n)).find(|p| p.exists()) {
        return Ok(python);
    }
    let version = models.parent().and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or("python3");
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(version)).find(|p| p.exists()).with_context(|| {
        format!(
            "podctl is installed for {version} (in {}), which is not on PATH; set PODCTL_PYTHON",
            models.display()
        )
    })
}

fn reinstall_hint(layout: &Layout) -> String {
    match layout {
        Layout::Checkout { .. } => "run scripts/setup.sh (or set PODCTL_PYTHON)".to_string(),
        Layout::Installed { prefix } => format!(
            "the environment {} lost its Python: create it again and `pip install podctl-*.whl` into it \
             (or set PODCTL_PYTHON)",
            prefix.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch_dir(path: &Path) {
        std::fs::create_dir_all(path).unwrap();
    }

    #[test]
    fn an_environment_with_the_exporter_is_an_installation() {
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join("venv");
        touch_dir(&env.join("lib/python3.12/site-packages/podctl_models"));
        touch_dir(&env.join("bin"));
        let elsewhere = dir.path().join("work");
        touch_dir(&elsewhere);
        let layout = find_layout(None, Some(&env.join("bin/podctl")), Some(&elsewhere)).unwrap();
        assert_eq!(layout, Layout::Installed { prefix: env.clone() });
        assert_eq!(site_packages(&env), [env.join("lib/python3.12/site-packages")]);
    }

    #[test]
    fn a_checkout_is_found_above_the_binary_or_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("podctl");
        touch_dir(&home.join("models/podctl_models"));
        touch_dir(&home.join("target/debug"));
        let nowhere = dir.path().join("nowhere");
        touch_dir(&nowhere);
        let by_exe = find_layout(None, Some(&home.join("target/debug/podctl")), Some(&nowhere)).unwrap();
        assert_eq!(by_exe, Layout::Checkout { home: home.clone() });
        let by_cwd = find_layout(None, Some(&nowhere.join("podctl")), Some(&home.join("runs"))).unwrap();
        assert_eq!(by_cwd, Layout::Checkout { home });
        let error = find_layout(None, Some(&nowhere.join("podctl")), Some(&nowhere)).unwrap_err().to_string();
        assert!(error.contains("pip install podctl-") && error.contains("PODCTL_HOME"), "{error}");
    }

    #[test]
    fn podctl_home_names_the_checkout() {
        let layout = find_layout(Some("/src/podctl".into()), None, None).unwrap();
        assert_eq!(layout, Layout::Checkout { home: "/src/podctl".into() });
    }

    #[test]
    fn bundles_are_cached_in_the_users_cache_directory() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        assert_eq!(cache_dir(env(&[("PODCTL_CACHE", "/c"), ("HOME", "/h")])).unwrap(), Path::new("/c"));
        assert_eq!(cache_dir(env(&[])), None);
        if cfg!(target_os = "macos") {
            assert_eq!(cache_dir(env(&[("HOME", "/h")])).unwrap(), Path::new("/h/Library/Caches/podctl"));
        } else {
            let xdg = cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])).unwrap();
            assert_eq!(xdg, Path::new("/x/podctl"));
            let relative = cache_dir(env(&[("XDG_CACHE_HOME", "x"), ("HOME", "/h")])).unwrap();
            assert_eq!(relative, Path::new("/h/.cache/podctl"));
        }
    }

    #[test]
    fn site_packages_are_listed_newest_python_first() {
        let dir = tempfile::tempdir().unwrap();
        for version in ["python3.11", "python3.13", "python3.12", "python2.7", "python3.x"] {
            touch_dir(&dir.path().join("lib").join(version).join("site-packages"));
        }
        let names: Vec<String> = site_packages(dir.path())
            .iter()
            .map(|d| d.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["python3.13", "python3.12", "python3.11"]);
    }
}
