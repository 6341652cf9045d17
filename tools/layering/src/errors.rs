//! The source check of failures as types: no code decides on an error's text.
//!
//! An error variant that carries nothing but one string (`Mismatch(String)`, `Spawn { detail:
//! String }`) says what happened only in words, so a caller that matches it decides on words:
//! the variant may hold anything its constructors put in it. This check lists every such
//! variant of the workspace's error types (an enum or struct that derives `Error` or whose name
//! ends in `Error`; a `&'static str` is a constant of the code, not a payload) and fails where
//! product code names one in a pattern (`match`, `if let`, `matches!`), resolving the pattern's
//! path through the file's `use` items, or tests an error's text (`status.message()`, or
//! `e.to_string()` of a binding named like an error, followed by `contains`, `starts_with`,
//! `ends_with` or `==`). Tests, benchmarks and examples may: they check what people read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A variant (or tuple struct) of an error type whose only payload is a string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TextVariant {
    /// The crate that declares it, as code names it (`worker`, `metrics_http`).
    pub krate: String,
    /// The error type.
    pub owner: String,
    /// The variant; the type's own name for a struct.
    pub variant: String,
    /// Where it is declared, relative to the workspace root, and the line.
    pub at: String,
}

/// A source file: its path relative to the workspace root, and its text.
pub type Source = (PathBuf, String);

/// Every `.rs` file of product code under `dirs` (relative to `root`): `tests/`, `benches/`,
/// `examples/` and `target/` directories are skipped.
pub fn product_sources(root: &Path, dirs: &[&str]) -> Result<Vec<Source>, String> {
    let mut found = Vec::new();
    let mut pending: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if path.is_dir() {
                if !matches!(name, "tests" | "benches" | "examples" | "target" | "fuzz") {
                    pending.push(path);
                }
            } else if name.ends_with(".rs") {
                let text =
                    std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                found.push((path.strip_prefix(root).unwrap_or(&path).to_path_buf(), text));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The string-only variants of every error type in `sources`, and every place product code
/// decides on one or on an error's message.
pub fn check(sources: &[Source]) -> Result<(Vec<TextVariant>, Vec<String>), String> {
    let mut files = Vec::new();
    for (path, text) in sources {
        let file = syn::parse_file(text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
        files.push((path, file));
    }
    let mut variants = Vec::new();
    for (path, file) in &files {
        let mut finder = Declarations { path, krate: krate_of(path), found: &mut variants };
        finder.visit_file(file);
    }
    variants.sort();
    let mut decisions = Vec::new();
    for (path, file) in &files {
        let mut uses = BTreeMap::new();
        collect_uses(&file.items, &mut uses);
        let mut finder = Decisions {
            path,
            krate: krate_of(path),
            variants: &variants,
            uses,
            self_type: None,
            found: &mut decisions,
        };
        finder.visit_file(file);
    }
    Ok((variants, decisions))
}

/// The crate a file belongs to, as code names it: `crates/<name>/...`, `tests/<name>/...`,
/// `tools/<name>/...`, with `-` as `_`.
fn krate_of(path: &Path) -> String {
    let mut parts = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let _top = parts.next();
    parts.next().unwrap_or_default().replace('-', "_")
}

/// The paths a file's `use` items give names to (every module of the file alike): `Refused` ->
/// `client::ClientError::Refused`, `ClientError` -> `client::ClientError`.
pub(crate) fn collect_uses(items: &[syn::Item], uses: &mut BTreeMap<String, Vec<String>>) {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, uses: &mut BTreeMap<String, Vec<String>>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, uses);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let full = match name.as_str() {
                    "self" => prefix.clone(),
                    _ => prefix.iter().cloned().chain([name.clone()]).collect(),
                };
                let local = if name == "self" { prefix.last().cloned().unwrap_or_default() } else { name };
                uses.insert(local, full);
            }
            syn::UseTree::Rename(r) => {
                let full = prefix.iter().cloned().chain([r.ident.to_string()]).collect();
                uses.insert(r.rename.to_string(), full);
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| walk(t, prefix, uses)),
            syn::UseTree::Glob(_) => {}
        }
    }
    for item in items {
        match item {
            syn::Item::Use(u) => walk(&u.tree, &mut Vec::new(), uses),
            syn::Item::Mod(m) if !is_test(&m.attrs) => {
                if let Some((_, items)) = &m.content {
                    collect_uses(items, uses);
                }
            }
            _ => {}
        }
    }
}

pub(crate) fn line(span: proc_macro2::Span) -> usize {
    span.start().line
}

pub(crate) fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("test") || path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        path.is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn derives_error(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().filter(|a| a.path().is_ident("derive")).any(|a| {
        let mut error = false;
        let _ = a.parse_nested_meta(|meta| {
            error |= meta.path.segments.last().is_some_and(|s| s.ident == "Error");
            Ok(())
        });
        error
    })
}

fn is_error_type(ident: &syn::Ident, attrs: &[syn::Attribute]) -> bool {
    ident.to_string().ends_with("Error") || derives_error(attrs)
}

/// Whether `fields` are one `String` and nothing else.
fn text_only(fields: &syn::Fields) -> bool {
    let mut iter = fields.iter();
    let (Some(field), None) = (iter.next(), iter.next()) else { return false };
    matches!(&field.ty, syn::Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "String"))
}

struct Declarations<'a> {
    path: &'a Path,
    krate: String,
    found: &'a mut Vec<TextVariant>,
}

impl<'ast> Visit<'ast> for Declarations<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        if is_error_type(&e.ident, &e.attrs) {
            for v in e.variants.iter().filter(|v| text_only(&v.fields)) {
                self.found.push(TextVariant {
                    krate: self.krate.clone(),
                    owner: e.ident.to_string(),
                    variant: v.ident.to_string(),
                    at: format!("{}:{}", self.path.display(), line(v.ident.span())),
                });
            }
        }
    }

    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        if is_error_type(&s.ident, &s.attrs) && text_only(&s.fields) {
            self.found.push(TextVariant {
                krate: self.krate.clone(),
                owner: s.ident.to_string(),
                variant: s.ident.to_string(),
                at: format!("{}:{}", self.path.display(), line(s.ident.span())),
            });
        }
    }
}

struct Decisions<'a> {
    path: &'a Path,
    krate: String,
    variants: &'a [TextVariant],
    /// What the file's `use` items name.
    uses: BTreeMap<String, Vec<String>>,
    /// The type of the `impl` block being read: what `Self::Variant` names.
    self_type: Option<String>,
    found: &'a mut Vec<String>,
}

impl Decisions<'_> {
    /// The string-only variant `path` names, if it names one: the path is resolved through the
    /// file's `use` items and `Self`, then its crate (`crate`, a workspace crate, or none: this
    /// crate's own), type and variant compared with the declarations'.
    fn names_text_variant(&self, path: &syn::Path) -> Option<String> {
        let mut segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(full) = self.uses.get(&segments[0]) {
            segments.splice(0..1, full.iter().cloned());
        }
        if segments[0] == "Self"
            && let Some(own) = &self.self_type
        {
            segments[0] = own.clone();
        }
        let krate = match segments[0].as_str() {
            "crate" | "self" | "super" => self.krate.clone(),
            first if self.variants.iter().any(|v| v.krate == first) && segments.len() > 2 => {
                first.to_string()
            }
            _ => self.krate.clone(),
        };
        let variant = segments.last()?;
        let owner = segments.len().checked_sub(2).map_or(variant, |i| &segments[i]);
        self.variants
            .iter()
            .find(|v| v.krate == krate && &v.variant == variant && &v.owner == owner)
            .map(|v| format!("{}::{}::{}", v.krate, v.owner, v.variant))
    }

    fn report(&mut self, span: proc_macro2::Span, what: String) {
        self.found.push(format!("{}:{}: {what}", self.path.display(), line(span)));
    }

    fn pattern_path(&mut self, path: &syn::Path) {
        if let Some(named) = self.names_text_variant(path) {
            let span = path.segments.last().map_or_else(proc_macro2::Span::call_site, |s| s.ident.span());
            self.report(
                span,
                format!(
                    "a pattern decides on {named}, whose only payload is text; give it typed fields \
                     (what failed, whose fault, which checkpoint) and decide on those"
                ),
            );
        }
    }
}

/// Methods that test text.
const TEXT_TESTS: [&str; 4] = ["contains", "starts_with", "ends_with", "eq"];
/// Methods that give an error's text.
const TEXT_OF: [&str; 2] = ["message", "to_string"];

/// Whether a binding or field is named like an error: `e`, `err`, `error`, `status`, `source`,
/// `*_error`.
fn error_like(name: &str) -> bool {
    matches!(name, "e" | "err" | "error" | "status" | "source") || name.ends_with("_error")
}

/// Whether `expr` is an error's text: `x.message()` (a status's), `x.to_string()` of a binding or
/// field named like an error (`e`, `self.error`), or `format!` of one (`format!("{e}")`,
/// `format!("{}", err)`).
fn is_text_of_error(expr: &syn::Expr) -> bool {
    match expr {
        syn::Expr::Macro(m) if m.mac.path.is_ident("format") => format_names_error(&m.mac.tokens),
        syn::Expr::MethodCall(m) if m.args.is_empty() && TEXT_OF.contains(&m.method.to_string().as_str()) => {
            if m.method == "message" {
                return true;
            }
            match &*m.receiver {
                syn::Expr::Path(receiver) => {
                    receiver.path.get_ident().is_some_and(|i| error_like(&i.to_string()))
                }
                syn::Expr::Field(field) => {
                    matches!(&field.member, syn::Member::Named(name) if error_like(&name.to_string()))
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Whether `format!`'s arguments name an error: an argument, or a capture in the format string
/// (`{e}`, `{err:?}`).
fn format_names_error(tokens: &proc_macro2::TokenStream) -> bool {
    tokens.clone().into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => error_like(&ident.to_string()),
        proc_macro2::TokenTree::Literal(literal) => {
            let text = literal.to_string();
            text.split('{').skip(1).any(|capture| {
                let name: String = capture.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                error_like(&name)
            })
        }
        _ => false,
    })
}

impl<'ast> Visit<'ast> for Decisions<'_> {
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

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let outer = self.self_type.take();
        if let syn::Type::Path(p) = &*i.self_ty {
            self.self_type = p.path.segments.last().map(|s| s.ident.to_string());
        }
        syn::visit::visit_item_impl(self, i);
        self.self_type = outer;
    }

    fn visit_pat(&mut self, pat: &'ast syn::Pat) {
        match pat {
            syn::Pat::TupleStruct(p) => self.pattern_path(&p.path),
            syn::Pat::Struct(p) => self.pattern_path(&p.path),
            _ => {}
        }
        syn::visit::visit_pat(self, pat);
    }

    fn visit_expr_macro(&mut self, m: &'ast syn::ExprMacro) {
        // `matches!(value, Pattern)`: the pattern after the first comma.
        if m.mac.path.is_ident("matches")
            && let Ok(args) = m.mac.parse_body_with(MatchesArgs::parse)
        {
            self.visit_expr(&args.0);
            self.visit_pat(&args.1);
        }
        syn::visit::visit_expr_macro(self, m);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if TEXT_TESTS.contains(&call.method.to_string().as_str()) && is_text_of_error(&call.receiver) {
            self.report(
                call.method.span(),
                format!(
                    "decides on an error's text (`{}.{}(..)`); decide on its type or code",
                    match &*call.receiver {
                        syn::Expr::MethodCall(m) => format!(".{}()", m.method),
                        _ => "format!(..)".to_string(),
                    },
                    call.method
                ),
            );
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        if matches!(b.op, syn::BinOp::Eq(_) | syn::BinOp::Ne(_))
            && (is_text_of_error(&b.left) || is_text_of_error(&b.right))
        {
            let span = match &*b.left {
                syn::Expr::MethodCall(m) => m.method.span(),
                syn::Expr::Macro(m) => {
                    m.mac.path.segments.last().map_or_else(proc_macro2::Span::call_site, |s| s.ident.span())
                }
                _ => proc_macro2::Span::call_site(),
            };
            self.report(span, "compares an error's text; decide on its type or code".into());
        }
        syn::visit::visit_expr_binary(self, b);
    }
}

/// `matches!`'s arguments: an expression, then a pattern (with an optional guard).
struct MatchesArgs(syn::Expr, syn::Pat);

impl MatchesArgs {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        let expr: syn::Expr = input.parse()?;
        input.parse::<syn::Token![,]>()?;
        let pat = syn::Pat::parse_multi_with_leading_vert(input)?;
        // The guard and a trailing comma need no check of their own here.
        let _: proc_macro2::TokenStream = input.parse()?;
        Ok(Self(expr, pat))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str) -> Vec<Source> {
        vec![(PathBuf::from("crates/x/src/lib.rs"), text.to_string())]
    }

    const TYPES: &str = r#"
        #[derive(Debug, thiserror::Error)]
        pub enum WorkerError {
            #[error("{0}")] Mismatch(String),
            #[error("{reason}")] Spawn { reason: String },
            #[error("{part:?}: {reason}")] Incompatible { part: Part, reason: String },
            #[error("interrupted")] Interrupted,
        }
        pub struct AssignmentError(pub String);
        pub enum Reply { Refused(String) }
    "#;

    #[test]
    fn string_only_variants_of_error_types_are_listed() {
        let (variants, decisions) = check(&source(TYPES)).unwrap();
        let names: Vec<String> = variants.iter().map(|v| format!("{}::{}", v.owner, v.variant)).collect();
        assert_eq!(
            names,
            ["AssignmentError::AssignmentError", "WorkerError::Mismatch", "WorkerError::Spawn"]
        );
        assert_eq!((variants[1].krate.as_str(), variants[1].at.as_str()), ("x", "crates/x/src/lib.rs:4"));
        assert!(decisions.is_empty(), "{decisions:?}");
    }

    #[test]
    fn a_decision_on_a_string_only_variant_fails_the_check() {
        let code = format!(
            "{TYPES}
            fn retry(e: &WorkerError) -> bool {{ matches!(e, WorkerError::Mismatch(_)) }}
            fn skip(e: AssignmentError) -> bool {{ let AssignmentError(text) = e; text.is_empty() }}
            impl WorkerError {{
                fn own(&self) -> bool {{ match self {{ Self::Spawn {{ .. }} => true, _ => false }} }}
                fn typed(&self) -> bool {{ matches!(self, Self::Incompatible {{ .. }} | Self::Interrupted) }}
            }}
            fn reply(r: Reply) -> bool {{ matches!(r, Reply::Refused(_)) }}"
        );
        let (_, decisions) = check(&source(&code)).unwrap();
        assert_eq!(decisions.len(), 3, "{decisions:?}");
        assert!(decisions[0].contains(":12: a pattern decides on x::WorkerError::Mismatch"), "{decisions:?}");
        assert!(decisions[1].contains("x::AssignmentError::AssignmentError"), "{decisions:?}");
        assert!(decisions[2].contains("x::WorkerError::Spawn"), "{decisions:?}");
    }

    #[test]
    fn another_crate_s_variant_is_found_through_use_items_and_a_namesake_is_not() {
        let mut sources = source(TYPES);
        sources.push((
            PathBuf::from("crates/agent/src/lib.rs"),
            r#"
            use x::WorkerError as Failure;
            use x::WorkerError::Spawn;
            fn a(e: &Failure) -> bool { matches!(e, Failure::Mismatch(_)) }
            fn b(e: &x::WorkerError) -> bool { matches!(e, Spawn { .. }) }
            fn c(e: &object_store::WorkerError) -> bool { matches!(e, object_store::WorkerError::Mismatch(_)) }
            fn d(e: &WorkerError) -> bool { matches!(e, WorkerError::Mismatch(_)) }
            "#
            .to_string(),
        ));
        let (_, decisions) = check(&sources).unwrap();
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert!(
            decisions[0].starts_with("crates/agent/src/lib.rs:4:")
                && decisions[0].contains("x::WorkerError::Mismatch")
        );
        assert!(
            decisions[1].starts_with("crates/agent/src/lib.rs:5:")
                && decisions[1].contains("x::WorkerError::Spawn")
        );
    }

    #[test]
    fn a_decision_on_a_message_fails_the_check_but_tests_may_read_messages() {
        let code = r#"
            fn retry_safe(status: &Status) -> bool { status.message().starts_with("not the leader") }
            fn same(e: &Error) -> bool { e.to_string() == "x" }
            fn name(ident: &Ident) -> bool { ident.to_string().ends_with("Error") }
            #[cfg(test)]
            mod tests {
                fn t(e: Mismatch) { assert!(e.to_string().contains("x")); let Mismatch(_) = e; }
            }
        "#;
        let (_, decisions) = check(&source(code)).unwrap();
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert!(decisions[0].contains(":2: decides on an error's text (`.message().starts_with(..)`)"));
        assert!(decisions[1].contains(":3: compares an error's text"));
    }

    #[test]
    fn an_error_s_text_through_format_or_a_field_fails_the_check() {
        let code = r#"
            fn a(e: &Error) -> bool { format!("{e}").contains("refused") }
            fn b(err: &Error) -> bool { format!("call: {}", err).starts_with("call: refused") }
            fn c(s: &Wrapper) -> bool { s.error.to_string().ends_with("refused") }
            fn d(e: &Error) -> bool { format!("{e:?}") == "Refused" }
            fn e(name: &str) -> bool { format!("{name}-0").starts_with("job") }
        "#;
        let (_, decisions) = check(&source(code)).unwrap();
        assert_eq!(decisions.len(), 4, "{decisions:?}");
        assert!(
            decisions[0].contains(":2: decides on an error's text (`format!(..).contains(..)`)"),
            "{decisions:?}"
        );
        let lines: Vec<&str> = decisions.iter().filter_map(|d| d.split(": ").next()).collect();
        assert_eq!(
            lines,
            [
                "crates/x/src/lib.rs:2",
                "crates/x/src/lib.rs:3",
                "crates/x/src/lib.rs:4",
                "crates/x/src/lib.rs:5"
            ]
        );
    }
}
