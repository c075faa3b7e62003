//! Rust source as tokens, and the tokens a production build compiles: comments, literals and
//! whitespace are dropped, and so is every item under a `cfg` that is off without `test` and
//! `loom`.

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    Ident(String),
    /// `::`
    PathSep,
    /// `=>` and `->`, kept whole so that their `>` is not taken for a closing angle bracket.
    Arrow,
    Punct(char),
    /// A string, character, byte or number literal: nothing in it is a path.
    Literal,
    Lifetime,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Splits Rust source into tokens, dropping comments (doc comments too), whitespace and the
/// contents of literals.
pub(crate) fn tokenize(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            i = skip_block_comment(&chars, i);
        } else if c == '"' {
            i = skip_quoted(&chars, i + 1, '"');
            tokens.push(Token::Literal);
        } else if c == '\'' {
            if at(i + 1) == '\\' || (at(i + 1) != '\0' && at(i + 2) == '\'') {
                i = skip_quoted(&chars, i + 1, '\'');
                tokens.push(Token::Literal);
            } else {
                i += 1;
                while is_ident_continue(at(i)) {
                    i += 1;
                }
                tokens.push(Token::Lifetime);
            }
        } else if c.is_ascii_digit() {
            while is_ident_continue(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            tokens.push(Token::Literal);
        } else if is_ident_start(c) {
            let start = i;
            while is_ident_continue(at(i)) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            i = lex_after_word(&chars, i, word, &mut tokens);
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token::PathSep);
            i += 2;
        } else if (c == '=' || c == '-') && at(i + 1) == '>' {
            tokens.push(Token::Arrow);
            i += 2;
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// A word may open a literal (`b"..."`, `b'x'`, `r#"..."#`, `br"..."`, `c"..."`) or be a raw
/// identifier (`r#type`); otherwise it is an identifier. Returns where lexing goes on.
fn lex_after_word(chars: &[char], mut i: usize, word: String, tokens: &mut Vec<Token>) -> usize {
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
    let plain_prefix = matches!(word.as_str(), "b" | "c");
    if raw_prefix && (at(i) == '#' || at(i) == '"') {
        let mut hashes = 0;
        while at(i + hashes) == '#' {
            hashes += 1;
        }
        if at(i + hashes) == '"' {
            i += hashes + 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            tokens.push(Token::Literal);
            return i;
        }
        if word == "r" && hashes == 1 && is_ident_start(at(i + 1)) {
            let start = i + 1;
            i = start;
            while is_ident_continue(at(i)) {
                i += 1;
            }
            tokens.push(Token::Ident(format!("r#{}", chars[start..i].iter().collect::<String>())));
            return i;
        }
    }
    if plain_prefix && (at(i) == '"' || (word == "b" && at(i) == '\'')) {
        let quote = at(i);
        i = skip_quoted(chars, i + 1, quote);
        tokens.push(Token::Literal);
        return i;
    }
    tokens.push(Token::Ident(word));
    i
}

/// From just inside a quoted literal, returns the index after its closing quote.
fn skip_quoted(chars: &[char], mut i: usize, quote: char) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// From a `/*`, returns the index after its (nested) closing `*/`.
fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

pub(crate) fn is_punct(token: Option<&Token>, c: char) -> bool {
    token == Some(&Token::Punct(c))
}

pub(crate) fn ident(token: Option<&Token>) -> Option<&str> {
    match token {
        Some(Token::Ident(name)) => Some(name),
        _ => None,
    }
}

/// What a `cfg` predicate is in a production build: `test` and `loom` are off, anything else
/// (features, target) may be either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cfg {
    On,
    Off,
    Either,
}

/// Evaluates the predicate starting at `tokens[*i]`, leaving `*i` after it.
fn eval_cfg(tokens: &[Token], i: &mut usize) -> Cfg {
    let Some(name) = ident(tokens.get(*i)) else {
        *i += 1;
        return Cfg::Either;
    };
    *i += 1;
    if is_punct(tokens.get(*i), '=') {
        *i += 2; // `key = "value"`
        return Cfg::Either;
    }
    if !is_punct(tokens.get(*i), '(') {
        return if name == "test" || name == "loom" { Cfg::Off } else { Cfg::Either };
    }
    *i += 1;
    let mut inner = Vec::new();
    while *i < tokens.len() && !is_punct(tokens.get(*i), ')') {
        inner.push(eval_cfg(tokens, i));
        if is_punct(tokens.get(*i), ',') {
            *i += 1;
        }
    }
    *i += 1;
    match name {
        "not" => match inner.first() {
            Some(Cfg::On) => Cfg::Off,
            Some(Cfg::Off) => Cfg::On,
            _ => Cfg::Either,
        },
        "all" if inner.contains(&Cfg::Off) => Cfg::Off,
        "all" if inner.iter().all(|cfg| *cfg == Cfg::On) => Cfg::On,
        "any" if inner.contains(&Cfg::On) => Cfg::On,
        "any" if inner.iter().all(|cfg| *cfg == Cfg::Off) => Cfg::Off,
        _ => Cfg::Either,
    }
}

/// From an opening bracket at `tokens[i]`, returns the index after its match.
fn skip_group(tokens: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Whether the attribute `#[...]` whose `[` is at `tokens[open]` is a `cfg` that is off in a
/// production build.
fn attribute_is_off(tokens: &[Token], open: usize) -> bool {
    if ident(tokens.get(open + 1)) != Some("cfg") || !is_punct(tokens.get(open + 2), '(') {
        return false;
    }
    let mut i = open + 3;
    eval_cfg(tokens, &mut i) == Cfg::Off
}

/// From the first token of an item, field, arm or statement, returns the index after it.
fn skip_item(tokens: &[Token], mut i: usize) -> usize {
    while is_punct(tokens.get(i), '#') && is_punct(tokens.get(i + 1), '[') {
        i = skip_group(tokens, i + 1);
    }
    let mut angle = 0usize;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('(' | '[') => i = skip_group(tokens, i),
            Token::Punct('{') => return skip_group(tokens, i),
            Token::Punct(')' | ']' | '}') => return i,
            Token::Punct(';') => return i + 1,
            Token::Punct(',') if angle == 0 => return i + 1,
            Token::Punct('<') => {
                angle += 1;
                i += 1;
            }
            Token::Punct('>') => {
                angle = angle.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// The tokens of a production build: items under a `cfg` that is off without `test` and `loom`
/// are dropped, with their attributes. A file that opens with such an inner attribute is
/// dropped whole.
pub(crate) fn production_tokens(tokens: &[Token]) -> Vec<Token> {
    if is_punct(tokens.first(), '#') && is_punct(tokens.get(1), '!') && attribute_is_off(tokens, 2) {
        return Vec::new();
    }
    let mut kept = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if is_punct(tokens.get(i), '#') && is_punct(tokens.get(i + 1), '[') && attribute_is_off(tokens, i + 1) {
            i = skip_item(tokens, i);
        } else {
            kept.push(tokens[i].clone());
            i += 1;
        }
    }
    kept
}
