//! `cargo xtask public-api`: a snapshot guard on the public API of the library crates.
//!
//! The listing is built from the sources alone (syn parses them, prettyplease prints
//! signatures, each normalised to one line), so it needs neither a nightly toolchain nor a
//! build. Starting at the crate's `src/lib.rs`, `mod x;` declarations are followed to
//! `x.rs`, `x/mod.rs` or their `#[path]`. `#[cfg(test)]` and items whose `cfg` does not hold
//! for the crate's default features are skipped; `#[doc(hidden)]` modules and items and
//! anything not `pub` (including `pub(crate)`) are not listed. Items of private modules
//! appear only when a public module re-exports them, under the re-exported path.
//!
//! The snapshots live in [`SNAPSHOT_DIR`], one `<package>.txt` per crate.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use syn::punctuated::Punctuated;
use syn::{
    Attribute, Fields, ImplItem, Item, Meta, TraitItem, Type, UseTree, Visibility, parse_quote,
};

use crate::workspace::Workspace;

/// The library crates (package names) whose public API is guarded.
const GUARDED: &[&str] = &["ipvs-netlink", "proxier-core", "proxier-runtime"];

/// Where the snapshots are, relative to the workspace root.
pub const SNAPSHOT_DIR: &str = "xtask/public-api";

/// Lines of context around each change in the printed diff.
const CONTEXT: usize = 3;

/// Attributes that matter for API compatibility; every other attribute is left out.
const API_ATTRIBUTES: &[&str] = &["non_exhaustive", "repr", "deprecated", "must_use"];

/// `cargo xtask public-api [--bless]`.
pub fn run(bless: bool) -> Result<ExitCode> {
    let workspace = Workspace::locate()?;
    Ok(if check(&workspace, bless)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Compares (or with `bless`, rewrites) the snapshot of every guarded crate. Returns
/// whether all of them matched; the differences are printed.
pub fn check(workspace: &Workspace, bless: bool) -> Result<bool> {
    let mut all_match = true;
    for krate in guarded_crates(workspace)? {
        let listing = listing_of(&krate)?;
        let relative = format!("{SNAPSHOT_DIR}/{}.txt", krate.package);
        let snapshot = workspace.root.join(&relative);
        if bless {
            let dir = snapshot.parent().context("snapshot path has no parent")?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::write(&snapshot, &listing)
                .with_context(|| format!("writing {}", snapshot.display()))?;
            println!(
                "xtask: public API of {}: {} lines written to {relative}",
                krate.package,
                listing.lines().count()
            );
            continue;
        }
        let old = match std::fs::read_to_string(&snapshot) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                println!("xtask: no snapshot {relative} yet");
                String::new()
            }
            Err(err) => return Err(err).with_context(|| format!("reading {relative}")),
        };
        if old == listing {
            println!("xtask: public API of {} matches {relative}", krate.package);
            continue;
        }
        all_match = false;
        println!(
            "xtask: public API of {} differs from {relative}:",
            krate.package
        );
        print!(
            "{}",
            unified_diff(
                &old,
                &listing,
                &format!("{relative} (snapshot)"),
                &format!("{} (current sources)", krate.package),
            )
        );
    }
    if !all_match {
        println!(
            "xtask: the public API changed; if that is intended, run \
             `cargo xtask public-api --bless` and commit the snapshots in {SNAPSHOT_DIR}/"
        );
    }
    Ok(all_match)
}

/// A guarded crate as cargo metadata describes it.
struct CrateInfo {
    package: String,
    lib_src: PathBuf,
    features: BTreeSet<String>,
}

/// The guarded crates' lib targets and default feature sets, from `cargo metadata`
/// (which reads manifests only: nothing is compiled).
fn guarded_crates(workspace: &Workspace) -> Result<Vec<CrateInfo>> {
    let metadata = &workspace.metadata;
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut crates = Vec::new();
    for name in GUARDED {
        let package = packages
            .iter()
            .find(|p| p["name"] == *name)
            .with_context(|| format!("package {name} not in the workspace"))?;
        let lib_src = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "lib"))
            })
            .and_then(|t| t["src_path"].as_str())
            .with_context(|| format!("package {name} has no lib target"))?;
        let declared: BTreeMap<String, Vec<String>> =
            serde_json::from_value(package["features"].clone())
                .with_context(|| format!("features of {name}"))?;
        crates.push(CrateInfo {
            package: (*name).to_owned(),
            lib_src: PathBuf::from(lib_src),
            features: default_features(&declared),
        });
    }
    Ok(crates)
}

/// The features `default` turns on, transitively (dependency features left out).
fn default_features(declared: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let mut enabled = BTreeSet::new();
    let mut pending = vec!["default".to_owned()];
    while let Some(feature) = pending.pop() {
        if !declared.contains_key(&feature) || !enabled.insert(feature.clone()) {
            continue;
        }
        for implied in &declared[&feature] {
            if !implied.starts_with("dep:") && !implied.contains('/') {
                pending.push(implied.clone());
            }
        }
    }
    enabled
}

/// The snapshot text of one crate: a header line, then one API item a line.
fn listing_of(krate: &CrateInfo) -> Result<String> {
    let ident = krate.package.replace('-', "_");
    let read = |path: &Path| std::fs::read_to_string(path).ok();
    let lines = extract(&ident, &krate.lib_src, &krate.features, &read)?;
    let features: Vec<&str> = krate.features.iter().map(String::as_str).collect();
    let mut text = format!(
        "# Public API of {} (features: {}). Regenerate: cargo xtask public-api --bless\n",
        krate.package,
        if features.is_empty() {
            "none".to_owned()
        } else {
            features.join(", ")
        }
    );
    for line in lines {
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

/// Reads a source file; `None` when there is no such file.
pub type ReadSource<'a> = dyn Fn(&Path) -> Option<String> + 'a;

/// The public API listing of the crate whose root file is `lib_src`, sorted, one item a line.
/// `crate_ident` is the crate's name as paths spell it (`ipvs_netlink`).
pub fn extract(
    crate_ident: &str,
    lib_src: &Path,
    features: &BTreeSet<String>,
    read: &ReadSource<'_>,
) -> Result<Vec<String>> {
    let mut loader = Loader {
        read,
        features,
        modules: Vec::new(),
    };
    loader.load_file(lib_src, vec![crate_ident.to_owned()], None, true)?;
    let krate = Crate {
        modules: loader.modules,
        features: features.clone(),
        display: HashMap::new(),
    };
    Ok(krate.listing())
}

/// One module of the crate, with its items already filtered by `cfg`.
struct Module {
    /// Path segments, the crate's name first.
    path: Vec<String>,
    parent: Option<usize>,
    /// Whether the module and all its ancestors are `pub` (and not doc-hidden).
    reachable: bool,
    items: Vec<Item>,
    children: BTreeMap<String, usize>,
}

/// Walks the module tree from the crate root.
struct Loader<'a> {
    read: &'a ReadSource<'a>,
    features: &'a BTreeSet<String>,
    modules: Vec<Module>,
}

impl Loader<'_> {
    fn load_file(
        &mut self,
        file: &Path,
        path: Vec<String>,
        parent: Option<usize>,
        reachable: bool,
    ) -> Result<usize> {
        let source = (self.read)(file).with_context(|| format!("reading {}", file.display()))?;
        let ast =
            syn::parse_file(&source).with_context(|| format!("parsing {}", file.display()))?;
        let file_dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let is_mod_rs = parent.is_none()
            || file
                .file_name()
                .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let mod_dir = if is_mod_rs {
            file_dir.clone()
        } else {
            let stem = file.file_stem().unwrap_or_default();
            file_dir.join(stem)
        };
        self.add_module(path, parent, reachable, ast.items, &file_dir, &mod_dir)
    }

    fn add_module(
        &mut self,
        path: Vec<String>,
        parent: Option<usize>,
        reachable: bool,
        items: Vec<Item>,
        file_dir: &Path,
        mod_dir: &Path,
    ) -> Result<usize> {
        let index = self.modules.len();
        self.modules.push(Module {
            path: path.clone(),
            parent,
            reachable,
            items: Vec::new(),
            children: BTreeMap::new(),
        });
        let mut kept = Vec::new();
        for item in items {
            if !cfg_enabled(item_attrs(&item), self.features) {
                continue;
            }
            if let Item::Mod(module) = &item {
                let name = module.ident.to_string();
                let child_reachable =
                    reachable && is_pub(&module.vis) && !doc_hidden(&module.attrs);
                let mut child_path = path.clone();
                child_path.push(unraw(&name));
                let child_dir = mod_dir.join(unraw(&name));
                let child = if let Some((_, content)) = &module.content {
                    self.add_module(
                        child_path,
                        Some(index),
                        child_reachable,
                        content.clone(),
                        file_dir,
                        &child_dir,
                    )?
                } else {
                    let file = self.module_file(&module.attrs, file_dir, mod_dir, &unraw(&name))?;
                    self.load_file(&file, child_path, Some(index), child_reachable)?
                };
                self.modules[index].children.insert(unraw(&name), child);
            }
            kept.push(item);
        }
        self.modules[index].items = kept;
        Ok(index)
    }

    /// The file of `mod name;`: its `#[path]`, or `name.rs`, or `name/mod.rs`.
    fn module_file(
        &self,
        attrs: &[Attribute],
        file_dir: &Path,
        mod_dir: &Path,
        name: &str,
    ) -> Result<PathBuf> {
        for attr in attrs {
            if let Meta::NameValue(nv) = &attr.meta
                && nv.path.is_ident("path")
                && let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
            {
                return Ok(file_dir.join(s.value()));
            }
        }
        let candidates = [
            mod_dir.join(format!("{name}.rs")),
            mod_dir.join(name).join("mod.rs"),
        ];
        for candidate in &candidates {
            if (self.read)(candidate).is_some() {
                return Ok(candidate.clone());
            }
        }
        bail!(
            "module {name}: neither {} nor {} exists",
            candidates[0].display(),
            candidates[1].display()
        )
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    Module(usize),
    Def { module: usize, name: String },
    External(Vec<String>),
}

/// One name a `use` item binds (`*` for a glob).
struct UseBinding {
    name: String,
    path: Vec<String>,
    glob: bool,
}

/// Resolution depth limit (against `use` cycles).
const MAX_DEPTH: usize = 16;

/// One output line with its sort position.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Line {
    /// The item (or owning type) path the line belongs to.
    key: String,
    /// Order within one key: the item itself, its fields, its methods, its trait impls.
    rank: u8,
    text: String,
}

const RANK_ITEM: u8 = 0;
const RANK_MEMBER: u8 = 1;
const RANK_IMPL_HEADER: u8 = 2;
const RANK_METHOD: u8 = 3;
const RANK_TRAIT_IMPL: u8 = 4;

/// The loaded crate and the public path of each public item.
struct Crate {
    modules: Vec<Module>,
    /// Enabled features, for `cfg` on fields, variants and impl items.
    features: BTreeSet<String>,
    /// (module, item name) -> the path the item is listed under.
    display: HashMap<(usize, String), Vec<String>>,
}

impl Crate {
    fn listing(mut self) -> Vec<String> {
        self.assign_display_paths();
        let mut lines = Vec::new();
        for index in 0..self.modules.len() {
            self.module_lines(index, &mut lines);
        }
        lines.sort();
        let mut texts: Vec<String> = lines.into_iter().map(|l| l.text).collect();
        texts.dedup();
        texts
    }

    /// Public items of reachable modules keep their own path; public items of private
    /// modules get the (smallest) path a reachable `pub use` gives them.
    fn assign_display_paths(&mut self) {
        let mut display = HashMap::new();
        for (index, module) in self.modules.iter().enumerate() {
            if !module.reachable {
                continue;
            }
            for item in &module.items {
                if let Some((name, vis)) = item_name(item)
                    && is_pub(vis)
                    && !doc_hidden(item_attrs(item))
                {
                    let mut path = module.path.clone();
                    path.push(name.clone());
                    display.insert((index, name), path);
                }
            }
        }
        let mut reexported: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
        let mut offer = |key: (usize, String), path: Vec<String>| {
            let entry = reexported.entry(key).or_insert_with(|| path.clone());
            if path < *entry {
                *entry = path;
            }
        };
        for (index, module) in self.modules.iter().enumerate() {
            if !module.reachable {
                continue;
            }
            for item in &module.items {
                let Item::Use(use_item) = item else { continue };
                if !is_pub(&use_item.vis) || doc_hidden(&use_item.attrs) {
                    continue;
                }
                for binding in use_bindings(&use_item.tree) {
                    let target = self.resolve(index, &binding.path, 0);
                    if binding.glob {
                        if let Some(Target::Module(source)) = target {
                            for item in &self.modules[source].items {
                                if let Some((name, vis)) = item_name(item)
                                    && is_pub(vis)
                                    && !doc_hidden(item_attrs(item))
                                {
                                    let mut path = module.path.clone();
                                    path.push(name.clone());
                                    offer((source, name), path);
                                }
                            }
                        }
                    } else if let Some(Target::Def {
                        module: source,
                        name,
                    }) = target
                        && self.is_pub_def(source, &name)
                    {
                        let mut path = module.path.clone();
                        path.push(binding.name.clone());
                        offer((source, name), path);
                    }
                }
            }
        }
        for (key, path) in reexported {
            display.entry(key).or_insert(path);
        }
        self.display = display;
    }

    fn is_pub_def(&self, module: usize, name: &str) -> bool {
        self.modules[module].items.iter().any(|item| {
            item_name(item).is_some_and(|(n, vis)| n == name && is_pub(vis))
                && !doc_hidden(item_attrs(item))
        })
    }

    /// What `name` means inside `module`.
    fn lookup(&self, module: usize, name: &str, depth: usize) -> Option<Target> {
        if depth > MAX_DEPTH {
            return None;
        }
        let m = &self.modules[module];
        if let Some(&child) = m.children.get(name) {
            return Some(Target::Module(child));
        }
        if m.items
            .iter()
            .any(|item| item_name(item).is_some_and(|(n, _)| n == name))
        {
            return Some(Target::Def {
                module,
                name: name.to_owned(),
            });
        }
        let uses = m.items.iter().filter_map(|item| match item {
            Item::Use(u) => Some(use_bindings(&u.tree)),
            _ => None,
        });
        let bindings: Vec<UseBinding> = uses.flatten().collect();
        if let Some(binding) = bindings.iter().find(|b| !b.glob && b.name == name) {
            return self.resolve(module, &binding.path, depth + 1);
        }
        for binding in bindings.iter().filter(|b| b.glob) {
            if let Some(Target::Module(source)) = self.resolve(module, &binding.path, depth + 1)
                && source != module
                && let Some(found) = self.lookup(source, name, depth + 1)
            {
                return Some(found);
            }
        }
        None
    }

    /// What a path (as written inside `module`) names.
    fn resolve(&self, module: usize, path: &[String], depth: usize) -> Option<Target> {
        let (first, rest) = path.split_first()?;
        let mut current = match first.as_str() {
            "crate" => Target::Module(0),
            "self" => Target::Module(module),
            "super" => Target::Module(self.modules[module].parent?),
            "" => return Some(Target::External(rest.to_vec())),
            name => self
                .lookup(module, name, depth)
                .unwrap_or_else(|| Target::External(vec![name.to_owned()])),
        };
        for segment in rest {
            current = match current {
                Target::Module(m) if segment == "super" => Target::Module(self.modules[m].parent?),
                Target::Module(m) => self.lookup(m, segment, depth + 1)?,
                Target::Def { .. } => return None,
                Target::External(mut p) => {
                    p.push(segment.clone());
                    Target::External(p)
                }
            };
        }
        Some(current)
    }

    /// The absolute form of a path written in `module`: crate items by their listed (or
    /// defining) path, imports followed to their source; `None` when it names a module.
    fn absolute(&self, module: usize, path: &syn::Path) -> Option<Vec<String>> {
        if path.leading_colon.is_some() {
            return Some(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        match self.resolve(module, &segments, 0)? {
            Target::Module(_) => None,
            Target::Def { module: m, name } => Some(
                self.display
                    .get(&(m, name.clone()))
                    .cloned()
                    .unwrap_or_else(|| {
                        let mut p = self.modules[m].path.clone();
                        p.push(name);
                        p
                    }),
            ),
            Target::External(p) => Some(p),
        }
    }

    /// `path` rewritten to its absolute form, keeping the last segment's generic arguments.
    fn absolute_path(&self, module: usize, path: &syn::Path) -> syn::Path {
        let Some(absolute) = self.absolute(module, path) else {
            return path.clone();
        };
        with_segments(&absolute, path)
    }

    /// The listed path of the crate type an impl's self type names.
    fn self_type_path(&self, module: usize, ty: &Type) -> Option<(Vec<String>, syn::Path)> {
        let Type::Path(type_path) = ty else {
            return None;
        };
        if type_path.qself.is_some() {
            return None;
        }
        let segments: Vec<String> = type_path
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        match self.resolve(module, &segments, 0)? {
            Target::Def { module: m, name } => {
                let display = self.display.get(&(m, name))?;
                Some((display.clone(), type_path.path.clone()))
            }
            _ => None,
        }
    }

    fn module_lines(&self, index: usize, lines: &mut Vec<Line>) {
        let module = &self.modules[index];
        if module.reachable && module.parent.is_some() {
            let path = module.path.join("::");
            lines.push(Line {
                key: path.clone(),
                rank: RANK_ITEM,
                text: format!("pub mod {path}"),
            });
        }
        for item in &module.items {
            match item {
                Item::Impl(imp) => self.impl_lines(index, imp, lines),
                Item::Use(use_item) if module.reachable => {
                    if is_pub(&use_item.vis) && !doc_hidden(&use_item.attrs) {
                        self.reexport_lines(index, &use_item.tree, lines);
                    }
                }
                Item::Macro(mac) => {
                    let exported = mac.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                    if let Some(ident) = &mac.ident
                        && exported
                        && !doc_hidden(&mac.attrs)
                    {
                        let path = format!("{}::{}", self.modules[0].path[0], ident);
                        lines.push(Line {
                            key: path.clone(),
                            rank: RANK_ITEM,
                            text: format!("macro_rules! {path}"),
                        });
                    }
                }
                _ => {
                    if let Some((name, _)) = item_name(item)
                        && let Some(path) = self.display.get(&(index, name))
                    {
                        self.item_lines(index, item, &path.join("::"), lines);
                    }
                }
            }
        }
    }

    fn reexport_lines(&self, index: usize, tree: &UseTree, lines: &mut Vec<Line>) {
        let here = &self.modules[index].path;
        for binding in use_bindings(tree) {
            let source = match binding.path.split_last() {
                Some((last, prefix)) if !binding.glob => {
                    let mut resolved = self.absolute_segments(index, prefix);
                    resolved.push(last.clone());
                    resolved
                }
                _ => self.absolute_segments(index, &binding.path),
            };
            let location = format!("{}::{}", here.join("::"), binding.name);
            let source = source.join("::");
            let source = if binding.glob {
                format!("{source}::*")
            } else {
                source
            };
            lines.push(Line {
                key: location.clone(),
                rank: RANK_ITEM,
                text: format!("pub use {location} = {source}"),
            });
        }
    }

    /// A module path written in `index`, made absolute (crate paths start with the crate name).
    fn absolute_segments(&self, index: usize, path: &[String]) -> Vec<String> {
        if path.is_empty() {
            return self.modules[index].path.clone();
        }
        match self.resolve(index, path, 0) {
            Some(Target::Module(m)) => self.modules[m].path.clone(),
            Some(Target::Def { module, name }) => {
                let mut p = self.modules[module].path.clone();
                p.push(name);
                p
            }
            Some(Target::External(p)) => p,
            None => path.to_vec(),
        }
    }

    fn item_lines(&self, index: usize, item: &Item, path: &str, lines: &mut Vec<Line>) {
        let attrs = api_attributes(item_attrs(item));
        let mut push = |rank: u8, text: String| {
            lines.push(Line {
                key: path.to_owned(),
                rank,
                text: format!("{attrs}{text}"),
            })
        };
        match item {
            Item::Struct(s) => {
                let mut header = s.clone();
                header.attrs.clear();
                header.fields = Fields::Unit;
                header.semi_token = Some(Default::default());
                let text = strip_end(&render(Item::Struct(header)), ";");
                push(RANK_ITEM, rename(&text, "struct", &s.ident, path));
                self.field_lines(&s.fields, path, lines);
                self.derive_lines(index, &s.attrs, path, lines);
            }
            Item::Union(u) => {
                let mut header = u.clone();
                header.attrs.clear();
                header.fields.named.clear();
                let text = strip_end(&render(Item::Union(header)), "{}");
                push(RANK_ITEM, rename(&text, "union", &u.ident, path));
                self.field_lines(&Fields::Named(u.fields.clone()), path, lines);
                self.derive_lines(index, &u.attrs, path, lines);
            }
            Item::Enum(e) => {
                let mut header = e.clone();
                header.attrs.clear();
                header.variants.clear();
                let text = strip_end(&render(Item::Enum(header)), "{}");
                push(RANK_ITEM, rename(&text, "enum", &e.ident, path));
                for variant in &e.variants {
                    if !self.usable(&variant.attrs) {
                        continue;
                    }
                    let mut text = format!(
                        "{}{path}::{}{}",
                        api_attributes(&variant.attrs),
                        variant.ident,
                        fields_text(&variant.fields)
                    );
                    if let Some((_, discriminant)) = &variant.discriminant {
                        let _ = write!(text, " = {}", render_expr(discriminant));
                    }
                    lines.push(Line {
                        key: path.to_owned(),
                        rank: RANK_MEMBER,
                        text,
                    });
                }
                self.derive_lines(index, &e.attrs, path, lines);
            }
            Item::Trait(t) => {
                let mut header = t.clone();
                header.attrs.clear();
                header.items.clear();
                let text = strip_end(&render(Item::Trait(header)), "{}");
                push(RANK_ITEM, rename(&text, "trait", &t.ident, path));
                for trait_item in &t.items {
                    if let Some(text) = self.trait_item_text(trait_item, path) {
                        lines.push(Line {
                            key: path.to_owned(),
                            rank: RANK_METHOD,
                            text,
                        });
                    }
                }
            }
            Item::Fn(f) => {
                push(RANK_ITEM, signature_text(&f.vis, &f.sig, path));
            }
            Item::Const(c) => {
                let mut c = c.clone();
                c.attrs.clear();
                let text = strip_end(&render(Item::Const(c.clone())), ";");
                push(RANK_ITEM, rename(&text, "const", &c.ident, path));
            }
            Item::Static(s) => {
                let mutability = match s.mutability {
                    syn::StaticMutability::Mut(_) => "mut ",
                    _ => "",
                };
                push(
                    RANK_ITEM,
                    format!("pub static {mutability}{path}: {}", render_type(&s.ty)),
                );
            }
            Item::Type(t) => {
                let mut t = t.clone();
                t.attrs.clear();
                let text = strip_end(&render(Item::Type(t.clone())), ";");
                push(RANK_ITEM, rename(&text, "type", &t.ident, path));
            }
            Item::TraitAlias(t) => {
                let mut t = t.clone();
                t.attrs.clear();
                let text = strip_end(&render(Item::TraitAlias(t.clone())), ";");
                push(RANK_ITEM, rename(&text, "trait", &t.ident, path));
            }
            _ => {}
        }
    }

    fn field_lines(&self, fields: &Fields, path: &str, lines: &mut Vec<Line>) {
        for (position, field) in fields.iter().enumerate() {
            if !is_pub(&field.vis) || !self.usable(&field.attrs) {
                continue;
            }
            let name = field
                .ident
                .as_ref()
                .map_or_else(|| position.to_string(), ToString::to_string);
            lines.push(Line {
                key: path.to_owned(),
                rank: RANK_MEMBER,
                text: format!(
                    "{}pub {path}::{name}: {}",
                    api_attributes(&field.attrs),
                    render_type(&field.ty)
                ),
            });
        }
    }

    /// `#[derive(Trait)]` is listed like a written `impl Trait for Type`.
    fn derive_lines(&self, index: usize, attrs: &[Attribute], path: &str, lines: &mut Vec<Line>) {
        for attr in attrs.iter().filter(|a| a.path().is_ident("derive")) {
            let Ok(derived) =
                attr.parse_args_with(Punctuated::<syn::Path, syn::Token![,]>::parse_terminated)
            else {
                continue;
            };
            for trait_path in derived {
                let trait_path = self.absolute_path(index, &trait_path);
                lines.push(Line {
                    key: path.to_owned(),
                    rank: RANK_TRAIT_IMPL,
                    text: format!("impl {} for {path}", render_path(&trait_path)),
                });
            }
        }
    }

    fn impl_lines(&self, index: usize, imp: &syn::ItemImpl, lines: &mut Vec<Line>) {
        if doc_hidden(&imp.attrs) {
            return;
        }
        let Some((display, written)) = self.self_type_path(index, &imp.self_ty) else {
            return;
        };
        let key = display.join("::");
        let mut header = imp.clone();
        header.attrs.clear();
        header.items.clear();
        header.self_ty = Box::new(Type::Path(syn::TypePath {
            attrs: Vec::new(),
            qself: None,
            path: with_segments(&display, &written),
        }));
        if let Some((trait_path, _)) = &mut header.trait_ {
            *trait_path = self.absolute_path(index, trait_path);
            lines.push(Line {
                key,
                rank: RANK_TRAIT_IMPL,
                text: strip_end(&render(Item::Impl(header)), "{}"),
            });
            return;
        }
        let mut any_public = false;
        for impl_item in &imp.items {
            let text = match impl_item {
                ImplItem::Fn(f) if is_pub(&f.vis) && self.usable(&f.attrs) => format!(
                    "{}{}",
                    api_attributes(&f.attrs),
                    signature_text(&f.vis, &f.sig, &format!("{key}::{}", f.sig.ident))
                ),
                ImplItem::Const(c) if is_pub(&c.vis) && self.usable(&c.attrs) => format!(
                    "{}pub const {key}::{}: {} = {}",
                    api_attributes(&c.attrs),
                    c.ident,
                    render_type(&c.ty),
                    render_expr(&c.expr)
                ),
                ImplItem::Type(t) if is_pub(&t.vis) && self.usable(&t.attrs) => {
                    format!("pub type {key}::{} = {}", t.ident, render_type(&t.ty))
                }
                _ => continue,
            };
            any_public = true;
            lines.push(Line {
                key: key.clone(),
                rank: RANK_METHOD,
                text,
            });
        }
        let generic = !imp.generics.params.is_empty() || imp.generics.where_clause.is_some();
        if any_public && generic {
            lines.push(Line {
                key,
                rank: RANK_IMPL_HEADER,
                text: strip_end(&render(Item::Impl(header)), "{}"),
            });
        }
    }
}

impl Crate {
    /// A member (field, variant, associated item) whose `cfg` holds and that is not hidden.
    fn usable(&self, attrs: &[Attribute]) -> bool {
        cfg_enabled(attrs, &self.features) && !doc_hidden(attrs)
    }

    fn trait_item_text(&self, item: &TraitItem, path: &str) -> Option<String> {
        Some(match item {
            TraitItem::Fn(f) if self.usable(&f.attrs) => {
                let text = signature_text(
                    &Visibility::Inherited,
                    &f.sig,
                    &format!("{path}::{}", f.sig.ident),
                );
                let provided = if f.default.is_some() {
                    " (provided)"
                } else {
                    ""
                };
                format!("{}{text}{provided}", api_attributes(&f.attrs))
            }
            TraitItem::Const(c) if self.usable(&c.attrs) => {
                format!("const {path}::{}: {}", c.ident, render_type(&c.ty))
            }
            TraitItem::Type(t) if self.usable(&t.attrs) => {
                let mut t = t.clone();
                t.attrs.clear();
                let text = strip_end(&render_trait_item(TraitItem::Type(t.clone())), ";");
                rename(&text, "type", &t.ident, &format!("{path}::{}", t.ident))
            }
            _ => return None,
        })
    }
}

/// `pub fn path<generics>(args) -> ret where ...` on one line. Argument attributes and
/// `mut` bindings are left out: callers do not see them.
fn signature_text(vis: &Visibility, sig: &syn::Signature, path: &str) -> String {
    let mut sig = sig.clone();
    for input in &mut sig.inputs {
        match input {
            syn::FnArg::Receiver(receiver) => {
                receiver.attrs.clear();
                receiver.mutability = None;
            }
            syn::FnArg::Typed(typed) => {
                typed.attrs.clear();
                if let syn::Pat::Ident(binding) = typed.pat.as_mut() {
                    binding.mutability = None;
                }
            }
        }
    }
    let item: Item = parse_quote!(#vis #sig {});
    let text = strip_end(&render(item), "{}");
    rename(&text, "fn", &sig.ident, path)
}

/// Replaces the item name after `keyword` with the full path.
fn rename(text: &str, keyword: &str, ident: &syn::Ident, path: &str) -> String {
    let needle = format!("{keyword} {ident}");
    match text.find(&needle) {
        Some(at) => {
            let name_at = at + keyword.len() + 1;
            format!(
                "{}{path}{}",
                &text[..name_at],
                &text[name_at + ident.to_string().len()..]
            )
        }
        None => text.to_owned(),
    }
}

/// `(A, B)` / ` { a: A, b: B }` / nothing, for enum variants.
fn fields_text(fields: &Fields) -> String {
    match fields {
        Fields::Unit => String::new(),
        Fields::Unnamed(unnamed) => {
            let types: Vec<String> = unnamed.unnamed.iter().map(|f| render_type(&f.ty)).collect();
            format!("({})", types.join(", "))
        }
        Fields::Named(named) => {
            let fields: Vec<String> = named
                .named
                .iter()
                .map(|f| {
                    let name = f
                        .ident
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    format!("{name}: {}", render_type(&f.ty))
                })
                .collect();
            format!(" {{ {} }}", fields.join(", "))
        }
    }
}

/// Kept attributes (see [`API_ATTRIBUTES`]), each followed by a space.
fn api_attributes(attrs: &[Attribute]) -> String {
    let mut text = String::new();
    for attr in attrs {
        if API_ATTRIBUTES.iter().any(|name| attr.path().is_ident(name)) {
            let item: Item = parse_quote!(#attr struct __A;);
            text.push_str(&strip_end(&render(item), "struct __A;"));
            text.push(' ');
        }
    }
    text
}

fn render_type(ty: &Type) -> String {
    let item: Item = parse_quote!(type __T = #ty;);
    let text = render(item);
    strip_end(text.strip_prefix("type __T = ").unwrap_or(&text), ";")
}

fn render_expr(expr: &syn::Expr) -> String {
    let item: Item = parse_quote!(const __C: () = #expr;);
    let text = render(item);
    strip_end(text.strip_prefix("const __C: () = ").unwrap_or(&text), ";")
}

fn render_path(path: &syn::Path) -> String {
    render_type(&Type::Path(syn::TypePath {
        attrs: Vec::new(),
        qself: None,
        path: path.clone(),
    }))
}

/// A trait item printed inside a dummy trait.
fn render_trait_item(item: TraitItem) -> String {
    let text = render(parse_quote!(trait __T { #item }));
    let inner = text.strip_prefix("trait __T {").unwrap_or(&text);
    strip_end(inner.trim(), "}").trim().to_owned()
}

/// One item, printed by prettyplease and folded onto one line.
fn render(item: Item) -> String {
    let file = syn::File {
        shebang: None,
        frontmatter: None,
        attrs: Vec::new(),
        items: vec![item],
    };
    one_line(&prettyplease::unparse(&file))
}

/// Folds prettyplease's line breaks: no space inside brackets, no trailing comma before a
/// closing bracket, one space elsewhere.
fn one_line(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if out.is_empty() {
            out.push_str(line);
            continue;
        }
        let first = line.chars().next();
        if matches!(first, Some(')' | ']' | '>')) {
            if out.ends_with(',') {
                out.pop();
            }
        } else if out.ends_with(['(', '[', '<']) {
            // nothing between an opening bracket and the first element
        } else {
            if first == Some('}') && out.ends_with(',') {
                out.pop();
            }
            out.push(' ');
        }
        out.push_str(line);
    }
    out
}

/// `text` without `suffix` (and then without a trailing comma left by a `where` clause).
fn strip_end(text: &str, suffix: &str) -> String {
    let text = text.trim_end();
    let text = text.strip_suffix(suffix).unwrap_or(text).trim_end();
    text.strip_suffix(',').unwrap_or(text).to_owned()
}

/// A syn path from segments, with `original`'s last generic arguments.
fn with_segments(segments: &[String], original: &syn::Path) -> syn::Path {
    let Ok(mut path) = syn::parse_str::<syn::Path>(&segments.join("::")) else {
        return original.clone();
    };
    if let (Some(last), Some(written)) = (path.segments.last_mut(), original.segments.last()) {
        last.arguments = written.arguments.clone();
    }
    path
}

fn use_bindings(tree: &UseTree) -> Vec<UseBinding> {
    let mut out = Vec::new();
    collect_bindings(tree, Vec::new(), &mut out);
    out
}

fn collect_bindings(tree: &UseTree, mut prefix: Vec<String>, out: &mut Vec<UseBinding>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            collect_bindings(&p.tree, prefix, out);
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    out.push(UseBinding {
                        name: last.clone(),
                        path: prefix.clone(),
                        glob: false,
                    });
                }
            } else {
                prefix.push(name.clone());
                out.push(UseBinding {
                    name,
                    path: prefix,
                    glob: false,
                });
            }
        }
        UseTree::Rename(r) => {
            let name = r.rename.to_string();
            if name != "_" {
                prefix.push(r.ident.to_string());
                out.push(UseBinding {
                    name,
                    path: prefix,
                    glob: false,
                });
            }
        }
        UseTree::Glob(_) => out.push(UseBinding {
            name: "*".to_owned(),
            path: prefix,
            glob: true,
        }),
        UseTree::Group(g) => {
            for tree in &g.items {
                collect_bindings(tree, prefix.clone(), out);
            }
        }
    }
}

/// The name and visibility of an item that defines a name (not modules, impls, uses).
fn item_name(item: &Item) -> Option<(String, &Visibility)> {
    let (ident, vis) = match item {
        Item::Const(i) => (&i.ident, &i.vis),
        Item::Enum(i) => (&i.ident, &i.vis),
        Item::Fn(i) => (&i.sig.ident, &i.vis),
        Item::Static(i) => (&i.ident, &i.vis),
        Item::Struct(i) => (&i.ident, &i.vis),
        Item::Trait(i) => (&i.ident, &i.vis),
        Item::TraitAlias(i) => (&i.ident, &i.vis),
        Item::Type(i) => (&i.ident, &i.vis),
        Item::Union(i) => (&i.ident, &i.vis),
        _ => return None,
    };
    Some((unraw(&ident.to_string()), vis))
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn unraw(name: &str) -> String {
    name.strip_prefix("r#").unwrap_or(name).to_owned()
}

/// Plain `pub` (not `pub(crate)`, `pub(super)`, `pub(in ...)`).
fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn doc_hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let Meta::List(list) = &attr.meta else {
            return false;
        };
        list.path.is_ident("doc")
            && list
                .tokens
                .to_string()
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|word| word == "hidden")
    })
}

/// Whether every `#[cfg(...)]` holds for a Linux build with `features`, outside tests.
fn cfg_enabled(attrs: &[Attribute], features: &BTreeSet<String>) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .all(|attr| match attr.parse_args::<Meta>() {
            Ok(meta) => cfg_holds(&meta, features),
            Err(_) => true,
        })
}

fn cfg_holds(meta: &Meta, features: &BTreeSet<String>) -> bool {
    match meta {
        Meta::Path(path) => ["unix", "debug_assertions"]
            .iter()
            .any(|name| path.is_ident(name)),
        Meta::NameValue(nv) => {
            let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(value),
                ..
            }) = &nv.value
            else {
                return false;
            };
            let value = value.value();
            let key = nv.path.get_ident().map(ToString::to_string);
            match key.as_deref() {
                Some("feature") => features.contains(&value),
                Some("target_os") => value == "linux",
                Some("target_family") => value == "unix",
                _ => false,
            }
        }
        Meta::List(list) => {
            let Ok(nested) =
                list.parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
            else {
                return true;
            };
            let mut nested = nested.iter();
            if list.path.is_ident("not") {
                !nested.next().is_some_and(|m| cfg_holds(m, features))
            } else if list.path.is_ident("any") {
                nested.any(|m| cfg_holds(m, features))
            } else if list.path.is_ident("all") {
                nested.all(|m| cfg_holds(m, features))
            } else {
                false
            }
        }
    }
}

/// A unified-style line diff (`-` snapshot, `+` current) with a few lines of context.
pub fn unified_diff(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    let ops = diff_ops(&old, &new);
    let changes: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| *op != ' ')
        .map(|(i, _)| i)
        .collect();
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    let mut k = 0;
    while k < changes.len() {
        let start = changes[k].saturating_sub(CONTEXT);
        let mut last = changes[k];
        while k + 1 < changes.len() && changes[k + 1] - last - 1 <= 2 * CONTEXT {
            k += 1;
            last = changes[k];
        }
        k += 1;
        let end = (last + 1 + CONTEXT).min(ops.len());
        let before = &ops[..start];
        let hunk = &ops[start..end];
        let old_start = before.iter().filter(|(op, _)| *op != '+').count() + 1;
        let new_start = before.iter().filter(|(op, _)| *op != '-').count() + 1;
        let old_count = hunk.iter().filter(|(op, _)| *op != '+').count();
        let new_count = hunk.iter().filter(|(op, _)| *op != '-').count();
        let _ = writeln!(
            out,
            "@@ -{old_start},{old_count} +{new_start},{new_count} @@"
        );
        for (op, line) in hunk {
            let _ = writeln!(out, "{op}{line}");
        }
    }
    out
}

/// The edit script from `old` to `new`: (' ' | '-' | '+', line), via a longest common
/// subsequence of the lines between the common prefix and suffix.
fn diff_ops<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<(char, &'a str)> {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let a = &old[prefix..old.len() - suffix];
    let b = &new[prefix..new.len() - suffix];
    let mut ops: Vec<(char, &str)> = old[..prefix].iter().map(|l| (' ', *l)).collect();
    let (n, m) = (a.len(), b.len());
    if n.saturating_mul(m) > 50_000_000 {
        ops.extend(a.iter().map(|l| ('-', *l)));
        ops.extend(b.iter().map(|l| ('+', *l)));
    } else {
        let width = m + 1;
        let mut lcs = vec![0u32; (n + 1) * width];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i * width + j] = if a[i] == b[j] {
                    lcs[(i + 1) * width + j + 1] + 1
                } else {
                    lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if a[i] == b[j] {
                ops.push((' ', a[i]));
                i += 1;
                j += 1;
            } else if lcs[(i + 1) * width + j] >= lcs[i * width + j + 1] {
                ops.push(('-', a[i]));
                i += 1;
            } else {
                ops.push(('+', b[j]));
                j += 1;
            }
        }
        ops.extend(a[i..].iter().map(|l| ('-', *l)));
        ops.extend(b[j..].iter().map(|l| ('+', *l)));
    }
    ops.extend(old[old.len() - suffix..].iter().map(|l| (' ', *l)));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listing of an in-memory crate `demo` whose files are `(path, source)` pairs.
    fn listing(files: &[(&str, &str)], features: &[&str]) -> Vec<String> {
        let files: HashMap<PathBuf, String> = files
            .iter()
            .map(|(path, source)| (PathBuf::from(path), (*source).to_owned()))
            .collect();
        let read = |path: &Path| files.get(path).cloned();
        let features = features.iter().map(|f| (*f).to_owned()).collect();
        extract("demo", Path::new("src/lib.rs"), &features, &read).expect("extract")
    }

    fn assert_has(lines: &[String], expected: &str) {
        assert!(
            lines.iter().any(|l| l == expected),
            "missing line {expected:?} in:\n{}",
            lines.join("\n")
        );
    }

    fn assert_lacks(lines: &[String], fragment: &str) {
        assert!(
            !lines.iter().any(|l| l.contains(fragment)),
            "unexpected {fragment:?} in:\n{}",
            lines.join("\n")
        );
    }

    #[test]
    fn struct_lists_pub_fields_only() {
        let lines = listing(
            &[(
                "src/lib.rs",
                "/// Docs are not listed.\n\
                 #[derive(Debug, Clone)]\n\
                 pub struct Point { pub x: u32, y: String, pub(crate) z: u8 }\n\
                 pub struct Private(u8);",
            )],
            &[],
        );
        assert_eq!(
            lines,
            [
                "pub struct demo::Point",
                "pub demo::Point::x: u32",
                "impl Clone for demo::Point",
                "impl Debug for demo::Point",
                "pub struct demo::Private",
            ]
        );
    }

    #[test]
    fn private_module_items_only_through_reexports() {
        let lines = listing(
            &[
                (
                    "src/lib.rs",
                    "mod inner;\npub mod open;\npub use inner::Exported;",
                ),
                (
                    "src/inner.rs",
                    "pub struct Exported;\npub fn not_reexported() {}\n\
                     impl Exported { pub fn method(&self) -> u8 { 0 } fn private(&self) {} }",
                ),
                (
                    "src/open/mod.rs",
                    "pub(crate) fn crate_only() {}\npub fn listed(mut n: u8) -> u8 { n }",
                ),
            ],
            &[],
        );
        assert_eq!(
            lines,
            [
                "pub struct demo::Exported",
                "pub use demo::Exported = demo::inner::Exported",
                "pub fn demo::Exported::method(&self) -> u8",
                "pub mod demo::open",
                "pub fn demo::open::listed(n: u8) -> u8",
            ]
        );
    }

    #[test]
    fn cfg_test_doc_hidden_and_features() {
        let files = [(
            "src/lib.rs",
            "#[cfg(test)] pub mod tests { pub fn helper() {} }\n\
             #[cfg(test)] pub fn test_only() {}\n\
             #[doc(hidden)] pub mod testing { pub fn hidden() {} }\n\
             #[cfg(feature = \"extra\")] pub fn extra() {}\n\
             #[cfg(not(feature = \"extra\"))] pub fn plain() {}\n\
             pub enum E { A, #[cfg(test)] B }",
        )];
        let without = listing(&files, &[]);
        for fragment in ["tests", "test_only", "hidden", "extra", "E::B"] {
            assert_lacks(&without, fragment);
        }
        assert_has(&without, "pub fn demo::plain()");
        assert_has(&without, "demo::E::A");
        let with = listing(&files, &["extra"]);
        assert_has(&with, "pub fn demo::extra()");
        assert_lacks(&with, "plain");
    }

    #[test]
    fn generic_method_signature_on_one_line() {
        let lines = listing(
            &[(
                "src/lib.rs",
                "pub struct Wrapper<T>(pub T);\n\
                 impl<T: Clone> Wrapper<T> {\n\
                     /// Docs.\n\
                     pub async fn map<'a, U, F: Fn(&'a T) -> U>(&'a mut self, f: F, \
                         some_rather_long_argument_name: &'static [Option<Box<dyn Send>>]) \
                         -> Result<Wrapper<U>, ()> where U: Clone + Send { todo!() }\n\
                 }",
            )],
            &[],
        );
        assert_eq!(
            lines,
            [
                "pub struct demo::Wrapper<T>",
                "pub demo::Wrapper::0: T",
                "impl<T: Clone> demo::Wrapper<T>",
                "pub async fn demo::Wrapper::map<'a, U, F: Fn(&'a T) -> U>(&'a mut self, f: F, \
                 some_rather_long_argument_name: &'static [Option<Box<dyn Send>>]) \
                 -> Result<Wrapper<U>, ()> where U: Clone + Send",
            ]
        );
    }

    #[test]
    fn enums_traits_and_trait_impls() {
        let lines = listing(
            &[(
                "src/lib.rs",
                "use std::fmt;\n\
                 #[non_exhaustive]\n\
                 #[repr(u8)]\n\
                 pub enum Kind { A = 1, B(u16, String), #[non_exhaustive] C { x: u32 } }\n\
                 impl fmt::Display for Kind { fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { Ok(()) } }\n\
                 pub trait Backend: Send { type Out; fn run(&mut self) -> Self::Out; fn name(&self) -> &str { \"\" } }\n\
                 pub const LIMIT: usize = 4;\n\
                 pub type Alias = Vec<Kind>;",
            )],
            &[],
        );
        assert_eq!(
            lines,
            [
                "pub type demo::Alias = Vec<Kind>",
                "pub trait demo::Backend: Send",
                "fn demo::Backend::name(&self) -> &str (provided)",
                "fn demo::Backend::run(&mut self) -> Self::Out",
                "type demo::Backend::Out",
                "#[non_exhaustive] #[repr(u8)] pub enum demo::Kind",
                "#[non_exhaustive] demo::Kind::C { x: u32 }",
                "demo::Kind::A = 1",
                "demo::Kind::B(u16, String)",
                "impl std::fmt::Display for demo::Kind",
                "pub const demo::LIMIT: usize = 4",
            ]
        );
    }

    #[test]
    fn diff_marks_added_and_removed_lines() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\n";
        let diff = unified_diff(old, new, "old", "new");
        assert_eq!(
            diff,
            "--- old\n+++ new\n@@ -2,8 +2,9 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n i\n+j\n"
        );
        assert_eq!(unified_diff(old, old, "old", "new"), "--- old\n+++ new\n");
    }
}
