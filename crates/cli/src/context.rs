//! Saved contexts: named ways to reach a coordinator cluster (addresses, CA and token file, or a
//! kubeconfig context and namespace), kept in the user's config file so that `--coordinator`,
//! `--ca`, `--token-file` and `--kube-context` are given once: `podctl context add|use|list|rm`.
//!
//! The file is `$PODCTL_CONFIG`, else `$XDG_CONFIG_HOME/podctl/config.yaml`, else
//! `~/.config/podctl/config.yaml` (the XDG base directory rules: a relative `XDG_CONFIG_HOME`
//! is ignored). It holds paths, never a token itself.
//!
//! A command's flags win over environment variables, which win over the context, setting group
//! by setting group (the cluster, the TLS material, the token), so that a flag never mixes
//! with half of a context's group: `--insecure-plaintext` drops the context's CA, `--token-file`
//! its token file. Naming a cluster (`--coordinator`, `--kube-context` or their variables)
//! without `--context` leaves the saved contexts out altogether.

use crate::connect::ConnectArgs;
use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The config file's contents.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// The context commands use when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    /// Every saved context by name.
    #[serde(default)]
    pub contexts: BTreeMap<String, Saved>,
}

/// One saved context: a cluster and how to authenticate to it.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Saved {
    /// Coordinator addresses (host:port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coordinator: Vec<String>,
    /// A kubeconfig context whose podctl install is reached through the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_context: Option<String>,
    /// The install's namespace (default: the kubeconfig context's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_namespace: Option<String>,
    /// The CA that signed the coordinators' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// A client certificate, for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// Its private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// A directory with `ca.pem` (and `client.pem`, `client.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_dir: Option<PathBuf>,
    /// Plaintext (loopback clusters only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_plaintext: bool,
    /// The file holding the bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

impl Saved {
    /// `10.0.0.1:7001,...` or `kube:CONTEXT/NAMESPACE`.
    fn cluster(&self) -> String {
        match &self.kube_context {
            Some(context) => match &self.kube_namespace {
                Some(namespace) => format!("kube:{context}/{namespace}"),
                None => format!("kube:{context}"),
            },
            None => self.coordinator.join(","),
        }
    }

    /// How TLS is set up, in words.
    fn tls(&self) -> String {
        let path = |p: &Path| p.display().to_string();
        match (&self.tls_dir, &self.ca) {
            _ if self.insecure_plaintext => "plaintext".into(),
            (Some(dir), _) => format!("dir {}", path(dir)),
            (None, Some(ca)) if self.cert.is_some() => format!("ca {} + client cert", path(ca)),
            (None, Some(ca)) => format!("ca {}", path(ca)),
            (None, None) if self.kube_context.is_some() => "from the install".into(),
            (None, None) => "-".into(),
        }
    }
}

/// Where the config file is.
pub fn config_path() -> Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(path) = var("PODCTL_CONFIG") {
        return Ok(path);
    }
    let base = match (var("XDG_CONFIG_HOME").filter(|p| p.is_absolute()), var("HOME")) {
        (Some(dir), _) => dir,
        (None, Some(home)) => home.join(".config"),
        (None, None) => {
            bail!("neither XDG_CONFIG_HOME nor HOME is set; set PODCTL_CONFIG to the config file's path")
        }
    };
    Ok(base.join("podctl").join("config.yaml"))
}

impl Config {
    /// The config file's contents; empty when there is no file (or no home to find it in).
    pub fn load() -> Result<Self> {
        match config_path() {
            Ok(path) => Self::read(&path),
            Err(_) => Ok(Self::default()),
        }
    }

    /// The contents of `path`; empty when it does not exist.
    pub fn read(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e).with_context(|| format!("reading podctl's config {}", path.display())),
        };
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_saphyr::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "podctl's config {} is not valid: {e}\n(fix it by hand, or delete it and add the contexts again)",
                path.display()
            )
        })
    }

    /// Writes the file (and its directory), replacing it at once.
    pub fn write(&self, path: &Path) -> Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = serde_saphyr::to_string(self).context("writing podctl's config")?;
        let temporary = path.with_extension("yaml.tmp");
        std::fs::write(&temporary, text).with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))
    }

    /// The context `name`, or the current one when `name` is `None` (if any is set).
    fn pick(&self, name: Option<&str>) -> Result<Option<(String, &Saved)>> {
        let Some(name) = name.or(self.current_context.as_deref()) else { return Ok(None) };
        match self.contexts.get(name) {
            Some(saved) => Ok(Some((name.to_string(), saved))),
            None => bail!("no context named {name:?}: `podctl context list` shows the saved ones"),
        }
    }
}

impl ConnectArgs {
    /// These arguments with what they leave open taken from a saved context: the one
    /// `--context` (or `PODCTL_CONTEXT`) names, else the current one unless a cluster is named.
    pub fn with_saved(mut self, config: &Config) -> Result<Self> {
        let cluster_given = !self.coordinator.is_empty() || self.kube_context.is_some();
        if self.context.is_none() && cluster_given {
            return Ok(self);
        }
        let Some((name, saved)) = config.pick(self.context.as_deref())? else { return Ok(self) };
        if !cluster_given {
            self.coordinator = saved.coordinator.clone();
            self.kube_context = saved.kube_context.clone();
            self.kube_namespace = self.kube_namespace.take().or_else(|| saved.kube_namespace.clone());
        }
        let tls_given =
            self.insecure_plaintext || self.tls_dir.is_some() || self.ca.is_some() || self.cert.is_some();
        if !tls_given {
            self.ca = saved.ca.clone();
            self.cert = saved.cert.clone();
            self.key = saved.key.clone();
            self.tls_dir = saved.tls_dir.clone();
            self.insecure_plaintext = saved.insecure_plaintext;
        }
        if self.token.is_none() && self.token_file.is_none() {
            self.token_file = saved.token_file.clone();
        }
        self.context = Some(name);
        Ok(self)
    }
}

/// `podctl context`.
#[derive(Subcommand, Debug)]
pub enum ContextCommand {
    /// Save a context: a cluster (coordinator addresses or a kubeconfig context) and its TLS and
    /// token files. The first one saved becomes the current one.
    Add(AddArgs),
    /// Make a saved context the current one.
    Use {
        /// Its name.
        name: String,
    },
    /// The saved contexts; `*` marks the current one.
    #[command(alias = "ls")]
    List {
        /// JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Forget a saved context.
    Rm {
        /// Its name.
        name: String,
    },
}

/// `podctl context add`.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// The context's name.
    pub name: String,
    /// Coordinator addresses (host:port), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "kube_context",
        conflicts_with = "kube_context"
    )]
    pub coordinator: Vec<String>,
    /// A kubeconfig context whose podctl install to reach (`kubectl config get-contexts`).
    #[arg(long)]
    pub kube_context: Option<String>,
    /// The install's namespace (default: the kubeconfig context's).
    #[arg(long, requires = "kube_context")]
    pub kube_namespace: Option<String>,
    /// The CA that signed the coordinators' certificates (PEM).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM), for mutual TLS.
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// A directory with `ca.pem` and, for mutual TLS, `client.pem` and `client.key`.
    #[arg(long, conflicts_with_all = ["ca", "cert", "key"])]
    pub tls_dir: Option<PathBuf>,
    /// Plaintext: local clusters on loopback only.
    #[arg(long, conflicts_with_all = ["ca", "tls_dir"])]
    pub insecure_plaintext: bool,
    /// The file holding the bearer token (the token itself is never saved).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Replace a context of the same name.
    #[arg(long)]
    pub force: bool,
    /// Also make it the current context.
    #[arg(long = "use")]
    pub make_current: bool,
}

/// Runs `podctl context`.
pub fn run(command: ContextCommand) -> Result<()> {
    let path = config_path()?;
    let mut config = Config::read(&path)?;
    match command {
        ContextCommand::Add(args) => {
            let (name, force, make_current) = (args.name.clone(), args.force, args.make_current);
            let saved = saved_from(args)?;
            if config.contexts.contains_key(&name) && !force {
                bail!("a context named {name:?} exists; pass --force to replace it, or pick another name");
            }
            if saved.kube_context.is_none()
                && saved.tls_dir.is_none()
                && saved.ca.is_none()
                && !saved.insecure_plaintext
            {
                bail!(
                    "no TLS material: pass --ca (and --cert/--key) or --tls-dir, or --insecure-plaintext on loopback"
                );
            }
            let current = make_current || config.current_context.is_none();
            config.contexts.insert(name.clone(), saved);
            if current {
                config.current_context = Some(name.clone());
            }
            config.write(&path)?;
            let now = if current { " (the current context)" } else { "" };
            println!("saved context {name}{now} in {}", path.display());
        }
        ContextCommand::Use { name } => {
            if !config.contexts.contains_key(&name) {
                bail!("no context named {name:?}: `podctl context list` shows the saved ones");
            }
            config.current_context = Some(name.clone());
            config.write(&path)?;
            println!("current context: {name}");
        }
        ContextCommand::List { json } => print!("{}", list(&config, json)),
        ContextCommand::Rm { name } => {
            if config.contexts.remove(&name).is_none() {
                bail!("no context named {name:?}: `podctl context list` shows the saved ones");
            }
            if config.current_context.as_deref() == Some(&name) {
                config.current_context = None;
            }
            config.write(&path)?;
            println!("removed context {name}");
        }
    }
    Ok(())
}

/// A context from `add`'s arguments, its files checked and their paths made absolute (a
/// context is used from any directory).
fn saved_from(args: AddArgs) -> Result<Saved> {
    let file = |flag: &str, path: Option<PathBuf>| -> Result<Option<PathBuf>> {
        let Some(path) = path else { return Ok(None) };
        let absolute = std::path::absolute(&path).with_context(|| format!("--{flag} {}", path.display()))?;
        if !absolute.exists() {
            bail!("--{flag} {}: no such file or directory", path.display());
        }
        Ok(Some(absolute))
    };
    Ok(Saved {
        coordinator: args.coordinator,
        kube_context: args.kube_context,
        kube_namespace: args.kube_namespace,
        ca: file("ca", args.ca)?,
        cert: file("cert", args.cert)?,
        key: file("key", args.key)?,
        tls_dir: file("tls-dir", args.tls_dir)?,
        insecure_plaintext: args.insecure_plaintext,
        token_file: file("token-file", args.token_file)?,
    })
}

/// `podctl context list` as printed.
fn list(config: &Config, json: bool) -> String {
    if json {
        let contexts: Vec<serde_json::Value> = config
            .contexts
            .iter()
            .map(|(name, saved)| {
                let mut v = serde_json::to_value(saved).unwrap_or_default();
                v["name"] = name.clone().into();
                v["current"] = (config.current_context.as_deref() == Some(name)).into();
                v
            })
            .collect();
        return serde_json::json!({ "current": config.current_context, "contexts": contexts }).to_string()
            + "\n";
    }
    if config.contexts.is_empty() {
        return "no contexts: `podctl context add NAME --coordinator HOST:PORT ...` saves one\n".into();
    }
    let mut rows = vec![["CURRENT", "NAME", "CLUSTER", "TLS", "TOKEN FILE"].map(String::from).to_vec()];
    for (name, saved) in &config.contexts {
        let current = if config.current_context.as_deref() == Some(name) { "*" } else { "" };
        let token = saved.token_file.as_deref().map_or("-".into(), |p| p.display().to_string());
        rows.push(vec![current.into(), name.clone(), saved.cluster(), saved.tls(), token]);
    }
    crate::status::table(&rows).join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> ConnectArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            connect: ConnectArgs,
        }
        Cli::try_parse_from(std::iter::once("podctl").chain(argv.iter().copied())).unwrap().connect
    }

    fn config() -> Config {
        let prod = Saved {
            coordinator: vec!["10.0.0.1:7001".into(), "10.0.0.2:7001".into()],
            ca: Some("/etc/podctl/ca.pem".into()),
            token_file: Some("/home/me/.podctl-token".into()),
            ..Default::default()
        };
        let gke = Saved {
            kube_context: Some("gke_p_z_c".into()),
            kube_namespace: Some("train".into()),
            ..Default::default()
        };
        Config {
            current_context: Some("prod".into()),
            contexts: [("prod".to_string(), prod), ("gke".to_string(), gke)].into(),
        }
    }

    #[test]
    fn the_current_context_fills_what_the_command_leaves_open() {
        let resolved = args(&[]).with_saved(&config()).unwrap();
        assert_eq!(resolved.coordinator, ["10.0.0.1:7001", "10.0.0.2:7001"]);
        assert_eq!(resolved.ca.as_deref(), Some(Path::new("/etc/podctl/ca.pem")));
        assert_eq!(resolved.token_file.as_deref(), Some(Path::new("/home/me/.podctl-token")));
        assert_eq!(resolved.context.as_deref(), Some("prod"));
        assert!(resolved.is_remote());
        // No current context and nothing named: local mode.
        let none = Config { current_context: None, ..config() };
        assert!(!args(&[]).with_saved(&none).unwrap().is_remote());
    }

    #[test]
    fn flags_win_group_by_group() {
        // A token flag replaces the context's token file, nothing else.
        let resolved = args(&["--token-file", "/tmp/other"]).with_saved(&config()).unwrap();
        assert_eq!(resolved.token_file.as_deref(), Some(Path::new("/tmp/other")));
        assert_eq!(resolved.ca.as_deref(), Some(Path::new("/etc/podctl/ca.pem")));
        // Plaintext drops the context's CA instead of conflicting with it.
        let resolved = args(&["--insecure-plaintext"]).with_saved(&config()).unwrap();
        assert!(resolved.insecure_plaintext && resolved.ca.is_none());
        // A cluster named without --context leaves the saved contexts out.
        let resolved = args(&["--coordinator", "127.0.0.1:1"]).with_saved(&config()).unwrap();
        assert_eq!(resolved.coordinator, ["127.0.0.1:1"]);
        assert_eq!((resolved.ca, resolved.token_file, resolved.context), (None, None, None));
        // ... and with --context, it overrides the context's cluster only.
        let resolved =
            args(&["--coordinator", "127.0.0.1:1", "--context", "prod"]).with_saved(&config()).unwrap();
        assert_eq!(resolved.coordinator, ["127.0.0.1:1"]);
        assert!(resolved.ca.is_some() && resolved.token_file.is_some());
    }

    #[test]
    fn a_named_context_replaces_the_current_one_and_a_wrong_name_is_an_error() {
        let resolved = args(&["--context", "gke"]).with_saved(&config()).unwrap();
        assert_eq!(resolved.kube_context.as_deref(), Some("gke_p_z_c"));
        assert_eq!(resolved.kube_namespace.as_deref(), Some("train"));
        assert!(resolved.coordinator.is_empty() && resolved.ca.is_none());
        let error = args(&["--context", "nope"]).with_saved(&config()).unwrap_err().to_string();
        assert!(
            error.contains("no context named \"nope\"") && error.contains("podctl context list"),
            "{error}"
        );
    }

    #[test]
    fn the_file_round_trips_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("podctl/config.yaml");
        assert_eq!(Config::read(&path).unwrap(), Config::default());
        config().write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("current-context: prod") && text.contains("token-file:"), "{text}");
        assert_eq!(Config::read(&path).unwrap(), config());
        let table = list(&config(), false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "CURRENT  NAME  CLUSTER                      TLS                    TOKEN FILE");
        assert_eq!(lines[1], "         gke   kube:gke_p_z_c/train         from the install       -");
        assert_eq!(
            lines[2],
            "*        prod  10.0.0.1:7001,10.0.0.2:7001  ca /etc/podctl/ca.pem  /home/me/.podctl-token"
        );
        let json: serde_json::Value = serde_json::from_str(&list(&config(), true)).unwrap();
        assert_eq!(json["current"], "prod");
        assert_eq!(json["contexts"][1]["current"], true);
        std::fs::write(&path, "contexts: { a: { coordinatr: [x] } }\n").unwrap();
        let error = Config::read(&path).unwrap_err().to_string();
        assert!(error.contains("coordinatr"), "{error}");
    }
}
