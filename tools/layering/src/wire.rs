//! The source check of the coordinator's core: below the services ([`CORE`]: the replicated
//! state, the decisions, the leader's memory, the shared context, the job operations) no gRPC or
//! protobuf type appears, so refusals stay typed there and become statuses only in `grpc`.
//!
//! Checked by what a path resolves to, not by the words in a file: every path of a core file
//! (types, expressions, patterns, `use` items) is resolved through the file's `use` items and
//! `self`/`super`, and through the names other modules of the crate give wire types (`use`
//! items and type aliases), so `use proto::v1::Directive;` then `Directive`, or a
//! `crate::leader::Wire` that aliases one, fails as `tonic::Status` does, and a word like
//! `tonic` in a comment or a name does not.

use crate::errors::{Source, collect_uses, is_test, line};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use syn::visit::Visit;

/// The crate checked and its modules below the services.
pub const CORE: [&str; 5] = [
    "crates/coordinator/src/state.rs",
    "crates/coordinator/src/decide.rs",
    "crates/coordinator/src/memory.rs",
    "crates/coordinator/src/ctx.rs",
    "crates/coordinator/src/jobs.rs",
];
/// The crate's source directory: the modules whose names are followed.
const CRATE_SRC: &str = "crates/coordinator/src";
/// Crates whose types are the wire's.
const WIRE_CRATES: [&str; 5] = ["proto", "tonic", "tonic_types", "prost", "prost_types"];
/// The crate's module of services.
const SERVICES: &str = "grpc";

/// `crates/coordinator/src/grpc/mod.rs` -> `crate::grpc`; `None` outside the library's tree.
fn module_of(path: &Path) -> Option<Vec<String>> {
    let rest = path.strip_prefix(CRATE_SRC).ok()?;
    if rest.starts_with("bin") {
        return None;
    }
    let mut module = vec!["crate".to_string()];
    let parts: Vec<String> = rest.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    for (i, part) in parts.iter().enumerate() {
        let name = part.strip_suffix(".rs").unwrap_or(part);
        if i + 1 == parts.len() && matches!(name, "mod" | "lib") {
            break;
        }
        module.push(name.to_string());
    }
    Some(module)
}

/// `segments` as a path from the crate root (or an external crate): a file's `use` names and
/// `self`/`super` replaced.
fn resolve(segments: &[String], module: &[String], uses: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut segments = segments.to_vec();
    if let Some(full) = uses.get(&segments[0])
        && full.first() != segments.first()
    {
        segments.splice(0..1, full.iter().cloned());
    }
    let mut base = module.to_vec();
    let mut at = 0;
    while segments.get(at).is_some_and(|s| s == "super") {
        base.pop();
        at += 1;
    }
    if at > 0 {
        return base.into_iter().chain(segments[at..].iter().cloned()).collect();
    }
    if segments[0] == "self" {
        return module.iter().cloned().chain(segments[1..].iter().cloned()).collect();
    }
    segments
}

/// Whether a resolved path is the wire's: a wire crate's, the services', or a name the crate
/// gives one.
fn is_wire(full: &[String], aliases: &BTreeSet<Vec<String>>) -> bool {
    let first = full.first().map(String::as_str).unwrap_or_default();
    WIRE_CRATES.contains(&first)
        || (first == "crate" && full.get(1).is_some_and(|s| s == SERVICES))
        || aliases.iter().any(|a| full.starts_with(a))
}

fn segments(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// Every path a type names.
struct Paths(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0.push(segments(path));
        syn::visit::visit_path(self, path);
    }
}

/// The names the crate's modules give wire types (`use` items and type aliases), as paths from
/// the crate root, followed to a fixed point (an alias of an alias).
fn aliases(files: &[(Vec<String>, &syn::File)]) -> BTreeSet<Vec<String>> {
    // Each name a module gives, and the paths it stands for.
    let mut names: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    for (module, file) in files {
        let mut uses = BTreeMap::new();
        collect_uses(&file.items, &mut uses);
        for (local, full) in &uses {
            let name = module.iter().cloned().chain([local.clone()]).collect();
            names.push((name, vec![resolve(full, module, &BTreeMap::new())]));
        }
        for item in &file.items {
            if let syn::Item::Type(t) = item {
                let mut paths = Paths(Vec::new());
                paths.visit_type(&t.ty);
                let targets = paths.0.iter().map(|p| resolve(p, module, &uses)).collect();
                names.push((module.iter().cloned().chain([t.ident.to_string()]).collect(), targets));
            }
        }
    }
    let mut wire = BTreeSet::new();
    loop {
        let before = wire.len();
        for (name, targets) in &names {
            if targets.iter().any(|t| is_wire(t, &wire)) {
                wire.insert(name.clone());
            }
        }
        if wire.len() == before {
            return wire;
        }
    }
}

/// Every place a core module names a wire type.
pub fn check(sources: &[Source]) -> Result<Vec<String>, String> {
    let mut parsed = Vec::new();
    for (path, text) in sources {
        if let Some(module) = module_of(path) {
            let file = syn::parse_file(text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
            parsed.push((path, module, file));
        }
    }
    let files: Vec<(Vec<String>, &syn::File)> = parsed.iter().map(|(_, m, f)| (m.clone(), f)).collect();
    let aliases = aliases(&files);
    let mut found = Vec::new();
    for core in CORE {
        let Some((path, module, file)) = parsed.iter().find(|(p, ..)| p.as_path() == Path::new(core)) else {
            found.push(format!("{core}: a module below the coordinator's services is missing; update tools/layering's wire::CORE"));
            continue;
        };
        let mut uses = BTreeMap::new();
        collect_uses(&file.items, &mut uses);
        let mut finder = Names { path, module, uses, aliases: &aliases, found: &mut found };
        finder.visit_file(file);
    }
    Ok(found)
}

struct Names<'a> {
    path: &'a Path,
    module: &'a [String],
    uses: BTreeMap<String, Vec<String>>,
    aliases: &'a BTreeSet<Vec<String>>,
    found: &'a mut Vec<String>,
}

impl Names<'_> {
    fn named(&mut self, segments: &[String], span: proc_macro2::Span) {
        // A lone name no `use` item gives is a local binding or this module's own item.
        if segments.len() == 1 && !self.uses.contains_key(&segments[0]) {
            return;
        }
        let full = resolve(segments, self.module, &self.uses);
        if is_wire(&full, self.aliases) {
            self.found.push(format!(
                "{}:{}: names the wire type `{}` below the coordinator's services; give this module a \
                 type of its own and convert in `grpc`",
                self.path.display(),
                line(span),
                full.join("::")
            ));
        }
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        fn walk(
            tree: &syn::UseTree,
            prefix: &mut Vec<String>,
            out: &mut Vec<(Vec<String>, proc_macro2::Span)>,
        ) {
            match tree {
                syn::UseTree::Path(p) => {
                    prefix.push(p.ident.to_string());
                    walk(&p.tree, prefix, out);
                    prefix.pop();
                }
                syn::UseTree::Name(n) => {
                    out.push((prefix.iter().cloned().chain([n.ident.to_string()]).collect(), n.ident.span()))
                }
                syn::UseTree::Rename(r) => {
                    out.push((prefix.iter().cloned().chain([r.ident.to_string()]).collect(), r.ident.span()))
                }
                syn::UseTree::Glob(g) => out.push((prefix.clone(), g.star_token.spans[0])),
                syn::UseTree::Group(g) => g.items.iter().for_each(|t| walk(t, prefix, out)),
            }
        }
        let mut imported = Vec::new();
        walk(&u.tree, &mut Vec::new(), &mut imported);
        for (segments, span) in imported {
            let full = resolve(&segments, self.module, &BTreeMap::new());
            self.named(&full, span);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let span = path.segments.first().map_or_else(proc_macro2::Span::call_site, |s| s.ident.span());
        self.named(&segments(path), span);
        syn::visit::visit_path(self, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn sources(files: &[(&str, &str)]) -> Vec<Source> {
        files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect()
    }

    /// The five core files, clean, plus `extra`.
    fn core_with(extra: &[(&str, &str)]) -> Vec<Source> {
        let mut files: Vec<(&str, &str)> = CORE.iter().map(|c| (*c, "")).collect();
        for (path, text) in extra {
            match files.iter_mut().find(|(p, _)| p == path) {
                Some(file) => file.1 = text,
                None => files.push((path, text)),
            }
        }
        sources(&files)
    }

    #[test]
    fn a_wire_type_imported_by_name_fails_the_check() {
        // memory.rs as it was: a `proto::v1::Directive` with no `tonic` anywhere.
        let memory =
            "use proto::v1::Directive;\npub struct SessionHandle { pub tx: mpsc::Sender<Directive> }";
        let found = check(&core_with(&[("crates/coordinator/src/memory.rs", memory)])).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with(
                "crates/coordinator/src/memory.rs:1: names the wire type `proto::v1::Directive`"
            )
        );
        assert!(
            found[1].starts_with(
                "crates/coordinator/src/memory.rs:2: names the wire type `proto::v1::Directive`"
            )
        );
    }

    #[test]
    fn wire_types_through_paths_aliases_and_the_services_fail_the_check() {
        let leader = "pub use proto::v1::Directive as Wire;\npub type Told = Option<Wire>;";
        let decide = "use crate::leader;\n\
                      fn a() -> tonic::Status { todo() }\n\
                      fn b(w: leader::Wire) {}\n\
                      fn c(t: crate::leader::Told) {}\n\
                      fn d(e: super::grpc::Refused) {}\n\
                      #[cfg(test)] mod tests { fn t(d: proto::v1::Directive) {} }";
        let found = check(&core_with(&[
            ("crates/coordinator/src/leader.rs", leader),
            ("crates/coordinator/src/decide.rs", decide),
        ]))
        .unwrap();
        let named: Vec<&str> = found.iter().map(|f| f.split(" below").next().unwrap()).collect();
        assert_eq!(
            named,
            [
                "crates/coordinator/src/decide.rs:2: names the wire type `tonic::Status`",
                "crates/coordinator/src/decide.rs:3: names the wire type `crate::leader::Wire`",
                "crates/coordinator/src/decide.rs:4: names the wire type `crate::leader::Told`",
                "crates/coordinator/src/decide.rs:5: names the wire type `crate::grpc::Refused`",
            ]
        );
    }

    #[test]
    fn a_word_is_not_a_type() {
        let ctx = "/// Not a tonic::Status: a refusal of its own.\npub struct NotServing { pub proto: String }\n\
                   fn tonic_free(proto: &str) -> bool { proto.is_empty() }";
        assert_eq!(
            check(&core_with(&[("crates/coordinator/src/ctx.rs", ctx)])).unwrap(),
            Vec::<String>::new()
        );
    }
}
