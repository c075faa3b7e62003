//! Redis's glob-style key patterns (SCAN's MATCH, KEYS), matched as Redis 7's
//! `stringmatchlen` matches them, byte by byte:
//!
//! | pattern | matches |
//! |---|---|
//! | `*` | any run of bytes, the empty one too |
//! | `?` | any one byte |
//! | `[abc]`, `[a-z]` | one byte of the set (a range may be written backwards: `[z-a]`) |
//! | `[^abc]` | one byte not in the set |
//! | `\x` | the byte `x` itself (inside a set too) |
//! | anything else | itself |
//!
//! As in Redis, a `[` without its `]` takes the rest of the pattern as its set, and a `\` that
//! ends the pattern is itself.
//!
//! # Cost
//! A pattern is parsed once ([`Pattern::new`]); matching backtracks only to the last `*`
//! seen, so it takes at most (pattern tokens x key bytes) steps: a hostile pattern such as
//! `*a*a*a*a*b` costs no more than that (Redis bounds its recursion instead).

/// One byte, or the set a `[...]` names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Star,
    AnyByte,
    Byte(u8),
    Set { negated: bool, ranges: Vec<(u8, u8)> },
}

impl Token {
    fn matches(&self, byte: u8) -> bool {
        match self {
            Token::Star => true,
            Token::AnyByte => true,
            Token::Byte(own) => *own == byte,
            Token::Set { negated, ranges } => {
                ranges.iter().any(|(low, high)| (*low..=*high).contains(&byte)) != *negated
            }
        }
    }
}

/// A parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Token>,
}

impl Pattern {
    /// Parses `pattern` (every byte string is a pattern: there is no syntax error).
    pub fn new(pattern: &[u8]) -> Pattern {
        let mut tokens = Vec::new();
        let mut at = 0;
        while at < pattern.len() {
            let (token, next) = match pattern[at] {
                b'*' => (Token::Star, at + 1),
                b'?' => (Token::AnyByte, at + 1),
                b'[' => parse_set(pattern, at + 1),
                b'\\' if at + 1 < pattern.len() => (Token::Byte(pattern[at + 1]), at + 2),
                byte => (Token::Byte(byte), at + 1),
            };
            // `**` is `*`.
            if !(token == Token::Star && tokens.last() == Some(&Token::Star)) {
                tokens.push(token);
            }
            at = next;
        }
        Pattern { tokens }
    }

    /// Whether it matches every key (`*`): a listing need not test each key.
    pub fn matches_everything(&self) -> bool {
        self.tokens == [Token::Star]
    }

    /// Whether `key` matches.
    pub fn matches(&self, key: &[u8]) -> bool {
        let tokens = &self.tokens;
        let (mut token, mut byte) = (0, 0);
        // The last `*` seen, and the key byte it was last tried up to.
        let mut star: Option<(usize, usize)> = None;
        while byte < key.len() {
            match tokens.get(token) {
                Some(Token::Star) => {
                    star = Some((token, byte));
                    token += 1;
                    continue;
                }
                Some(one) if one.matches(key[byte]) => {
                    token += 1;
                    byte += 1;
                    continue;
                }
                _ => {}
            }
            // Mismatch: the last `*` takes one more byte, if there is one.
            let Some((star_token, star_byte)) = star else { return false };
            star = Some((star_token, star_byte + 1));
            token = star_token + 1;
            byte = star_byte + 1;
        }
        tokens[token..].iter().all(|token| *token == Token::Star)
    }
}

/// Parses the set after a `[` at `at`; returns it and where the pattern goes on.
fn parse_set(pattern: &[u8], mut at: usize) -> (Token, usize) {
    let negated = pattern.get(at) == Some(&b'^');
    if negated {
        at += 1;
    }
    let mut ranges = Vec::new();
    while at < pattern.len() {
        let left = pattern.len() - at;
        match pattern[at] {
            b'\\' if left >= 2 => {
                ranges.push((pattern[at + 1], pattern[at + 1]));
                at += 2;
            }
            b']' => return (Token::Set { negated, ranges }, at + 1),
            low if left >= 3 && pattern[at + 1] == b'-' => {
                let high = pattern[at + 2];
                ranges.push((low.min(high), low.max(high)));
                at += 3;
            }
            byte => {
                ranges.push((byte, byte));
                at += 1;
            }
        }
    }
    (Token::Set { negated, ranges }, at) // no `]`: the set ran to the end
}

/// Whether `key` matches `pattern` (parsing it each time: [`Pattern`] for many keys).
pub fn glob_matches(pattern: &[u8], key: &[u8]) -> bool {
    Pattern::new(pattern).matches(key)
}

#[cfg(test)]
mod tests {
    use super::glob_matches as matches;
    use super::Pattern;

    #[test]
    fn stars_and_question_marks() {
        assert!(matches(b"*", b"") && matches(b"*", b"anything"));
        assert!(matches(b"user:*", b"user:") && matches(b"user:*", b"user:42"));
        assert!(!matches(b"user:*", b"users:42"));
        assert!(matches(b"*:42", b"user:42") && !matches(b"*:42", b"user:421"));
        assert!(matches(b"h?llo", b"hello") && matches(b"h?llo", b"hallo") && !matches(b"h?llo", b"hllo"));
        assert!(matches(b"h*llo", b"hllo") && matches(b"h*llo", b"heeeello"));
        assert!(matches(b"a**b", b"ab") && matches(b"*a*b*", b"xxaxxbxx") && !matches(b"*a*b*", b"xxbxxaxx"));
        assert!(matches(b"", b"") && !matches(b"", b"a"));
        assert!(Pattern::new(b"**").matches_everything() && !Pattern::new(b"*a").matches_everything());
    }

    #[test]
    fn sets_ranges_negation_and_escapes() {
        assert!(matches(b"h[ae]llo", b"hello") && matches(b"h[ae]llo", b"hallo") && !matches(b"h[ae]llo", b"hillo"));
        assert!(!matches(b"h[^e]llo", b"hello") && matches(b"h[^e]llo", b"hallo"));
        assert!(matches(b"h[a-b]llo", b"hbllo") && !matches(b"h[a-b]llo", b"hcllo"));
        assert!(matches(b"h[b-a]llo", b"hallo"), "a range written backwards");
        assert!(matches(b"key[0-9]", b"key7") && !matches(b"key[^0-9]", b"key7"));
        assert!(matches(br"h\*llo", b"h*llo") && !matches(br"h\*llo", b"hello"));
        assert!(matches(br"h\?", b"h?") && !matches(br"h\?", b"hx"));
        assert!(matches(br"[\]]", b"]") && matches(br"[\-a]", b"-"));
        assert!(matches(br"a\", br"a\"), "a trailing backslash is itself");
        assert!(matches(b"[abc", b"b") && !matches(b"[abc", b"d"), "an unclosed set runs to the end");
        assert!(!matches(b"[", b"a") && !matches(b"[]", b"a"), "an empty set matches nothing");
        assert!(matches(b"[^]", b"a"), "an empty negated set matches anything");
        assert!(matches(b"[a-]", b"]") && matches(b"[a-]", b"a"), "Redis reads `a-]` as a range to `]`");
        assert!(matches(b"\xff*", b"\xff\x00") && matches(b"[\x80-\xff]", b"\x90"), "bytes, not characters");
    }

    #[test]
    fn a_hostile_pattern_costs_no_more_than_pattern_times_key() {
        let pattern = b"*a*a*a*a*a*a*a*a*a*a*a*a*b".to_vec();
        let key = vec![b'a'; 256];
        let started = std::time::Instant::now();
        assert!(!matches(&pattern, &key));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
