//! Who may use the gateway: Redis's `requirepass` and a subset of its ACL file.
//!
//! # Model (Redis 7's, narrowed)
//! A gateway has users. The user `default` always exists; without `--requirepass` or
//! `--aclfile` it is `on nopass` with every permission, and every connection starts logged in as
//! it (an open gateway, as Redis is by default). `--requirepass PASSWORD` gives `default` that
//! password: connections then start unauthenticated, and only `AUTH`, `HELLO` (with its `AUTH`
//! option) and `QUIT` run until `AUTH [user] password` or `HELLO 3 AUTH user password`
//! succeeds; everything else gets `-NOAUTH Authentication required.` Failed attempts get
//! `-WRONGPASS invalid username-password pair or user is disabled.` and leave the connection as
//! it was. Unknown commands and wrong arities are answered before the login check, as Redis 7.0
//! does (they reveal only which commands exist).
//!
//! # ACL file (`--aclfile`): the subset understood
//! One user per line, `user <name> <rule> <rule> ...`, words separated by blanks; blank lines
//! are skipped; no quoting and no comments (Redis's format has neither). A user not in the file
//! does not exist, except `default`, which is `on nopass ~* &* +@all` unless the file describes
//! it (Redis's rule). Rules, applied left to right from "off, no passwords, no permissions":
//!
//! | rule | meaning |
//! |---|---|
//! | `on` / `off` | the user may / may not log in |
//! | `>password` / `<password` | add / remove a password |
//! | `#<sha256>` / `!<sha256>` | add / remove a password given as the SHA-256 of it (64 lower-case hex digits): the file then holds no password in clear |
//! | `nopass` | any password logs the user in (and its passwords are forgotten) |
//! | `resetpass` | no passwords, and not `nopass` |
//! | `~*`, `allkeys` / `resetkeys` | may / may not touch every key |
//! | `+@all`, `allcommands` / `-@all`, `nocommands` | may / may not run every command |
//! | `&*`, `allchannels`, `resetchannels` | accepted and ignored: the gateway has no channels |
//! | `reset` | back to "off, no passwords, no permissions" |
//!
//! Anything else (`+get`, `-@dangerous`, `~user:*`, selectors, ...) is refused with an error
//! naming the rule, the user and the line, rather than granted silently: **permissions here are
//! all or nothing**, per user, for commands and for keys. A user with every command but no keys
//! runs PING, INFO, CLIENT ...; commands with keys get `-NOPERM this user has no permissions to
//! access one of the keys used as arguments`; a user without commands gets `-NOPERM this user
//! has no permissions to run the 'get' command` for everything but AUTH, HELLO and QUIT.
//!
//! # Comparing passwords
//! As in Redis, passwords are kept only as SHA-256 digests; an attempt is hashed and compared
//! with every stored digest of the user, each comparison in constant time (`subtle`), so the time
//! an attempt takes does not depend on how much of it matches. Which user names exist can be
//! learned from timing (a map lookup, as in Redis): user names are not secrets. There is no limit
//! on attempts (Redis has none either): use long random passwords.

use std::collections::HashMap;
use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::codec::Frame;

/// The user every connection is, before any AUTH, and whom `AUTH password` logs in.
pub const DEFAULT_USER: &str = "default";

/// Redis's reply to a command run before authenticating.
pub const NOAUTH_REPLY: &str = "NOAUTH Authentication required.";

/// Redis's reply to a failed AUTH (or HELLO ... AUTH): the same whatever was wrong.
pub const WRONGPASS_REPLY: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Redis 7.0's reply to HELLO without AUTH from a connection that has not authenticated.
pub const HELLO_NOAUTH_REPLY: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                                      the HELLO AUTH <user> <pass> option can be used to authenticate the client and \
                                      select the RESP protocol version at the same time";

/// Redis's reply to `AUTH password` when the default user has no password.
pub const AUTH_WITHOUT_PASSWORD_REPLY: &str = "ERR AUTH <password> called without any password configured for the \
                                               default user. Are you sure your configuration is correct?";

/// Redis's reply to a command with keys from a user who may not touch keys.
pub const NOPERM_KEYS_REPLY: &str = "NOPERM this user has no permissions to access one of the keys used as arguments";

/// Most users an ACL file may describe (a bound on start-up work, far beyond any real file).
pub const ACL_USERS_MAX: usize = 10_000;

/// Largest ACL file read.
pub const ACL_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Why an ACL file was refused (the gateway does not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AclError {
    #[error("cannot read ACL file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("ACL file {path} is larger than {ACL_FILE_BYTES_MAX} bytes")]
    TooLarge { path: String },
    #[error("ACL file line {line}: should start with the user keyword and a user name")]
    NotAUserLine { line: usize },
    #[error("ACL file line {line}: user '{user}' is described twice (first on line {first})")]
    DuplicateUser { line: usize, user: String, first: usize },
    #[error(
        "ACL file line {line}: rule '{rule}' for user '{user}' is not supported: rampkv's ACLs grant all commands or \
         none and all keys or none (see docs/resp.md)"
    )]
    UnsupportedRule { line: usize, user: String, rule: String },
    #[error(
        "ACL file line {line}: the password hash in '{rule}' must be exactly 64 lower-case hexadecimal characters"
    )]
    BadPasswordHash { line: usize, rule: String },
    #[error("ACL file line {line}: more than {ACL_USERS_MAX} users")]
    TooManyUsers { line: usize },
    #[error("ACL file {path}: {source}")]
    InFile { path: String, source: Box<AclError> },
}

type PasswordDigest = [u8; 32];

fn digest(password: &[u8]) -> PasswordDigest {
    Sha256::digest(password).into()
}

/// One user: whether it may log in, how, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
struct User {
    name: String,
    enabled: bool,
    /// Any password logs this user in.
    nopass: bool,
    passwords: Vec<PasswordDigest>,
    all_commands: bool,
    all_keys: bool,
}

impl User {
    /// Redis's new user: off, no passwords, no permissions.
    fn new(name: &str) -> User {
        User {
            name: name.to_owned(),
            enabled: false,
            nopass: false,
            passwords: Vec::new(),
            all_commands: false,
            all_keys: false,
        }
    }

    /// Redis's default user when nothing configures it.
    fn open_default() -> User {
        User { enabled: true, nopass: true, all_commands: true, all_keys: true, ..User::new(DEFAULT_USER) }
    }

    fn accepts(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let attempt = digest(password);
        // Every stored digest is compared, in constant time each: no early exit on a match.
        let mut matched = subtle::Choice::from(0);
        for stored in &self.passwords {
            matched |= stored.ct_eq(&attempt);
        }
        matched.into()
    }

    /// Applies one ACL rule (line `line` of the file); an error for a rule outside the subset.
    fn apply(&mut self, rule: &str, line: usize) -> Result<(), AclError> {
        let unsupported = || AclError::UnsupportedRule { line, user: self.name.clone(), rule: rule.to_owned() };
        match rule {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "~*" | "allkeys" => self.all_keys = true,
            "resetkeys" => self.all_keys = false,
            "+@all" | "allcommands" => self.all_commands = true,
            "-@all" | "nocommands" => self.all_commands = false,
            "&*" | "allchannels" | "resetchannels" => {}
            "reset" => *self = User::new(&self.name),
            _ => {
                if let Some(password) = rule.strip_prefix('>') {
                    self.add_password(digest(password.as_bytes()));
                } else if let Some(password) = rule.strip_prefix('<') {
                    let removed = digest(password.as_bytes());
                    self.passwords.retain(|stored| *stored != removed);
                } else if let Some(hex) = rule.strip_prefix('#') {
                    self.add_password(
                        parse_digest(hex).ok_or_else(|| AclError::BadPasswordHash { line, rule: rule.to_owned() })?,
                    );
                } else if let Some(hex) = rule.strip_prefix('!') {
                    let removed =
                        parse_digest(hex).ok_or_else(|| AclError::BadPasswordHash { line, rule: rule.to_owned() })?;
                    self.passwords.retain(|stored| *stored != removed);
                } else {
                    return Err(unsupported());
                }
            }
        }
        Ok(())
    }

    fn add_password(&mut self, password: PasswordDigest) {
        self.nopass = false;
        if !self.passwords.contains(&password) {
            self.passwords.push(password);
        }
    }
}

/// 64 lower-case hex digits (Redis accepts no other form).
fn parse_digest(hex: &str) -> Option<PasswordDigest> {
    if hex.len() != 64 || !hex.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (index, pair) in hex.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[index] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// A user of [`Users`], by position.
pub type UserId = usize;

/// The users of a gateway. Immutable once built (no `ACL SETUSER`): a connection caches its
/// user's [`Permissions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Users {
    users: Vec<User>,
    by_name: HashMap<String, UserId>,
}

impl Default for Users {
    fn default() -> Self {
        Users::open()
    }
}

impl Users {
    /// Only `default`, `on nopass` with every permission: no authentication (Redis's default).
    pub fn open() -> Users {
        Users::from_list(vec![User::open_default()])
    }

    /// `requirepass`: `default` needs `password`.
    pub fn with_default_password(password: &[u8]) -> Users {
        let mut default = User::open_default();
        default.add_password(digest(password));
        Users::from_list(vec![default])
    }

    fn from_list(users: Vec<User>) -> Users {
        let by_name = users.iter().enumerate().map(|(id, user)| (user.name.clone(), id)).collect();
        Users { users, by_name }
    }

    /// Parses the text of an ACL file (the subset in the module docs).
    pub fn from_acl(text: &str) -> Result<Users, AclError> {
        let mut users: Vec<User> = Vec::new();
        let mut first_line: HashMap<String, usize> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let mut words = line.split_ascii_whitespace();
            let Some(keyword) = words.next() else {
                continue;
            };
            let (Some(name), "user") = (words.next(), keyword) else {
                return Err(AclError::NotAUserLine { line: line_number });
            };
            if let Some(&first) = first_line.get(name) {
                return Err(AclError::DuplicateUser { line: line_number, user: name.to_owned(), first });
            }
            if users.len() == ACL_USERS_MAX {
                return Err(AclError::TooManyUsers { line: line_number });
            }
            let mut user = User::new(name);
            for rule in words {
                user.apply(rule, line_number)?;
            }
            first_line.insert(name.to_owned(), line_number);
            users.push(user);
        }
        if !first_line.contains_key(DEFAULT_USER) {
            users.push(User::open_default());
        }
        Ok(Users::from_list(users))
    }

    /// Reads and parses an ACL file.
    pub fn from_acl_file(path: &Path) -> Result<Users, AclError> {
        let shown = path.display().to_string();
        let read_error = |source| AclError::Read { path: shown.clone(), source };
        let length = std::fs::metadata(path).map_err(read_error)?.len();
        if length > ACL_FILE_BYTES_MAX {
            return Err(AclError::TooLarge { path: shown });
        }
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        Users::from_acl(&text).map_err(|source| AclError::InFile { path: shown, source: Box::new(source) })
    }

    /// The user `username` if `password` logs it in (an enabled user, and a password of its or
    /// `nopass`); None otherwise, whatever the reason (Redis answers all alike).
    pub fn authenticate(&self, username: &[u8], password: &[u8]) -> Option<UserId> {
        let id = *std::str::from_utf8(username).ok().and_then(|name| self.by_name.get(name))?;
        self.users[id].accepts(password).then_some(id)
    }

    /// The user a new connection is: `default` when it may log in without a password, else
    /// nobody (the connection must authenticate).
    pub fn initial_user(&self) -> Option<UserId> {
        let id = self.by_name[DEFAULT_USER];
        let default = &self.users[id];
        (default.enabled && default.nopass).then_some(id)
    }

    /// Whether anyone who can connect gets in without a password (`default` is `on nopass`):
    /// what Redis's protected mode guards against on addresses other than loopback.
    pub fn open_to_anyone(&self) -> bool {
        self.initial_user().is_some()
    }

    /// Whether `AUTH password` (the one-argument form) makes sense: `default` has a password
    /// or is disabled. Redis refuses the form with an error otherwise.
    pub fn default_has_password(&self) -> bool {
        !self.users[self.by_name[DEFAULT_USER]].nopass
    }

    /// What a connection logged in as `user` (None: not yet) may do.
    pub fn permissions(&self, user: Option<UserId>) -> Permissions {
        match user.and_then(|id| self.users.get(id)) {
            None => Permissions::UNAUTHENTICATED,
            Some(user) => Permissions { authenticated: true, all_commands: user.all_commands, all_keys: user.all_keys },
        }
    }

    /// The name of `user`.
    pub fn name(&self, user: UserId) -> &str {
        &self.users[user].name
    }
}

/// What one connection may run, checked before a command is translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions {
    authenticated: bool,
    all_commands: bool,
    all_keys: bool,
}

impl Permissions {
    /// Logged in with every permission (also: a gateway without passwords).
    pub const ALL: Permissions = Permissions { authenticated: true, all_commands: true, all_keys: true };

    /// Not logged in: only the commands flagged `no_auth` run.
    pub const UNAUTHENTICATED: Permissions = Permissions { authenticated: false, all_commands: false, all_keys: false };

    /// Whether the connection has logged in (or needed not).
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The error to answer instead of running command `name` (Redis's full name, `client|id`),
    /// or None if it may run. `no_auth`: the command runs before authentication (AUTH, HELLO,
    /// QUIT); `touches_keys`: it names keys.
    pub fn refusal(&self, name: &str, no_auth: bool, touches_keys: bool) -> Option<Frame> {
        if no_auth {
            return None;
        }
        if !self.authenticated {
            return Some(Frame::error(NOAUTH_REPLY));
        }
        if !self.all_commands {
            return Some(Frame::error(format!("NOPERM this user has no permissions to run the '{name}' command")));
        }
        if touches_keys && !self.all_keys {
            return Some(Frame::error(NOPERM_KEYS_REPLY));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &str = "user default on >secret ~* &* +@all\n\
                       \n\
                       user alice on >apw ~* &* +@all\n\
                       user bob off >bpw ~* +@all\n\
                       user carol on nopass\n\
                       user dave on >dpw +@all\n\
                       user erin on #2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b allkeys allcommands\n";

    #[test]
    fn requirepass_protects_the_default_user_only_with_that_password() {
        let users = Users::with_default_password(b"secret");
        assert_eq!(users.initial_user(), None);
        assert!(!users.open_to_anyone() && users.default_has_password());
        let default = users.authenticate(b"default", b"secret").unwrap();
        assert_eq!(users.name(default), "default");
        assert_eq!(users.permissions(Some(default)), Permissions::ALL);
        for (user, password) in [(&b"default"[..], &b"Secret"[..]), (b"default", b""), (b"nobody", b"secret")] {
            assert_eq!(users.authenticate(user, password), None);
        }
        assert_eq!(users.permissions(None), Permissions::UNAUTHENTICATED);
    }

    #[test]
    fn an_open_gateway_logs_everyone_in_as_default() {
        let users = Users::open();
        let default = users.initial_user().unwrap();
        assert!(users.open_to_anyone() && !users.default_has_password());
        assert_eq!(users.authenticate(b"default", b"anything"), Some(default));
        assert_eq!(users.permissions(Some(default)), Permissions::ALL);
    }

    #[test]
    fn acl_users_log_in_as_redis_users_do() {
        let users = Users::from_acl(ACL).unwrap();
        assert_eq!(users.initial_user(), None);
        assert!(users.authenticate(b"alice", b"apw").is_some());
        assert!(users.authenticate(b"alice", b"secret").is_none(), "passwords are per user");
        assert!(users.authenticate(b"bob", b"bpw").is_none(), "off: disabled");
        let carol = users.authenticate(b"carol", b"whatever").unwrap();
        assert!(users.authenticate(b"erin", b"secret").is_some(), "#<sha256 of 'secret'>");

        let run = |user, name, keys| users.permissions(Some(user)).refusal(name, false, keys);
        assert_eq!(
            run(carol, "get", true),
            Some(Frame::error("NOPERM this user has no permissions to run the 'get' command"))
        );
        assert_eq!(users.permissions(Some(carol)).refusal("hello", true, false), None, "no_auth commands run");
        let dave = users.authenticate(b"dave", b"dpw").unwrap();
        assert_eq!(run(dave, "ping", false), None);
        assert_eq!(run(dave, "mget", true), Some(Frame::error(NOPERM_KEYS_REPLY)));
        assert_eq!(Permissions::UNAUTHENTICATED.refusal("client|id", false, false), Some(Frame::error(NOAUTH_REPLY)));
    }

    #[test]
    fn a_file_without_default_leaves_default_open_as_redis_does() {
        let users = Users::from_acl("user alice on >apw allkeys allcommands\n").unwrap();
        assert!(users.open_to_anyone());
        let users = Users::from_acl("user default off\n").unwrap();
        assert!(!users.open_to_anyone() && users.default_has_password());
        assert_eq!(users.authenticate(b"default", b""), None);
    }

    #[test]
    fn rules_apply_left_to_right() {
        let users = Users::from_acl("user u on >a >b <a nopass >c resetpass >d reset on >e allkeys\n").unwrap();
        assert!(users.authenticate(b"u", b"e").is_some());
        for old in ["a", "b", "c", "d", ""] {
            assert!(users.authenticate(b"u", old.as_bytes()).is_none(), "{old}");
        }
        let u = users.authenticate(b"u", b"e").unwrap();
        assert_eq!(
            users.permissions(Some(u)).refusal("ping", false, false),
            Some(Frame::error("NOPERM this user has no permissions to run the 'ping' command")),
            "reset dropped the permissions too"
        );
    }

    #[test]
    fn rules_outside_the_subset_and_malformed_lines_are_refused_with_their_place() {
        let cases = [
            ("user a on +get", "line 1: rule '+get' for user 'a' is not supported"),
            ("\nuser a on ~user:* +@all", "line 2: rule '~user:*'"),
            ("user a -@dangerous", "rule '-@dangerous'"),
            ("user a #abc", "line 1: the password hash in '#abc' must be exactly 64"),
            (&format!("user a #{}", "A".repeat(64)), "must be exactly 64 lower-case"),
            ("usr a on", "line 1: should start with the user keyword"),
            ("user", "line 1: should start with the user keyword"),
            ("user a on\nuser a off", "line 2: user 'a' is described twice (first on line 1)"),
        ];
        for (text, expected) in cases {
            let message = Users::from_acl(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn an_acl_file_error_names_the_file() {
        let directory = std::env::temp_dir().join(format!("rampkv-acl-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("users.acl");
        std::fs::write(&path, "user default on >pw allkeys allcommands\nuser x +set\n").unwrap();
        let bad = Users::from_acl_file(&path).unwrap_err().to_string();
        std::fs::write(&path, ACL).unwrap();
        let good = Users::from_acl_file(&path);
        std::fs::remove_dir_all(&directory).unwrap();
        assert!(bad.contains("users.acl") && bad.contains("line 2: rule '+set'"), "{bad}");
        assert_eq!(good.unwrap(), Users::from_acl(ACL).unwrap());
        let missing = Users::from_acl_file(Path::new("/nonexistent/users.acl")).unwrap_err().to_string();
        assert!(missing.contains("cannot read ACL file /nonexistent/users.acl"), "{missing}");
    }
}
