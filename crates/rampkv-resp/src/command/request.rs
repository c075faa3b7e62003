//! What a parsed command asks the gateway to do ([`Request`]), and the small types its variants
//! carry (expiries, TTL units, INFO sections, how an update is answered).

use crate::codec::{Args, Frame, Protocol};
use crate::keyspace::ScanRequest;

/// How an update's result is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateReply {
    /// The op's integer (INCR's new value, APPEND's new length, SETNX's, EXPIRE's and PERSIST's
    /// 1 or 0).
    Integer,
    /// `+OK` if it wrote, else a null (SET NX, SET XX, SET KEEPTTL).
    OkOrNull,
    /// The value before, or a null (GETSET, GETDEL, SET ... GET, GETEX).
    Old,
}

/// Key-value pairs of a write, values in their stored form.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a command asks the gateway to do.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Request {
    /// Read one key (one `get_all`).
    Get {
        key: Vec<u8>,
    },
    /// Read every key in one read-atomic `get_all`; reply one value or null per key.
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    /// Read every key in one `get_all`; reply how many are present (repeats count each time).
    Exists {
        keys: Vec<Vec<u8>>,
    },
    /// Write one key; `value` is already in its stored form ([`value::encode`]).
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Write every pair in one `put_all`; values in stored form.
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Write one key that expires (SET with EX, PX, EXAT or PXAT; SETEX; PSETEX); `value` in
    /// its stored form. A relative expiry becomes a deadline with the batch's one clock reading.
    SetExpiring {
        key: Vec<u8>,
        value: Vec<u8>,
        expiry: ExpiryArg,
    },
    /// Read one key's time to live (TTL in seconds, PTTL in milliseconds): -2 absent, -1 no
    /// expiry.
    TimeToLive {
        key: Vec<u8>,
        unit: TtlUnit,
    },
    /// Read the keys (to count the present ones), then write a tombstone to each in one
    /// `put_all`.
    Delete {
        keys: Vec<Vec<u8>>,
    },
    /// UNLINK: what DEL does (Redis frees an unlinked value in the background; rampkv writes a
    /// tombstone either way). Its own variant only so that errors can name it.
    Unlink {
        keys: Vec<Vec<u8>>,
    },
    /// A single-key conditional write (INCR, SETNX, SET NX|XX|GET|KEEPTTL, GETSET, GETDEL,
    /// APPEND, EXPIRE & co., PERSIST, GETEX): one UPDATE of `key` (values in `op` as the client gave them: the op stores them in the
    /// stored form); `name` for errors, `reply` how its result is answered.
    Update {
        name: &'static str,
        key: Vec<u8>,
        op: rampkv_core::wire::UpdateOp,
        reply: UpdateReply,
    },
    /// Read one key; reply the length of its value (0 if absent).
    Strlen {
        key: Vec<u8>,
    },
    /// Read one key; reply `string`, or `none` if absent (every rampkv value is a string).
    Type {
        key: Vec<u8>,
    },
    /// Start queueing the connection's commands (`gateway::multi`).
    Multi,
    /// Run the queued commands as one transaction.
    Exec,
    /// An EXEC refused before it runs (its arity, permissions): reply this EXECABORT and end
    /// the transaction, as Redis does.
    ExecRefused(Frame),
    /// Drop the queued commands.
    Discard,
    /// WATCH: refused (optimistic check-and-set needs a transaction that reads and writes);
    /// the gateway answers it, inside MULTI with Redis's own error.
    Watch,
    /// Log in: `AUTH password` (user None: `default`) or `AUTH user password`.
    Auth {
        user: Option<Vec<u8>>,
        password: Vec<u8>,
    },
    /// Log in first if `auth` (user, password) is given, then switch protocol (None: keep it) and
    /// optionally name the connection; reply the greeting.
    Hello {
        protocol: Option<Protocol>,
        auth: Option<(Vec<u8>, Vec<u8>)>,
        name: Option<Vec<u8>>,
    },
    /// Reply the INFO text of these sections.
    Info(InfoSections),
    /// One SCAN step: a page (or a few) of the key listing from the cursor.
    Scan(ScanRequest),
    /// KEYS: every live key matching the pattern (the whole listing).
    Keys {
        pattern: Vec<u8>,
    },
    /// DBSIZE: the count of live keys.
    DbSize,
    /// Name the connection (empty: remove the name).
    ClientSetName(Vec<u8>),
    ClientGetName,
    ClientId,
    /// Reply the name of the user the connection is logged in as.
    AclWhoAmI,
    /// Reply OK, then close the connection.
    Quit,
    /// Reply this at once.
    Reply(Frame),
}

/// When a key written by SET EX/PX/EXAT/PXAT, SETEX or PSETEX expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryArg {
    /// This many milliseconds after the writer's clock reading (one per batch or transaction:
    /// every key of it from one instant, as Redis's `commandTimeSnapshot`).
    AfterMs(u64),
    /// At this many milliseconds since the Unix epoch.
    AtMs(u64),
}

impl ExpiryArg {
    /// The deadline in ms since the Unix epoch, given the writer's clock reading `now_ms`; a
    /// deadline beyond the largest a version carries is the largest (Redis refuses an overflow
    /// of `i64` when it parses, which `strings::parse_set_expiry` does too).
    pub fn deadline_ms(self, now_ms: u64) -> u64 {
        let deadline = match self {
            ExpiryArg::AfterMs(after_ms) => now_ms.saturating_add(after_ms),
            ExpiryArg::AtMs(at_ms) => at_ms,
        };
        deadline.min(rampkv_core::types::Expiry::DEADLINE_MS_MAX)
    }
}

/// The unit TTL and PTTL answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlUnit {
    Seconds,
    Milliseconds,
}

/// One section of INFO's text, in Redis's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoSection {
    Server,
    Clients,
    Memory,
    Persistence,
    Stats,
    Replication,
    Cluster,
    Keyspace,
}

impl InfoSection {
    /// Every section the gateway writes, in the order Redis writes them.
    pub const ALL: [InfoSection; 8] = [
        InfoSection::Server,
        InfoSection::Clients,
        InfoSection::Memory,
        InfoSection::Persistence,
        InfoSection::Stats,
        InfoSection::Replication,
        InfoSection::Cluster,
        InfoSection::Keyspace,
    ];

    /// Its name as INFO takes it (lower case) and as its header shows it (`# Server`).
    pub fn name(self) -> &'static str {
        match self {
            InfoSection::Server => "server",
            InfoSection::Clients => "clients",
            InfoSection::Memory => "memory",
            InfoSection::Persistence => "persistence",
            InfoSection::Stats => "stats",
            InfoSection::Replication => "replication",
            InfoSection::Cluster => "cluster",
            InfoSection::Keyspace => "keyspace",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The sections an INFO request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoSections(u16);

impl InfoSections {
    /// `INFO`, `INFO default`, `INFO all` and `INFO everything`: every section the gateway has.
    /// (Redis's `all` adds commandstats and latencystats, and `everything` modules: the gateway
    /// keeps none of those.)
    pub const DEFAULT: InfoSections = InfoSections((1 << InfoSection::ALL.len()) - 1);

    /// `INFO [section ...]` as Redis 7 reads it: names in any letter case, several at once,
    /// unknown ones ignored (so that `INFO nosuch` is an empty text, as in Redis).
    pub fn parse(args: &Args<'_>) -> InfoSections {
        if args.len() == 1 {
            return InfoSections::DEFAULT;
        }
        let mut wanted = 0;
        for name in args.iter_from(1) {
            let everything = [&b"default"[..], b"all", b"everything"];
            if everything.iter().any(|group| group.eq_ignore_ascii_case(name)) {
                wanted |= InfoSections::DEFAULT.0;
            }
            for section in InfoSection::ALL {
                if section.name().as_bytes().eq_ignore_ascii_case(name) {
                    wanted |= section.bit();
                }
            }
        }
        InfoSections(wanted)
    }

    pub fn contains(self, section: InfoSection) -> bool {
        self.0 & section.bit() != 0
    }
}
