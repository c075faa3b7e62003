//! What one file declares (modules, items, `use` leaves) and the paths its code writes, by
//! module scope (the file's own and each inline `mod x { .. }`).

use std::collections::{BTreeMap, BTreeSet};

use crate::source::{ident, is_punct, production_tokens, tokenize, Token};

/// One leaf of a `use` tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Import {
    /// The path as written, from its first segment (`crate`, `super`, `self`, a name).
    pub(crate) path: Vec<String>,
    /// The name it brings into scope (`None` for a glob or `as _`).
    pub(crate) binding: Option<String>,
    pub(crate) glob: bool,
    /// `pub use`, `pub(crate) use`, ...: a re-export.
    pub(crate) public: bool,
}

/// One path written in code (not in a `use`), from its first segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathRef {
    pub(crate) path: Vec<String>,
}

/// A module's scope inside a file: the file's own module, or an inline `mod x { .. }` in it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scope {
    /// Children declared `mod x;` (in their own file).
    pub(crate) file_children: Vec<String>,
    /// Children declared `mod x { .. }` (path relative to the file's module).
    pub(crate) inline_children: Vec<String>,
    pub(crate) imports: Vec<Import>,
    pub(crate) paths: Vec<PathRef>,
    /// Names of items defined at the scope's top level (fn, struct, enum, trait, ...).
    pub(crate) items: BTreeSet<String>,
}

/// What a file declares and names: its scopes by path relative to the file's module (the
/// file's own module is `[]`), and the identifiers it uses outside `use` statements.
#[derive(Debug, Default)]
pub(crate) struct FileFacts {
    pub(crate) scopes: BTreeMap<Vec<String>, Scope>,
    pub(crate) idents_outside_use: BTreeSet<String>,
}

const ITEM_KEYWORDS: &[&str] = &["fn", "struct", "enum", "trait", "type", "const", "static", "union"];

/// Reads the declarations and paths of one file's production tokens.
pub(crate) fn file_facts(tokens: &[Token]) -> FileFacts {
    let mut facts = FileFacts::default();
    facts.scopes.insert(Vec::new(), Scope::default());
    // Open inline modules: (relative path, brace depth inside their body).
    let mut open: Vec<(Vec<String>, usize)> = vec![(Vec::new(), 0)];
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let (scope_path, scope_depth) = open.last().cloned().expect("the file's scope is never closed");
        let at_top = depth == scope_depth;
        match &tokens[i] {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if open.len() > 1 && depth < scope_depth {
                    open.pop();
                }
                i += 1;
            }
            Token::Ident(word) if word == "use" => {
                let public = use_is_public(tokens, i);
                let mut leaves = Vec::new();
                i = parse_use_tree(tokens, i + 1, Vec::new(), &mut leaves);
                let scope = facts.scopes.get_mut(&scope_path).expect("open scopes are recorded");
                for (path, binding, glob) in leaves {
                    scope.imports.push(Import { path, binding, glob, public });
                }
            }
            Token::Ident(word) if word == "mod" && at_top => {
                let Some(name) = ident(tokens.get(i + 1)).map(str::to_owned) else {
                    i += 1;
                    continue;
                };
                let scope = facts.scopes.get_mut(&scope_path).expect("open scopes are recorded");
                if is_punct(tokens.get(i + 2), '{') {
                    scope.inline_children.push(name.clone());
                    let mut child = scope_path.clone();
                    child.push(name);
                    facts.scopes.insert(child.clone(), Scope::default());
                    depth += 1;
                    open.push((child, depth));
                    i += 3;
                } else {
                    scope.file_children.push(name);
                    i += 2;
                }
            }
            Token::Ident(word) if at_top && (ITEM_KEYWORDS.contains(&word.as_str()) || word == "macro_rules") => {
                let mut name_at = i + 1;
                if is_punct(tokens.get(name_at), '!') || ident(tokens.get(name_at)) == Some("mut") {
                    name_at += 1;
                }
                if let Some(name) = ident(tokens.get(name_at)) {
                    if !ITEM_KEYWORDS.contains(&name) {
                        let scope = facts.scopes.get_mut(&scope_path).expect("open scopes are recorded");
                        scope.items.insert(name.to_owned());
                    }
                }
                i += 1;
            }
            Token::Ident(first) if tokens.get(i + 1) == Some(&Token::PathSep) => {
                let before = if i == 0 { None } else { tokens.get(i - 1) };
                let continues = before == Some(&Token::PathSep) || is_punct(before, '.');
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while tokens.get(j) == Some(&Token::PathSep) {
                    let Some(segment) = ident(tokens.get(j + 1)) else { break };
                    path.push(segment.to_owned());
                    j += 2;
                }
                facts.idents_outside_use.extend(path.iter().cloned());
                if !continues {
                    let scope = facts.scopes.get_mut(&scope_path).expect("open scopes are recorded");
                    scope.paths.push(PathRef { path });
                }
                i = j;
            }
            Token::Ident(word) => {
                facts.idents_outside_use.insert(word.clone());
                i += 1;
            }
            _ => i += 1,
        }
    }
    facts
}

/// Whether the `use` at `tokens[at]` has a visibility (`pub`, `pub(crate)`, `pub(super)`, ...).
fn use_is_public(tokens: &[Token], at: usize) -> bool {
    if at == 0 {
        return false;
    }
    match &tokens[at - 1] {
        Token::Ident(word) => word == "pub",
        Token::Punct(')') => {
            let mut j = at - 1;
            while j > 0 && !is_punct(tokens.get(j), '(') {
                j -= 1;
            }
            j > 0 && ident(tokens.get(j - 1)) == Some("pub")
        }
        _ => false,
    }
}

/// Parses a `use` tree from `tokens[i]`, pushing each leaf as (path, binding, glob) with
/// `prefix` in front. Returns the index after the tree (after the `;` for a whole statement).
fn parse_use_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>, bool)>,
) -> usize {
    let mut path = prefix;
    if tokens.get(i) == Some(&Token::PathSep) {
        path.push("::".to_owned()); // `use ::name`: an external crate, never a local file
        i += 1;
    }
    loop {
        match tokens.get(i) {
            Some(Token::Ident(name)) => {
                path.push(name.clone());
                i += 1;
                if tokens.get(i) == Some(&Token::PathSep) {
                    i += 1;
                    continue;
                }
                let mut binding = Some(name.clone());
                if name == "self" {
                    path.pop();
                    binding = path.last().cloned();
                }
                if ident(tokens.get(i)) == Some("as") {
                    binding = ident(tokens.get(i + 1)).filter(|alias| *alias != "_").map(str::to_owned);
                    i += 2;
                }
                leaves.push((path, binding, false));
                break;
            }
            Some(Token::Punct('*')) => {
                leaves.push((path, None, true));
                i += 1;
                break;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                while i < tokens.len() && !is_punct(tokens.get(i), '}') {
                    let next = parse_use_tree(tokens, i, path.clone(), leaves);
                    i = next.max(i + 1);
                    if is_punct(tokens.get(i), ',') {
                        i += 1;
                    }
                }
                i += 1;
                break;
            }
            _ => break,
        }
    }
    if is_punct(tokens.get(i), ';') {
        i += 1;
    }
    i
}

fn imports_of(source: &str) -> Vec<(String, Option<String>, bool, bool)> {
    let facts = file_facts(&production_tokens(&tokenize(source)));
    facts.scopes[&Vec::new()]
        .imports
        .iter()
        .map(|import| (import.path.join("::"), import.binding.clone(), import.glob, import.public))
        .collect()
}

#[test]
fn nested_use_trees_are_flattened_with_their_bindings() {
    let imports = imports_of("use crate::{a::X, b::{self, Y as Why, z::*}, c::{d::{E}}};\npub(crate) use super::F;");
    assert_eq!(
        imports,
        vec![
            ("crate::a::X".to_owned(), Some("X".to_owned()), false, false),
            ("crate::b".to_owned(), Some("b".to_owned()), false, false),
            ("crate::b::Y".to_owned(), Some("Why".to_owned()), false, false),
            ("crate::b::z".to_owned(), None, true, false),
            ("crate::c::d::E".to_owned(), Some("E".to_owned()), false, false),
            ("super::F".to_owned(), Some("F".to_owned()), false, true),
        ]
    );
}

#[test]
fn comments_strings_and_test_code_name_nothing() {
    let source = r##"
        // use crate::a::X;
        /* use crate::b::Y; /* nested */ */
        /// [`crate::c::Z`]
        const S: &str = "crate::d::W";
        const R: &str = r#"use crate::e::V;"#;
        const C: char = '"';
        fn f<'a>(x: &'a u8) -> &'a u8 { x }
        #[cfg(test)]
        mod tests { use crate::f::U; }
        #[cfg(all(test, loom))]
        fn loom_only() { crate::g::T::new(); }
        #[cfg(not(target_os = "linux"))]
        fn kept() { crate::h::K::new(); }
    "##;
    let facts = file_facts(&production_tokens(&tokenize(source)));
    let top = &facts.scopes[&Vec::new()];
    assert!(top.imports.is_empty(), "{:?}", top.imports);
    let paths: Vec<String> = top.paths.iter().map(|path| path.path.join("::")).collect();
    assert_eq!(paths, vec!["crate::h::K::new".to_owned()]);
    assert!(!facts.scopes.contains_key(&vec!["tests".to_owned()]));
}
