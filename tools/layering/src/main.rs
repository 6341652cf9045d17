//! `podctl-layering`: checks the workspace against the `layering` block of
//! docs/ARCHITECTURE.md, so that the document's invariants stay true (`.ci/run` runs it first).
//!
//! From `cargo metadata` (what each workspace crate declares in its `Cargo.toml`, and the whole
//! resolved dependency graph, every feature on):
//! - every workspace crate is listed in the block, once, and nothing else is;
//! - a crate's normal and build dependencies on workspace crates are exactly the ones the block
//!   lists for it, and those come earlier in the block (the block is the dependency order);
//! - a dev-dependency (tests, benchmarks) may use any crate listed earlier than its own, which
//!   keeps the graph free of cycles;
//! - `never crate: deps` names dependencies (workspace or external) a crate must not have, of
//!   any kind, dev-dependencies included; `only package: crates` names the only crates that may
//!   depend on an external package (openraft, clap, ...);
//! - `reach package: crates` names the only crates that may reach a package (workspace or
//!   external) at all: directly, or through any chain of dependencies in the resolved graph
//!   (a crate's own dev-dependencies included, as `cargo tree -p crate` shows them), so that
//!   the coordinator cannot link PJRT through job -> planner -> pjrt;
//! - every library and binary target of every crate but the `unsafe` exceptions starts with
//!   `#![forbid(unsafe_code)]`. Tests, benchmarks and examples are not checked: they may measure
//!   with `unsafe` (a counting allocator, `posix_fadvise`).
//!
//! Crates are named without the `podctl-` prefix of their package (`podctl-worker` is `worker`).
//!
//! Then the source checks: no product code decides on an error's text ([`errors`]), and no
//! gRPC type appears below the coordinator's services ([`wire`]).
#![forbid(unsafe_code)]

mod errors;
mod wire;

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The document that holds the block, from the workspace root.
const DOC: &str = "docs/ARCHITECTURE.md";
/// The attribute every checked crate root carries.
const FORBID: &str = "#![forbid(unsafe_code)]";

#[derive(Debug, Clone, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    workspace_root: PathBuf,
    /// The resolved graph: every package, external ones included, with its dependencies.
    resolve: Resolve,
}

#[derive(Debug, Clone, Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
}

#[derive(Debug, Clone, Deserialize)]
struct NodeDep {
    /// The id of the package depended on.
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Debug, Clone, Deserialize)]
struct DepKind {
    /// `None` for a normal dependency, else `dev` or `build`.
    kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Package {
    id: String,
    name: String,
    dependencies: Vec<Dependency>,
    targets: Vec<Target>,
}

#[derive(Debug, Clone, Deserialize)]
struct Dependency {
    /// The package depended on.
    name: String,
    /// `None` for a normal dependency, else `dev` or `build`.
    kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Target {
    kind: Vec<String>,
    src_path: PathBuf,
}

/// What the block says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Rules {
    /// Crates in dependency order, each with the crates it may depend on.
    order: Vec<(String, BTreeSet<String>)>,
    /// Dependencies (workspace or external) a crate must not have, of any kind.
    never: BTreeMap<String, BTreeSet<String>>,
    /// External packages only these crates may depend on.
    only: BTreeMap<String, BTreeSet<String>>,
    /// Packages (workspace or external) only these crates may reach, through any chain.
    reach: BTreeMap<String, BTreeSet<String>>,
    /// Crates that may hold `unsafe` code.
    unsafe_allowed: BTreeSet<String>,
}

/// A crate's name in the block: its package name without `podctl-`.
fn short(package: &str) -> &str {
    package.strip_prefix("podctl-").unwrap_or(package)
}

/// The block's rules. Its lines: `crate: deps...` (in dependency order), `never crate: deps...`,
/// `only package: crates...`, `reach package: crates...`, `unsafe crate`, `# comments`.
fn parse(doc: &str) -> Result<Rules, String> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "```layering");
    if lines.next().is_none() {
        return Err(format!("{DOC} has no ```layering block"));
    }
    let mut rules = Rules::default();
    let mut closed = false;
    for line in lines {
        let line = line.trim();
        if line == "```" {
            closed = true;
            break;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix("unsafe ") {
            rules.unsafe_allowed.insert(name.trim().to_string());
            continue;
        }
        let (head, deps) =
            line.split_once(':').ok_or_else(|| format!("{DOC}: `{line}` is not `crate: deps`"))?;
        let deps: BTreeSet<String> = deps.split_whitespace().map(str::to_string).collect();
        if let Some(name) = head.strip_prefix("never ") {
            rules.never.entry(name.trim().to_string()).or_default().extend(deps);
        } else if let Some(package) = head.strip_prefix("only ") {
            rules.only.entry(package.trim().to_string()).or_default().extend(deps);
        } else if let Some(package) = head.strip_prefix("reach ") {
            rules.reach.entry(package.trim().to_string()).or_default().extend(deps);
        } else {
            rules.order.push((head.trim().to_string(), deps));
        }
    }
    if !closed {
        return Err(format!("{DOC}: the ```layering block is not closed"));
    }
    Ok(rules)
}

/// Every way the workspace breaks the rules; `source` reads a crate root.
fn check(metadata: &Metadata, rules: &Rules, source: impl Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut found = Vec::new();
    let members: BTreeSet<&str> = metadata.workspace_members.iter().map(String::as_str).collect();
    let packages: Vec<&Package> =
        metadata.packages.iter().filter(|p| members.contains(p.id.as_str())).collect();
    let names: BTreeSet<&str> = packages.iter().map(|p| short(&p.name)).collect();
    let position: BTreeMap<&str, usize> =
        rules.order.iter().enumerate().map(|(i, (name, _))| (name.as_str(), i)).collect();
    let fix = format!("fix the dependency, or change the layering block of {DOC} and say why there");

    for (i, (name, allowed)) in rules.order.iter().enumerate() {
        if !names.contains(name.as_str()) {
            found.push(format!("{DOC} lists `{name}`, which is not a workspace crate"));
        }
        if position[name.as_str()] != i {
            found.push(format!("{DOC} lists `{name}` twice"));
        }
        for dep in allowed.iter().filter(|d| position.get(d.as_str()).is_none_or(|&j| j >= i)) {
            found.push(format!("{DOC}: `{name}: {dep}` points up: list `{dep}` before `{name}`"));
        }
    }
    for package in packages {
        let name = short(&package.name);
        let Some(&at) = position.get(name) else {
            found.push(format!(
                "crate `{name}` is not in the layering block of {DOC}: add it where it belongs"
            ));
            continue;
        };
        let allowed = &rules.order[at].1;
        let never = rules.never.get(name);
        let mut declared = BTreeSet::new();
        for dep in &package.dependencies {
            let target = short(&dep.name);
            let kind = dep.kind.as_deref().unwrap_or("normal");
            if never.is_some_and(|n| n.contains(target)) {
                found.push(format!(
                    "`{name}` has a {kind} dependency on `{target}`, which it must never have"
                ));
                continue;
            }
            if let Some(users) = rules.only.get(&dep.name)
                && !users.contains(name)
            {
                let users = users.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
                found.push(format!("`{name}` depends on `{}`, which only {users} may", dep.name));
            }
            if !names.contains(target) {
                continue;
            }
            if kind == "dev" {
                if position.get(target).is_none_or(|&j| j >= at) {
                    found.push(format!(
                        "`{name}` has a dev-dependency on `{target}`, which is not below it: {fix}"
                    ));
                }
            } else if !allowed.contains(target) {
                found.push(format!(
                    "`{name}` has a {kind} dependency on `{target}`, which is not allowed: {fix}"
                ));
            } else {
                declared.insert(target);
            }
        }
        for stale in allowed.iter().filter(|d| !declared.contains(d.as_str())) {
            found
                .push(format!("{DOC} allows `{name}: {stale}`, but `{name}` does not depend on it: drop it"));
        }
        if rules.unsafe_allowed.contains(name) {
            continue;
        }
        for target in
            package.targets.iter().filter(|t| t.kind.iter().any(|k| matches!(k.as_str(), "lib" | "bin")))
        {
            let forbids =
                source(&target.src_path).is_some_and(|text| text.lines().any(|l| l.trim() == FORBID));
            if !forbids {
                let path = target.src_path.strip_prefix(&metadata.workspace_root).unwrap_or(&target.src_path);
                found.push(format!(
                    "{} lacks `{FORBID}` (crate `{name}` is not an unsafe exception)",
                    path.display()
                ));
            }
        }
    }
    for name in rules.never.keys().chain(rules.only.values().flatten()).chain(rules.reach.values().flatten())
    {
        if !position.contains_key(name.as_str()) {
            found.push(format!(
                "{DOC}: `{name}` in a `never`, `only` or `reach` line is not a crate the block lists"
            ));
        }
    }
    found.extend(check_reach(metadata, rules));
    found
}

/// The `reach` lines over the resolved graph: for every workspace crate, every package it
/// reaches (its own dependencies of any kind, then theirs that are built with it: normal and
/// build), with the chain that reaches it.
fn check_reach(metadata: &Metadata, rules: &Rules) -> Vec<String> {
    let name_of: BTreeMap<&str, &str> =
        metadata.packages.iter().map(|p| (p.id.as_str(), short(&p.name))).collect();
    let nodes: BTreeMap<&str, &Node> = metadata.resolve.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let built = |dep: &NodeDep| dep.dep_kinds.iter().any(|k| k.kind.as_deref() != Some("dev"));
    let mut found = Vec::new();
    for member in &metadata.workspace_members {
        let Some(&crate_name) = name_of.get(member.as_str()) else { continue };
        // Breadth first, so each chain printed is a shortest one.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([member.as_str()]);
        while let Some(id) = queue.pop_front() {
            let Some(node) = nodes.get(id) else { continue };
            for dep in node.deps.iter().filter(|d| id == member || built(d)) {
                if dep.pkg != *member && !parent.contains_key(dep.pkg.as_str()) {
                    parent.insert(&dep.pkg, id);
                    queue.push_back(&dep.pkg);
                }
            }
        }
        for &id in parent.keys() {
            let Some(&target) = name_of.get(id) else { continue };
            let Some(allowed) = rules.reach.get(target) else { continue };
            if allowed.contains(crate_name) {
                continue;
            }
            let mut chain = vec![target];
            let mut at = id;
            while let Some(&up) = parent.get(at) {
                chain.push(name_of.get(up).copied().unwrap_or(up));
                at = up;
            }
            chain.reverse();
            let users = allowed.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
            found.push(format!(
                "`{crate_name}` reaches `{target}` ({}), which only {users} may: cut the chain, or \
                 change the layering block of {DOC} and say why there",
                chain.join(" -> ")
            ));
        }
    }
    found
}

fn metadata() -> Result<Metadata, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--all-features", "--locked"])
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("reading cargo metadata: {e}"))
}

/// Where the source checks look, from the workspace root.
const SOURCE_DIRS: [&str; 3] = ["crates", "tests", "tools"];

fn run() -> Result<Vec<String>, String> {
    let metadata = metadata()?;
    let doc_path = metadata.workspace_root.join(DOC);
    let doc =
        std::fs::read_to_string(&doc_path).map_err(|e| format!("reading {}: {e}", doc_path.display()))?;
    let rules = parse(&doc)?;
    let mut found = check(&metadata, &rules, |path| std::fs::read_to_string(path).ok());
    let sources = errors::product_sources(&metadata.workspace_root, &SOURCE_DIRS)?;
    let (text_variants, decisions) = errors::check(&sources)?;
    println!(
        "errors: {} error variant(s) carry only text; no product code may decide on them:",
        text_variants.len()
    );
    for v in &text_variants {
        println!("  {}::{}::{} ({})", v.krate, v.owner, v.variant, v.at);
    }
    found.extend(decisions);
    found.extend(wire::check(&sources)?);
    Ok(found)
}

fn main() -> ExitCode {
    match run() {
        Ok(found) if found.is_empty() => {
            println!(
                "layering: every crate edge and crate root agrees with {DOC}, and no code decides on an error's text"
            );
            ExitCode::SUCCESS
        }
        Ok(found) => {
            for problem in &found {
                eprintln!("layering: {problem}");
            }
            eprintln!("layering: {} problem(s)", found.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("layering: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real workspace and its document, as CI sees them.
    fn workspace() -> (Metadata, Rules) {
        let metadata = metadata().unwrap();
        let doc = std::fs::read_to_string(metadata.workspace_root.join(DOC)).unwrap();
        (metadata, parse(&doc).unwrap())
    }

    fn package<'a>(metadata: &'a mut Metadata, name: &str) -> &'a mut Package {
        metadata.packages.iter_mut().find(|p| p.name == name).unwrap()
    }

    fn read(path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    #[test]
    fn the_workspace_keeps_its_layering() {
        let (metadata, rules) = workspace();
        assert_eq!(check(&metadata, &rules, read), Vec::<String>::new());
    }

    #[test]
    fn no_product_code_decides_on_an_error_s_text() {
        let (metadata, _) = workspace();
        let sources = errors::product_sources(&metadata.workspace_root, &SOURCE_DIRS).unwrap();
        assert!(sources.iter().any(|(p, _)| p.ends_with("crates/worker/src/lib.rs")));
        assert!(
            !sources
                .iter()
                .any(|(p, _)| p.components().any(|c| c.as_os_str() == "tests") && p.starts_with("crates"))
        );
        let (_, decisions) = errors::check(&sources).unwrap();
        assert_eq!(decisions, Vec::<String>::new());
    }

    #[test]
    fn no_grpc_type_appears_below_the_coordinator_s_services() {
        let (metadata, _) = workspace();
        let sources = errors::product_sources(&metadata.workspace_root, &SOURCE_DIRS).unwrap();
        assert_eq!(wire::check(&sources).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_forbidden_edge_fails_the_check() {
        let (mut metadata, rules) = workspace();
        // An edge the block does not list: the checkpoint crate writing the run record.
        let checkpoint = package(&mut metadata, "podctl-checkpoint");
        checkpoint.dependencies.push(Dependency { name: "podctl-record".into(), kind: None });
        let found = check(&metadata, &rules, read);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("`checkpoint` has a normal dependency on `record`, which is not allowed"),
            "{found:?}"
        );
        // The worker reaching into the coordinator again, as it did for its client.
        let (mut metadata, _) = workspace();
        let worker = package(&mut metadata, "podctl-worker");
        worker
            .dependencies
            .push(Dependency { name: "podctl-coordinator".into(), kind: Some("build".into()) });
        let found = check(&metadata, &rules, read);
        assert_eq!(found, ["`worker` has a build dependency on `coordinator`, which it must never have"]);
    }

    #[test]
    fn protobuf_never_reaches_the_cli_not_even_in_its_tests() {
        let (mut metadata, rules) = workspace();
        let cli = package(&mut metadata, "podctl-cli");
        cli.dependencies.push(Dependency { name: "podctl-proto".into(), kind: Some("dev".into()) });
        let found = check(&metadata, &rules, read);
        assert_eq!(found, ["`cli` has a dev dependency on `proto`, which it must never have"]);
    }

    #[test]
    fn openraft_stays_in_the_coordinator() {
        let (mut metadata, rules) = workspace();
        let worker = package(&mut metadata, "podctl-worker");
        worker.dependencies.push(Dependency { name: "openraft".into(), kind: None });
        let found = check(&metadata, &rules, read);
        assert_eq!(found, ["`worker` depends on `openraft`, which only coordinator may"]);
    }

    #[test]
    fn a_dev_dependency_that_points_up_is_a_cycle() {
        let (mut metadata, rules) = workspace();
        let mesh = package(&mut metadata, "podctl-mesh");
        mesh.dependencies.push(Dependency { name: "podctl-worker".into(), kind: Some("dev".into()) });
        let found = check(&metadata, &rules, read);
        assert!(
            found.len() == 1 && found[0].contains("dev-dependency on `worker`, which is not below it"),
            "{found:?}"
        );
    }

    #[test]
    fn an_edge_the_document_allows_but_the_code_lacks_is_stale() {
        let (mut metadata, rules) = workspace();
        let record = package(&mut metadata, "podctl-coordinator");
        record.dependencies.retain(|d| d.name != "podctl-record");
        let found = check(&metadata, &rules, read);
        assert!(found.len() == 1 && found[0].contains("allows `coordinator: record`"), "{found:?}");
    }

    /// Adds to the resolved graph an edge `from -> to` of `kind` (`None`: normal).
    fn resolve_edge(metadata: &mut Metadata, from: &str, to: &str, kind: Option<&str>) {
        let id = |name: &str| metadata.packages.iter().find(|p| p.name == name).unwrap().id.clone();
        let (from, to) = (id(from), id(to));
        let node = metadata.resolve.nodes.iter_mut().find(|n| n.id == from).unwrap();
        node.deps.push(NodeDep { pkg: to, dep_kinds: vec![DepKind { kind: kind.map(str::to_string) }] });
    }

    #[test]
    fn the_coordinator_reaching_pjrt_through_another_crate_fails_the_check() {
        let (metadata, rules) = workspace();
        assert!(rules.reach["pjrt"].contains("worker") && !rules.reach["pjrt"].contains("coordinator"));
        // The planner compiling again, as before exact mode had a crate of its own: the job
        // spec, and through it the coordinator, would link PJRT without naming it.
        let mut broken = metadata.clone();
        resolve_edge(&mut broken, "podctl-planner", "podctl-pjrt", None);
        let found = check(&broken, &rules, read);
        let mut reached: Vec<&str> = found.iter().filter_map(|f| f.split(" (").next()).collect();
        reached.sort();
        assert_eq!(
            reached,
            [
                "`coordinator` reaches `pjrt`",
                "`job` reaches `pjrt`",
                "`planner` reaches `pjrt`",
                "`rewards` reaches `pjrt`"
            ],
            "{found:?}"
        );
        assert!(
            found.iter().any(|f| f.starts_with(
                "`coordinator` reaches `pjrt` (coordinator -> job -> planner -> pjrt), which only chaos, \
                 cli, planner-exact, podctl, worker may"
            )),
            "{found:?}"
        );
        // A crate's own tests count (`cargo tree -p coordinator` shows them) ...
        let mut tested = metadata.clone();
        resolve_edge(&mut tested, "podctl-coordinator", "podctl-planner-exact", Some("dev"));
        let found = check(&tested, &rules, read);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("(coordinator -> planner-exact -> pjrt)"), "{found:?}");
        // ... a dependency's tests are not built with it.
        let mut theirs = metadata;
        resolve_edge(&mut theirs, "podctl-planner", "podctl-pjrt", Some("dev"));
        let found = check(&theirs, &rules, read);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("`planner` reaches `pjrt` (planner -> pjrt)"), "{found:?}");
    }

    #[test]
    fn an_external_package_reached_through_the_graph_fails_the_check() {
        let (mut metadata, rules) = workspace();
        // The cli embedding a coordinator itself would bring openraft into its every build.
        resolve_edge(&mut metadata, "podctl-cli", "podctl-coordinator", None);
        let found = check(&metadata, &rules, read);
        assert!(
            found.iter().any(|f| f.starts_with("`cli` reaches `openraft` (cli -> coordinator -> openraft)")),
            "{found:?}"
        );
        assert!(found.iter().any(|f| f.starts_with("`cli` reaches `redb` (cli -> coordinator -> redb)")));
    }

    #[test]
    fn a_crate_root_without_forbid_unsafe_fails_unless_excepted() {
        let (metadata, rules) = workspace();
        let unforbidden = |path: &Path| read(path).map(|text| text.replace(FORBID, ""));
        let found = check(&metadata, &rules, unforbidden);
        assert!(found.iter().any(|f| f.starts_with("crates/worker/src/lib.rs lacks")), "{found:?}");
        assert!(found.iter().any(|f| f.starts_with("crates/podctl/src/main.rs lacks")), "{found:?}");
        assert!(!found.iter().any(|f| f.contains("crates/pjrt/")), "{found:?}");
    }

    #[test]
    fn the_block_parses_order_never_and_exceptions() {
        let doc = "text\n```layering\n# comment\nmesh:\npjrt: mesh\nnever cli: proto\nonly clap: cli\nreach pjrt: cli\nunsafe pjrt\n```\nmore";
        let rules = parse(doc).unwrap();
        assert_eq!(rules.order.len(), 2);
        assert_eq!(rules.order[1], ("pjrt".into(), BTreeSet::from(["mesh".to_string()])));
        assert!(rules.never["cli"].contains("proto"));
        assert!(rules.only["clap"].contains("cli"));
        assert!(rules.reach["pjrt"].contains("cli"));
        assert!(rules.unsafe_allowed.contains("pjrt"));
        assert!(parse("no block").unwrap_err().contains("no ```layering block"));
        assert!(parse("```layering\nmesh:\n").unwrap_err().contains("not closed"));
        assert!(parse("```layering\nmesh\n```").unwrap_err().contains("`mesh` is not `crate: deps`"));
    }
}
