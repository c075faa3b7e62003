//! Every crate's modules form layers that point one way: no file of a crate names a file that,
//! directly or through others, names it back (STYLE.md: "a shared type moves down").
//!
//! # What counts as naming a file
//! The test reads each crate's sources (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs` and the
//! modules they declare) as text; it builds nothing. Production code only: items under a `cfg`
//! that is false without `test` and `loom` (`#[cfg(test)] mod tests { .. }`, `#[cfg(test)] mod
//! tests;`, `#[cfg(all(test, loom))] fn ..`) are dropped, and so is any module named `tests`.
//! Comments, strings and characters are dropped too, so a path in a doc comment is no edge.
//! A file names another file when it holds
//! - a `use` tree leaf (`use crate::{a::X, b::{Y, Z}}`, `use super::super::x`, `use self::a::B`,
//!   `use child::C` for a declared child module), or
//! - a path in code that starts at `crate`, `self`, `super`, a declared child module or a name
//!   a `use` brought in (`crate::a::f()`, `super::X::new()`, `child::g()`, `alias::h()`),
//!
//! that resolves to a module or item of that other file. A path is resolved as rustc does, one
//! segment at a time from the crate root: a child module goes down into its file (`a::b` is
//! `src/a/b.rs` or `src/a/b/mod.rs`; an inline `mod x { .. }` stays in its file); a name a
//! module brings in with `use` (a re-export, as `pub use fabric::FabricError` in a lib.rs) is
//! followed to where it comes from; any other name is an item of the module reached so far. So
//! `crate::FabricError` names `fabric.rs`, not `lib.rs`.
//!
//! A re-export that its own file never mentions again (`pub use stream::HistoryFeed;` in a
//! facade `mod.rs`) is the module's list of names, not a dependency of its code, and ties
//! nothing: those who use the name are tied to where it is defined. A `mod x;` declaration is
//! no edge either (a parent owns its children; what matters is what their code names). Nor is
//! a method call (`store.collect()`): it writes no path, so a room that only calls methods
//! another room defines on a shared type is not tied to it here.
//!
//! When a crate's file graph has a circle, the test prints each strongly connected set of
//! files with the edges inside it and the paths behind each edge, and fails. With
//! `RAMPKV_LAYERS_EDGES=1` it prints every crate's whole file graph too.
//!
//! # Layout
//! - `source`: tokens, and the tokens of a production build (`cfg(test)` and `cfg(loom)` items
//!   dropped).
//! - `facts`: what one file declares and the paths it writes, by module scope.
//! - `tree`: a crate's modules and files, path resolution, the file graph and its circles.
//! - this file: the workspace's crates and the test.

mod facts;
mod source;
mod tree;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tree::check_root;

/// The workspace's member directories, from the root Cargo.toml's `members` list.
fn workspace_members(root: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace's Cargo.toml");
    let members = manifest.split("members").nth(1).expect("a members list");
    let list = &members[..members.find(']').expect("the members list closes")];
    let mut found: Vec<PathBuf> = list.split('"').skip(1).step_by(2).map(|member| root.join(member)).collect();
    found.sort();
    found
}

fn package_name(crate_dir: &Path) -> String {
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("a member's Cargo.toml");
    manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("name = \"").and_then(|rest| rest.strip_suffix('"')))
        .expect("a package name")
        .to_owned()
}

/// Every `.rs` file under `dir`, keyed by its path relative to `base`.
fn read_sources(base: &Path, dir: &Path, sources: &mut BTreeMap<String, String>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a readable source folder")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_sources(base, &path, sources);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let relative = path.strip_prefix(base).expect("under the crate").to_string_lossy().into_owned();
            sources.insert(relative, std::fs::read_to_string(&path).expect("a readable source file"));
        }
    }
}

/// The crate roots of a package: its library, its main binary, its other binaries.
fn crate_roots(sources: &BTreeMap<String, String>) -> Vec<String> {
    let mut roots: Vec<String> = ["src/lib.rs", "src/main.rs"].iter().map(|root| root.to_string()).collect();
    for file in sources.keys() {
        if let Some(rest) = file.strip_prefix("src/bin/") {
            if !rest.contains('/') || rest.ends_with("/main.rs") {
                roots.push(file.clone());
            }
        }
    }
    roots.retain(|root| sources.contains_key(root));
    roots
}

#[test]
fn no_crate_has_an_import_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let members = workspace_members(&workspace);
    assert!(members.len() > 1, "the workspace lists its members");
    let mut failures = String::new();
    for member in members {
        let name = package_name(&member);
        let mut sources = BTreeMap::new();
        read_sources(&member, &member.join("src"), &mut sources);
        for root in crate_roots(&sources) {
            let (summary, described) = check_root(&sources, &root);
            println!("{name} ({root}): {summary}");
            print!("{described}");
            if !described.is_empty() {
                let _ = write!(failures, "{name} ({root}) has import circles:\n{described}");
            }
        }
    }
    assert!(failures.is_empty(), "modules must form layers that point one way:\n{failures}");
}

// ---------------------------------------------------------------------------------------------
