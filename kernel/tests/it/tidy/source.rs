//! The workspace's Rust sources as the source checks see them: every library and binary crate
//! of the workspace, its module tree from the `mod` declarations, and for each module file the
//! modules it names and the calls the checks look for, parsed with `syn`.
//!
//! Test code is left out: items under `#[cfg(test)]` or `#[test]`, and `tests/` folders (no
//! crate root reaches them). A module is a file: `a/mod.rs` is module `a`, and an inline
//! `mod x { .. }` counts as part of its file. Paths are resolved the way rustc does for the
//! forms the sources use: `crate::`, `self::`, `super::`, names brought in by `use` (glob
//! imports of the crate's own modules too), and a module's own children and items. Paths inside
//! macro invocations count as well: read as expressions when the tokens parse as a
//! comma-separated list (`format!`, `assert!`), otherwise token by token (`json!`,
//! `macro_rules!` bodies).
//!
//! [`Crate::load`] reads from a closure, so the checks' own tests run it on in-memory fixtures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Token};

use super::workspace_root;

/// A module path inside one crate: `[]` is the crate root, `["gateway", "store"]` is
/// `crate::gateway::store`.
pub type ModPath = Vec<String>;

/// One library or binary crate of the workspace.
pub struct Crate {
    /// The root file, workspace-relative (`kernel/src/lib.rs`): names the crate in messages.
    pub root: PathBuf,
    /// Every module that is a file, with its workspace-relative path.
    pub files: BTreeMap<ModPath, PathBuf>,
    /// What each file module's non-test code does, keyed like `files`.
    pub facts: BTreeMap<ModPath, Facts>,
}

/// What one module file's non-test code names and calls.
#[derive(Default)]
pub struct Facts {
    /// The crate's other file modules this one names, each with the line of its first mention.
    pub names: BTreeMap<ModPath, usize>,
    /// Crates outside this one that its paths start with (`actix_web`, `std`), with the line
    /// of the first mention.
    pub externs: BTreeMap<String, usize>,
    /// The calls the checks look for, in source order.
    pub sites: Vec<Site>,
    /// Every call of a function by path, with the function's path as other crates name it
    /// (`["cairn_kernel", "actors", "host", "ask"]`; a binary's root file stands for its
    /// name), and the line.
    pub calls: Vec<(Vec<String>, usize)>,
    /// Functions defined here whose body calls the function form `block_on(..)`
    /// (`futures::executor::block_on`): blocking helpers, named like the targets of `calls`.
    pub blocking_fns: BTreeSet<Vec<String>>,
}

/// A call one of the checks looks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub kind: SiteKind,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteKind {
    /// `block_on(..)` as a function or a method (`futures::executor::block_on`,
    /// `System::new().block_on`).
    BlockOn,
    /// An actor or an arbiter thread started (`SyncArbiter::start`, `.start()`,
    /// `Arbiter::new`, `HttpServer::new`); the text says which form.
    ActorStart(&'static str),
}

/// Every crate of the workspace, loaded once per test binary.
pub fn workspace() -> &'static [Crate] {
    static CRATES: OnceLock<Vec<Crate>> = OnceLock::new();
    CRATES.get_or_init(|| {
        let root = workspace_root();
        let read = |p: &Path| std::fs::read_to_string(root.join(p)).ok();
        let crates: Vec<Crate> = crate_roots()
            .into_iter()
            .map(|(file, lib_name, actix)| {
                Crate::load(&file, lib_name, actix, &read).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        assert!(
            crates.len() > 20 && crates.iter().map(|c| c.files.len()).sum::<usize>() > 150,
            "the workspace's crates and modules were found"
        );
        crates
    })
}

/// The root file of every crate of the workspace members (`src/lib.rs`, `src/main.rs`,
/// `src/bin/*.rs` and manifest `path`s), with the library's name and whether the package
/// depends on actix (only there does a bare `.start()` start an actor).
fn crate_roots() -> Vec<(PathBuf, Option<String>, bool)> {
    let root = workspace_root();
    let manifest = |dir: &Path| -> toml::Table {
        let path = root.join(dir).join("Cargo.toml");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let members = manifest(Path::new(""))["workspace"]["members"]
        .as_array()
        .expect("Cargo.toml: [workspace] members is a list")
        .iter()
        .map(|m| PathBuf::from(m.as_str().expect("a member is a path")))
        .collect::<Vec<_>>();
    let mut roots = Vec::new();
    for dir in members {
        let package = manifest(&dir);
        let name = package["package"]["name"].as_str().expect("package.name");
        let actix = package
            .get("dependencies")
            .and_then(|d| d.as_table())
            .is_some_and(|d| d.contains_key("actix"));
        let lib = package.get("lib").and_then(|l| l.as_table());
        let lib_path = lib
            .and_then(|l| l.get("path"))
            .and_then(|p| p.as_str())
            .unwrap_or("src/lib.rs");
        if root.join(&dir).join(lib_path).is_file() {
            let lib_name = lib
                .and_then(|l| l.get("name"))
                .and_then(|n| n.as_str())
                .unwrap_or(name)
                .replace('-', "_");
            roots.push((dir.join(lib_path), Some(lib_name), actix));
        }
        let mut bins: BTreeSet<PathBuf> = package
            .get("bin")
            .and_then(|b| b.as_array())
            .into_iter()
            .flatten()
            .filter_map(|b| b.get("path").and_then(|p| p.as_str()))
            .map(|p| dir.join(p))
            .collect();
        if root.join(&dir).join("src/main.rs").is_file() {
            bins.insert(dir.join("src/main.rs"));
        }
        if let Ok(entries) = std::fs::read_dir(root.join(&dir).join("src/bin")) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".rs") {
                    bins.insert(dir.join("src/bin").join(name));
                }
            }
        }
        roots.extend(bins.into_iter().map(|b| (b, None, actix)));
    }
    roots
}

// ---------------------------------------------------------------- loading

/// What a module scope makes nameable: its child modules, its items and its imports.
#[derive(Default)]
struct Scope {
    /// The file module this scope lives in (itself, unless it is an inline module).
    file: ModPath,
    children: BTreeSet<String>,
    items: BTreeSet<String>,
    /// `use` bindings: the name to the path as written (`["crate", "config", "Config"]`).
    imports: BTreeMap<String, Vec<String>>,
    /// Glob imports, as written.
    globs: Vec<Vec<String>>,
}

/// Where a path leads.
#[derive(Debug, PartialEq)]
enum Target {
    /// Inside this crate: the absolute path without `crate`.
    Internal(Vec<String>),
    /// Another crate (or something not resolvable here that is not local: a prelude name).
    External(String, Vec<String>),
    /// A generic parameter, a local binding, `Self`.
    Unknown,
}

/// One crate being loaded: the files read so far and their scopes.
struct Loader<'r> {
    read: &'r dyn Fn(&Path) -> Option<String>,
    /// The library's name, or for a binary its root file.
    name: String,
    actix: bool,
    scopes: BTreeMap<ModPath, Scope>,
    files: BTreeMap<ModPath, PathBuf>,
    parsed: Vec<(ModPath, syn::File)>,
    errors: Vec<String>,
}

impl Crate {
    /// Loads the crate whose root file is `root` (workspace-relative), reading files through
    /// `read`. `lib_name` is how other crates name it; `actix` says whether the package depends
    /// on actix. Errors name the file and what is wrong with it.
    pub fn load(
        root: &Path,
        lib_name: Option<String>,
        actix: bool,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<Crate, String> {
        let mut loader = Loader {
            read,
            name: lib_name.unwrap_or_else(|| root.display().to_string()),
            actix,
            scopes: BTreeMap::new(),
            files: BTreeMap::new(),
            parsed: Vec::new(),
            errors: Vec::new(),
        };
        let text = read(root).ok_or_else(|| format!("{}: cannot read it", root.display()))?;
        let child_dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        loader.load_file(Vec::new(), root.to_path_buf(), &text, child_dir);
        if !loader.errors.is_empty() {
            return Err(loader.errors.join("\n"));
        }
        let mut facts = BTreeMap::new();
        for (module, file) in &loader.parsed {
            let mut analyzer = Analyzer {
                loader: &loader,
                file_module: module.clone(),
                module: module.clone(),
                function: None,
                impl_type: None,
                facts: Facts::default(),
            };
            analyzer.visit_file(file);
            facts.insert(module.clone(), analyzer.facts);
        }
        Ok(Crate {
            root: root.to_path_buf(),
            files: loader.files,
            facts,
        })
    }

    /// The file of `module`, for messages.
    pub fn file(&self, module: &ModPath) -> &Path {
        &self.files[module]
    }
}

impl Loader<'_> {
    /// Reads and parses `file`, the file of `module`, records its scopes and loads its child
    /// files. `child_dir` is where its `mod x;` files live.
    fn load_file(&mut self, module: ModPath, file: PathBuf, text: &str, child_dir: PathBuf) {
        let parsed = match syn::parse_file(text) {
            Ok(parsed) => parsed,
            Err(e) => {
                let at = e.span().start();
                self.errors.push(format!(
                    "{}:{}:{}: does not parse: {e}",
                    file.display(),
                    at.line,
                    at.column + 1
                ));
                return;
            }
        };
        self.files.insert(module.clone(), file.clone());
        self.scopes.insert(
            module.clone(),
            Scope {
                file: module.clone(),
                ..Scope::default()
            },
        );
        let mut collector = Collector {
            file,
            file_module: module.clone(),
            module: module.clone(),
            child_dir,
            scopes: &mut self.scopes,
            pending: Vec::new(),
            errors: Vec::new(),
        };
        collector.visit_file(&parsed);
        let (pending, errors) = (collector.pending, collector.errors);
        self.errors.extend(errors);
        self.parsed.push((module, parsed));
        for child in pending {
            let nested = child.dir.join("mod.rs");
            let found = [&child.flat, &nested]
                .into_iter()
                .find_map(|f| (self.read)(f).map(|text| (f.clone(), text)));
            match found {
                Some((file, text)) => self.load_file(child.module, file, &text, child.dir),
                None => self.errors.push(format!(
                    "{}: `mod {};` but neither {} nor {} can be read",
                    child.declared_in.display(),
                    child.module.last().expect("a child has a name"),
                    child.flat.display(),
                    nested.display()
                )),
            }
        }
    }

    /// Where `path`, written in module `module`, leads.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Target {
        let Some((first, rest)) = path.split_first() else {
            return Target::Unknown;
        };
        if depth > 16 {
            return Target::Unknown;
        }
        let internal = |base: &[String], rest: &[String]| {
            Target::Internal(base.iter().chain(rest).cloned().collect())
        };
        match first.as_str() {
            "crate" | "$crate" => internal(&[], rest),
            "self" => internal(module, rest),
            "super" => {
                let mut base = module.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                internal(&base, rest)
            }
            "::" => match rest.split_first() {
                Some((krate, rest)) => Target::External(krate.clone(), rest.to_vec()),
                None => Target::Unknown,
            },
            _ => {
                let Some(scope) = self.scopes.get(module) else {
                    return Target::Unknown;
                };
                if scope.children.contains(first) || scope.items.contains(first) {
                    return internal(module, path);
                }
                if let Some(import) = scope.imports.get(first) {
                    return match self.resolve(module, import, depth + 1) {
                        Target::Internal(mut p) => {
                            p.extend_from_slice(rest);
                            Target::Internal(p)
                        }
                        Target::External(krate, mut p) => {
                            p.extend_from_slice(rest);
                            Target::External(krate, p)
                        }
                        Target::Unknown => Target::Unknown,
                    };
                }
                for glob in &scope.globs {
                    if let Target::Internal(base) = self.resolve(module, glob, depth + 1) {
                        if let Some(inner) = self.scopes.get(&base) {
                            if inner.children.contains(first)
                                || inner.items.contains(first)
                                || inner.imports.contains_key(first)
                            {
                                return self.resolve(&base, path, depth + 1);
                            }
                        }
                    }
                }
                if first.starts_with(|c: char| c.is_ascii_lowercase()) {
                    Target::External(first.clone(), rest.to_vec())
                } else {
                    // `Self`, a generic parameter, a prelude type.
                    Target::Unknown
                }
            }
        }
    }

    /// The file module holding the deepest module that `path` (absolute) passes through.
    fn file_module_of(&self, path: &[String]) -> Option<ModPath> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.scopes.get(&path[..n]))
            .map(|scope| scope.file.clone())
    }

    /// `path` as other crates name it: the crate's library name (a binary's root file), then
    /// the path inside it.
    fn canonical(&self, target: &Target) -> Option<Vec<String>> {
        match target {
            Target::Internal(p) => Some(std::iter::once(&self.name).chain(p).cloned().collect()),
            Target::External(krate, p) => Some(std::iter::once(krate).chain(p).cloned().collect()),
            Target::Unknown => None,
        }
    }
}

/// Whether `attrs` make an item test-only: `#[test]`, or a `#[cfg(..)]` that needs `test` or
/// `doctest`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    fn needs_test(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(p) => p.is_ident("test") || p.is_ident("doctest"),
            syn::Meta::List(list) => {
                let nested = list
                    .parse_args_with(Punctuated::<syn::Meta, Token![,]>::parse_terminated)
                    .map(|n| n.into_iter().collect::<Vec<_>>())
                    .unwrap_or_default();
                if list.path.is_ident("all") {
                    nested.iter().any(needs_test)
                } else if list.path.is_ident("any") {
                    !nested.is_empty() && nested.iter().all(needs_test)
                } else {
                    false
                }
            }
            syn::Meta::NameValue(_) => false,
        }
    }
    attrs.iter().any(|attr| {
        attr.path().is_ident("test")
            || (attr.path().is_ident("cfg")
                && attr.parse_args::<syn::Meta>().is_ok_and(|m| needs_test(&m)))
    })
}

/// A `use` tree as (binding name or `None` for a glob, full path as written, line).
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &[String],
    out: &mut Vec<(Option<String>, Vec<String>, usize)>,
) {
    let with = |name: &syn::Ident| {
        let mut p = prefix.to_vec();
        p.push(name.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => flatten_use(&p.tree, &with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            if let Some(last) = prefix.last() {
                out.push((Some(last.clone()), prefix.to_vec(), line(n.ident.span())));
            }
        }
        syn::UseTree::Name(n) => out.push((
            Some(n.ident.to_string()),
            with(&n.ident),
            line(n.ident.span()),
        )),
        syn::UseTree::Rename(r) => {
            let path = if r.ident == "self" {
                prefix.to_vec()
            } else {
                with(&r.ident)
            };
            out.push((Some(r.rename.to_string()), path, line(r.ident.span())));
        }
        syn::UseTree::Glob(g) => out.push((None, prefix.to_vec(), line(g.star_token.span))),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

fn line(span: Span) -> usize {
    span.start().line
}

/// A `mod x;` whose file is still to load.
struct Pending {
    module: ModPath,
    declared_in: PathBuf,
    /// `x/`: holds `x/mod.rs` or the children of `x.rs`.
    dir: PathBuf,
    /// `x.rs`, tried before `x/mod.rs`.
    flat: PathBuf,
}

/// Pass 1: the module tree and what each module scope makes nameable.
struct Collector<'s> {
    file: PathBuf,
    file_module: ModPath,
    module: ModPath,
    child_dir: PathBuf,
    scopes: &'s mut BTreeMap<ModPath, Scope>,
    /// `mod x;` files still to load.
    pending: Vec<Pending>,
    errors: Vec<String>,
}

impl Collector<'_> {
    fn scope(&mut self) -> &mut Scope {
        self.scopes
            .get_mut(&self.module)
            .expect("the scope was entered")
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if test_only(item_attrs(item)) {
            return;
        }
        let name = match item {
            syn::Item::Const(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Fn(i) => Some(&i.sig.ident),
            syn::Item::Macro(i) => i.ident.as_ref(),
            syn::Item::Static(i) => Some(&i.ident),
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::TraitAlias(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            syn::Item::Union(i) => Some(&i.ident),
            _ => None,
        };
        if let Some(name) = name {
            let name = name.to_string();
            self.scope().items.insert(name);
        }
        match item {
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                self.scope().children.insert(name.clone());
                let mut child = self.module.clone();
                child.push(name.clone());
                if m.attrs.iter().any(|a| a.path().is_ident("path")) {
                    self.errors.push(format!(
                        "{}: `#[path]` on `mod {name}`: the source checks do not follow it; \
                         move the file to where rustc looks by default",
                        self.file.display()
                    ));
                    return;
                }
                match &m.content {
                    Some((_, items)) => {
                        let file = self.file_module.clone();
                        self.scopes.insert(
                            child.clone(),
                            Scope {
                                file,
                                ..Scope::default()
                            },
                        );
                        let outer = std::mem::replace(&mut self.module, child);
                        self.child_dir.push(&name);
                        for item in items {
                            self.visit_item(item);
                        }
                        self.child_dir.pop();
                        self.module = outer;
                    }
                    None => self.pending.push(Pending {
                        module: child,
                        declared_in: self.file.clone(),
                        dir: self.child_dir.join(&name),
                        flat: self.child_dir.join(format!("{name}.rs")),
                    }),
                }
            }
            syn::Item::Use(u) => {
                let mut flat = Vec::new();
                flatten_use(&u.tree, &[], &mut flat);
                if u.leading_colon.is_some() {
                    for (_, path, _) in &mut flat {
                        path.insert(0, "::".into());
                    }
                }
                for (name, path, _) in flat {
                    match name {
                        Some(name) if name != "_" => {
                            self.scope().imports.insert(name, path);
                        }
                        Some(_) => {}
                        None => self.scope().globs.push(path),
                    }
                }
            }
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item {
            if test_only(&f.attrs) {
                return;
            }
        }
        visit::visit_impl_item(self, item);
    }
}

/// Pass 2: what one module file's non-test code names and calls.
struct Analyzer<'l, 'r> {
    loader: &'l Loader<'r>,
    file_module: ModPath,
    /// The module the visitor is in: `file_module` or an inline module inside it.
    module: ModPath,
    /// The function the visitor is in, by path (`[.., "Type", "method"]` for a method).
    function: Option<Vec<String>>,
    /// The type of the `impl` block the visitor is in.
    impl_type: Option<String>,
    facts: Facts,
}

impl Analyzer<'_, '_> {
    /// Records what a path of two or more segments (or a `use` path) names.
    fn name_path(&mut self, path: &[String], line: usize) {
        match self.loader.resolve(&self.module, path, 0) {
            Target::Internal(p) => {
                if let Some(file) = self.loader.file_module_of(&p) {
                    if file != self.file_module {
                        self.facts.names.entry(file).or_insert(line);
                    }
                }
            }
            Target::External(krate, _) => {
                self.facts.externs.entry(krate).or_insert(line);
            }
            Target::Unknown => {}
        }
    }

    fn site(&mut self, kind: SiteKind, line: usize) {
        self.facts.sites.push(Site { kind, line });
    }

    /// A call of the function at `path` (`closure`: its first argument is a closure).
    fn call(&mut self, path: &[String], closure: bool, line: usize) {
        let Some(last) = path.last() else { return };
        if last == "block_on" {
            self.site(SiteKind::BlockOn, line);
            if let Some(function) = &self.function {
                let function = Target::Internal(function.clone());
                let name = self.loader.canonical(&function).expect("internal");
                self.facts.blocking_fns.insert(name);
            }
        }
        let target = self.loader.resolve(&self.module, path, 0);
        if let Some(target) = self.loader.canonical(&target) {
            self.facts.calls.push((target, line));
        }
        let tail: Vec<&str> = path
            .iter()
            .rev()
            .take(2)
            .rev()
            .map(String::as_str)
            .collect();
        let start = match tail.as_slice() {
            ["SyncArbiter", "start"] => Some("SyncArbiter::start"),
            ["Supervisor", "start" | "start_in_arbiter"] => Some("Supervisor::start"),
            ["Arbiter", "new" | "with_tokio_rt"] => Some("Arbiter::new"),
            ["HttpServer", "new"] => Some("HttpServer::new"),
            ["Actor", "start"] => Some("Actor::start"),
            [_, "start_default"] => Some("Actor::start_default"),
            [_, "start_in_arbiter"] => Some("Actor::start_in_arbiter"),
            [_, "create"] if closure => Some("Actor::create"),
            _ => None,
        };
        if let Some(start) = start {
            self.site(SiteKind::ActorStart(start), line);
        }
    }

    /// A method call `.name(..)`.
    fn method(&mut self, name: &str, args: usize, closure: bool, line: usize) {
        match name {
            "block_on" => self.site(SiteKind::BlockOn, line),
            // `Actor::start(self)`, and `SyncThreads::start(factory)`. Only in crates that
            // depend on actix: elsewhere `.start()` is a range's or a regex match's.
            "start" if self.loader.actix && args == 0 => {
                self.site(SiteKind::ActorStart(".start()"), line)
            }
            "start" if self.loader.actix && args == 1 && closure => {
                self.site(SiteKind::ActorStart(".start(factory)"), line)
            }
            _ => {}
        }
    }

    /// Paths and calls inside macro tokens that do not parse as expressions.
    fn scan(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let is_sep = |j: usize| {
            matches!((tts.get(j), tts.get(j + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let ident = |j: usize| match tts.get(j) {
            Some(TokenTree::Ident(i)) => Some(i.to_string()),
            _ => None,
        };
        let mut i = 0;
        while i < tts.len() {
            let mut segs = Vec::new();
            let mut j = i;
            if is_sep(j) {
                segs.push("::".to_string());
                j += 2;
            }
            if matches!(tts.get(j), Some(TokenTree::Punct(p)) if p.as_char() == '$')
                && ident(j + 1).as_deref() == Some("crate")
            {
                segs.push("$crate".to_string());
                j += 2;
            } else if let Some(first) = ident(j) {
                segs.push(first);
                j += 1;
            }
            if segs.is_empty() || segs == ["::"] {
                if let TokenTree::Group(g) = &tts[i] {
                    self.scan(g.stream());
                }
                i += 1;
                continue;
            }
            while is_sep(j) {
                match ident(j + 2) {
                    Some(next) => {
                        segs.push(next);
                        j += 3;
                    }
                    None => break,
                }
            }
            let line = line(tts[i].span());
            if segs.len() >= 2 {
                self.name_path(&segs, line);
            }
            if let Some(TokenTree::Group(g)) = tts.get(j) {
                if g.delimiter() == Delimiter::Parenthesis {
                    let (args, closure) = arguments(g.stream());
                    let after_dot =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
                    if after_dot && segs.len() == 1 {
                        self.method(&segs[0], args, closure, line);
                    } else if !after_dot {
                        self.call(&segs, closure, line);
                    }
                }
            }
            i = j.max(i + 1);
        }
    }
}

/// The number of comma-separated arguments in a call's parentheses, and whether the first one
/// is a closure.
fn arguments(tokens: TokenStream) -> (usize, bool) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    if tts.is_empty() {
        return (0, false);
    }
    let commas = tts
        .iter()
        .filter(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','))
        .count();
    let trailing = matches!(tts.last(), Some(TokenTree::Punct(p)) if p.as_char() == ',');
    let closure = match &tts[0] {
        TokenTree::Punct(p) => p.as_char() == '|',
        TokenTree::Ident(i) => i == "move",
        _ => false,
    };
    (commas + 1 - usize::from(trailing), closure)
}

/// An item's attributes (none for the kinds that carry none here).
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn path_segments(path: &syn::Path) -> Vec<String> {
    let colon = path.leading_colon.is_some().then(|| "::".to_string());
    colon
        .into_iter()
        .chain(path.segments.iter().map(|s| s.ident.to_string()))
        .collect()
}

impl<'ast> Visit<'ast> for Analyzer<'_, '_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if test_only(item_attrs(item)) {
            return;
        }
        match item {
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    self.module.push(m.ident.to_string());
                    for item in items {
                        self.visit_item(item);
                    }
                    self.module.pop();
                }
            }
            syn::Item::Use(u) => {
                let mut flat = Vec::new();
                flatten_use(&u.tree, &[], &mut flat);
                for (_, mut path, line) in flat {
                    if u.leading_colon.is_some() {
                        path.insert(0, "::".into());
                    }
                    self.name_path(&path, line);
                }
            }
            syn::Item::ExternCrate(e) => {
                let line = line(e.ident.span());
                self.facts
                    .externs
                    .entry(e.ident.to_string())
                    .or_insert(line);
            }
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item {
            if test_only(&f.attrs) {
                return;
            }
            let mut path = self.module.clone();
            path.extend(self.impl_type.clone());
            path.push(f.sig.ident.to_string());
            let outer = self.function.replace(path);
            visit::visit_impl_item(self, item);
            self.function = outer;
            return;
        }
        visit::visit_impl_item(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let name = match &*item.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.impl_type, name);
        visit::visit_item_impl(self, item);
        self.impl_type = outer;
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let mut path = self.module.clone();
        path.push(item.sig.ident.to_string());
        let outer = self.function.replace(path);
        visit::visit_item_fn(self, item);
        self.function = outer;
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segs = path_segments(path);
        if segs.len() >= 2 {
            let line = path.segments.first().map_or(0, |s| line(s.ident.span()));
            self.name_path(&segs, line);
        }
        visit::visit_path(self, path);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Expr::Path(p) = &*call.func {
            let closure = matches!(call.args.first(), Some(Expr::Closure(_)));
            let line = p.path.segments.last().map_or(0, |s| line(s.ident.span()));
            self.call(&path_segments(&p.path), closure, line);
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let closure = matches!(call.args.first(), Some(Expr::Closure(_)));
        let name = call.method.to_string();
        self.method(&name, call.args.len(), closure, line(call.method.span()));
        visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        match mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            Ok(exprs) => {
                for expr in &exprs {
                    self.visit_expr(expr);
                }
            }
            Err(_) => self.scan(mac.tokens.clone()),
        }
    }
}
