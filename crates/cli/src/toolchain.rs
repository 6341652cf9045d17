//! Where podctl finds what it runs: the project's Python environment (the exporter and the PJRT
//! plugins it installed), and the cache of exported bundles.
//!
//! Each can be set explicitly (`PODCTL_HOME`, `PODCTL_PYTHON`, `PODCTL_PJRT_PLUGIN`,
//! `PODCTL_CACHE`); otherwise podctl looks for the project that `scripts/setup.sh` prepared,
//! upwards from the binary and from the working directory.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The tools of one podctl installation.
pub struct Toolchain {
    /// The project directory (holds `models/` and `.venv/`).
    pub home: PathBuf,
    /// The Python that has JAX and `podctl_models`.
    pub python: PathBuf,
    /// Exported bundles, by content key.
    pub cache: PathBuf,
}

impl Toolchain {
    pub fn discover() -> Result<Self> {
        let home = match std::env::var_os("PODCTL_HOME") {
            Some(home) => PathBuf::from(home),
            None => find_home().context(
                "cannot find the podctl project (a directory with models/podctl_models); \
                 run podctl from the project or set PODCTL_HOME",
            )?,
        };
        let python = std::env::var_os("PODCTL_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".venv/bin/python"));
        if !python.exists() {
            bail!(
                "the Python environment {} is missing; run scripts/setup.sh (or set PODCTL_PYTHON)",
                python.display()
            );
        }
        let cache =
            std::env::var_os("PODCTL_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join(".cache/podctl"));
        Ok(Self { home, python, cache })
    }

    /// The exporter's Python sources, which key the bundle cache.
    pub fn models_dir(&self) -> PathBuf {
        self.home.join("models")
    }

    /// The PJRT plugin: the job's choice, else `PODCTL_PJRT_PLUGIN`, else the CPU plugin in the
    /// project's Python environment.
    pub fn plugin(&self, from_job: Option<&Path>) -> Result<PathBuf> {
        if let Some(path) = from_job {
            return Ok(path.to_path_buf());
        }
        if let Some(path) = std::env::var_os("PODCTL_PJRT_PLUGIN") {
            return Ok(PathBuf::from(path));
        }
        let lib = self.home.join(".venv/lib");
        let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"))
                .find(|p| p.exists())
        });
        found.with_context(|| {
            format!(
                "no CPU PJRT plugin under {}; run scripts/setup.sh, or set runtime.plugin in the job \
                 or PODCTL_PJRT_PLUGIN",
                lib.display()
            )
        })
    }
}

fn find_home() -> Option<PathBuf> {
    let is_home = |dir: &Path| dir.join("models/podctl_models").is_dir();
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    [exe, cwd]
        .into_iter()
        .flatten()
        .find_map(|start| start.ancestors().find(|d| is_home(d)).map(Path::to_path_buf))
}
