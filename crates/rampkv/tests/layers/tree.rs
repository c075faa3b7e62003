//! A crate as a tree of modules and files, paths resolved to the files that define what they
//! name, the file graph and its circles.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use crate::facts::{file_facts, Scope};
use crate::source::{production_tokens, tokenize};

/// Bound on following `use` re-exports while resolving one path (a re-export of a re-export ...).
const RESOLVE_DEPTH_MAX: usize = 32;

/// A module of a crate: where it lives and what its scope holds.
#[derive(Debug)]
pub(crate) struct Module {
    /// The file, relative to the crate directory.
    pub(crate) file: String,
    pub(crate) scope: Scope,
}

/// One crate (a library or a binary) as a tree of modules.
#[derive(Debug)]
pub(crate) struct CrateTree {
    pub(crate) modules: BTreeMap<Vec<String>, Module>,
}

fn parent_dir(file: &str) -> String {
    Path::new(file).parent().map(|dir| dir.to_string_lossy().into_owned()).unwrap_or_default()
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

impl CrateTree {
    /// Walks the modules declared from `root` (e.g. `src/lib.rs`) through `sources` (file
    /// path relative to the crate directory -> text).
    pub(crate) fn build(sources: &BTreeMap<String, String>, root: &str) -> Result<CrateTree, String> {
        let mut modules = BTreeMap::new();
        // (module path, file, whether the file owns its directory as lib.rs and mod.rs do)
        let mut pending = vec![(Vec::<String>::new(), root.to_owned(), true)];
        while let Some((module_path, file, owns_dir)) = pending.pop() {
            let source = sources.get(&file).ok_or_else(|| format!("{file}: declared but not found"))?;
            let facts = file_facts(&production_tokens(&tokenize(source)));
            let file_dir = if owns_dir { parent_dir(&file) } else { file.trim_end_matches(".rs").to_owned() };
            for (relative, scope) in facts.scopes {
                let dir = relative.iter().fold(file_dir.clone(), |dir, name| join(&dir, name));
                for child in &scope.file_children {
                    if child == "tests" {
                        continue; // test-only by convention even without a cfg
                    }
                    let mut child_path = module_path.clone();
                    child_path.extend(relative.iter().cloned());
                    child_path.push(child.clone());
                    let flat = join(&dir, &format!("{child}.rs"));
                    let nested = join(&join(&dir, child), "mod.rs");
                    if sources.contains_key(&flat) {
                        pending.push((child_path, flat, false));
                    } else if sources.contains_key(&nested) {
                        pending.push((child_path, nested, true));
                    } else {
                        return Err(format!("{file}: `mod {child};` has neither {flat} nor {nested}"));
                    }
                }
                let mut full = module_path.clone();
                full.extend(relative);
                if full.last().is_some_and(|name| name == "tests") {
                    continue;
                }
                modules.insert(full, Module { file: file.clone(), scope });
            }
        }
        Ok(CrateTree { modules })
    }

    fn has_child(&self, module: &[String], name: &str) -> bool {
        let mut child = module.to_vec();
        child.push(name.to_owned());
        self.modules.contains_key(&child)
    }

    /// The absolute module path a path written in `module` starts from, with the rest of the
    /// path after it; `None` when it starts outside the crate (another crate, std, a local).
    fn absolute(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut absolute: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => {
                let mut up = module.to_vec();
                up.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|segment| segment == "super") {
                    up.pop()?;
                    rest = &rest[1..];
                }
                up.extend(rest.iter().cloned());
                return Some(up);
            }
            name if self.has_child(module, name) => {
                let mut child = module.to_vec();
                child.push(name.to_owned());
                child
            }
            name => {
                let scope = &self.modules.get(module)?.scope;
                let import = scope.imports.iter().find(|import| import.binding.as_deref() == Some(name))?;
                if depth >= RESOLVE_DEPTH_MAX {
                    return None;
                }
                self.absolute(module, &import.path, depth + 1)?
            }
        };
        absolute.extend(rest.iter().cloned());
        Some(absolute)
    }

    /// The file that defines what the absolute path names: down through child modules, along
    /// `use` re-exports, and otherwise the file of the last module reached.
    fn resolve(&self, absolute: &[String], depth: usize) -> Option<&str> {
        if depth >= RESOLVE_DEPTH_MAX {
            return None;
        }
        let mut module: Vec<String> = Vec::new();
        for (index, segment) in absolute.iter().enumerate() {
            let here = self.modules.get(&module)?;
            if self.has_child(&module, segment) {
                module.push(segment.clone());
                continue;
            }
            if here.scope.items.contains(segment) {
                return Some(&here.file);
            }
            let rest = &absolute[index + 1..];
            let named = here.scope.imports.iter().find(|import| import.binding.as_deref() == Some(segment.as_str()));
            if let Some(import) = named {
                let mut target = self.absolute(&module, &import.path, depth + 1)?;
                target.extend(rest.iter().cloned());
                return self.resolve(&target, depth + 1);
            }
            for glob in here.scope.imports.iter().filter(|import| import.glob) {
                let Some(mut target) = self.absolute(&module, &glob.path, depth + 1) else { continue };
                if let Some(from) = self.modules.get(&target) {
                    let scope = &from.scope;
                    let found = scope.items.contains(segment)
                        || self.has_child(&target, segment)
                        || scope.imports.iter().any(|import| import.binding.as_deref() == Some(segment.as_str()));
                    if found {
                        target.extend(absolute[index..].iter().cloned());
                        return self.resolve(&target, depth + 1);
                    }
                }
            }
            return Some(&here.file);
        }
        self.modules.get(&module).map(|found| found.file.as_str())
    }

    /// The crate's file graph: source file -> target file -> the paths that tie them.
    pub(crate) fn edges(&self, sources_idents: &BTreeMap<String, BTreeSet<String>>) -> Graph {
        let mut graph = Graph::new();
        for (module_path, module) in &self.modules {
            graph.entry(module.file.clone()).or_default();
            let mut named: Vec<(&[String], String)> = Vec::new();
            for import in &module.scope.imports {
                let used = match &import.binding {
                    _ if !import.public => true,
                    Some(binding) => sources_idents.get(&module.file).is_some_and(|idents| idents.contains(binding)),
                    None => false,
                };
                if used {
                    let text = format!("use {}{}", import.path.join("::"), if import.glob { "::*" } else { "" });
                    named.push((&import.path, text));
                }
            }
            for path in &module.scope.paths {
                named.push((&path.path, path.path.join("::")));
            }
            for (path, text) in named {
                let Some(absolute) = self.absolute(module_path, path, 0) else { continue };
                let Some(target) = self.resolve(&absolute, 0) else { continue };
                if target != module.file {
                    let ties = graph.entry(module.file.clone()).or_default().entry(target.to_owned()).or_default();
                    ties.insert(text);
                }
            }
        }
        graph
    }
}

pub(crate) type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The strongly connected sets of more than one file (Tarjan's algorithm), each sorted.
pub(crate) fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let order = self.index.len();
            self.index.insert(node, order);
            self.low.insert(node, order);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flat_map(|targets| targets.keys()) {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next.as_str()]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next.as_str()) {
                    let low = self.low[node].min(self.index[next.as_str()]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut set = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    set.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}

/// Each circle's files and the edges inside it, with the paths behind each edge.
pub(crate) fn describe_circles(graph: &Graph, found: &[Vec<String>]) -> String {
    let mut text = String::new();
    for set in found {
        let _ = writeln!(text, "  circle of {} files: {}", set.len(), set.join(", "));
        for from in set {
            for (to, ties) in graph.get(from).into_iter().flatten() {
                if set.contains(to) {
                    let names: Vec<&str> = ties.iter().map(String::as_str).collect();
                    let _ = writeln!(text, "    {from} -> {to}: {}", names.join(", "));
                }
            }
        }
    }
    text
}

// ---------------------------------------------------------------------------------------------

/// One crate root's verdict: a line of counts, and the circles described (empty when none).
pub(crate) fn check_root(sources: &BTreeMap<String, String>, root: &str) -> (String, String) {
    let tree = CrateTree::build(sources, root).unwrap_or_else(|error| panic!("{error}"));
    let mut idents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in tree.modules.values() {
        if !idents.contains_key(&module.file) {
            let facts = file_facts(&production_tokens(&tokenize(&sources[&module.file])));
            idents.insert(module.file.clone(), facts.idents_outside_use);
        }
    }
    let graph = tree.edges(&idents);
    let edge_count: usize = graph.values().map(BTreeMap::len).sum();
    let found = circles(&graph);
    let mut summary = format!("{} files, {} edges, {} circles", graph.len(), edge_count, found.len());
    if std::env::var_os("RAMPKV_LAYERS_EDGES").is_some() {
        for (from, targets) in &graph {
            let _ = write!(summary, "\n    {from} -> {}", targets.keys().cloned().collect::<Vec<_>>().join(", "));
        }
    }
    (summary, describe_circles(&graph, &found))
}

fn sources_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect()
}

/// The edges of a small crate as "from -> to" lines.
fn edge_lines(files: &[(&str, &str)]) -> Vec<String> {
    let sources = sources_of(files);
    let tree = CrateTree::build(&sources, "src/lib.rs").expect("the crate's modules are found");
    let idents = tree
        .modules
        .values()
        .map(|module| {
            let facts = file_facts(&production_tokens(&tokenize(&sources[&module.file])));
            (module.file.clone(), facts.idents_outside_use)
        })
        .collect();
    let graph = tree.edges(&idents);
    graph.iter().flat_map(|(from, targets)| targets.keys().map(move |to| format!("{from} -> {to}"))).collect()
}

#[test]
fn super_super_self_and_child_paths_resolve_to_files() {
    let lines = edge_lines(&[
        ("src/lib.rs", "pub mod a; pub mod top; pub use top::Top;"),
        ("src/top.rs", "pub struct Top;"),
        ("src/a/mod.rs", "pub mod b; mod inline { pub fn g() { super::b::c::h(); } } pub struct A;"),
        ("src/a/b/mod.rs", "pub mod c; use self::c::H; fn f() -> H { c::h() }"),
        ("src/a/b/c.rs", "pub struct H; pub fn h() -> H { let _ = super::super::A; let _ = crate::Top; H }"),
    ]);
    assert_eq!(
        lines,
        vec![
            "src/a/b/c.rs -> src/a/mod.rs".to_owned(),
            "src/a/b/c.rs -> src/top.rs".to_owned(),
            "src/a/b/mod.rs -> src/a/b/c.rs".to_owned(),
            "src/a/mod.rs -> src/a/b/c.rs".to_owned(),
        ]
    );
}

#[test]
fn a_circle_is_found_and_a_facade_re_export_is_no_edge() {
    let files = [
        ("src/lib.rs", "mod low; mod high; pub use low::Low;"),
        ("src/low.rs", "pub struct Low; pub(crate) use crate::high::High; fn f() -> High { todo!() }"),
        ("src/high.rs", "use crate::Low; pub struct High(Low);"),
    ];
    let sources = sources_of(&files);
    let (_, described) = check_root(&sources, "src/lib.rs");
    assert!(described.contains("src/high.rs -> src/low.rs: use crate::Low"), "{described}");
    assert!(described.contains("src/low.rs -> src/high.rs: use crate::high::High"), "{described}");
    // The same re-export, never used by its own file, ties nothing.
    let unused = [files[0], ("src/low.rs", "pub struct Low; pub(crate) use crate::high::High;"), files[2]];
    assert_eq!(edge_lines(&unused), vec!["src/high.rs -> src/low.rs".to_owned()]);
}
