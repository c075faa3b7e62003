//! SCAN, KEYS, DBSIZE and INFO's keyspace section: the servers' key listing and count, run on
//! the connection's session as any transaction (so a failover retries them, and a server down
//! answers `-CLUSTERDOWN` for its partitions).
//!
//! # Contract
//! - **SCAN** asks pages from the cursor on (COUNT keys, the hint, clamped to
//!   `LIST_PAGE_KEYS_MAX`), partition after partition, filters them by MATCH and TYPE, and
//!   answers once it has COUNT keys or has asked [`SCAN_PAGES_PER_COMMAND_MAX`] pages, with the
//!   cursor of the next page ([`crate::keyspace`]: partition index and hash position in one
//!   number); `0` comes back after the last partition. It never answers with a cursor that
//!   would read as `0` before the end: it asks the next page instead.
//!   Every key live for the whole scan is returned at least once (`storage::listing`, and
//!   `rampkv_core::protocol::keyspace` for the client's checks); a key may come twice.
//! - **KEYS** runs the whole listing, page after page, and answers the matching keys, at most
//!   [`KEYS_REPLY_KEYS_MAX`] of them (past that: an error saying to use SCAN).
//! - **DBSIZE** and INFO's `db0:keys=` line: the sum of the servers' counts, exact once writes
//!   stop. INFO answers without the line if the count fails (INFO must work while servers do
//!   not), and inside MULTI (the queue runs no count).

use rampkv_core::limits::LIST_PAGE_KEYS_MAX;
use rampkv_core::pattern::Pattern;
use rampkv_core::wire::KeyPage;

use super::event_loop::EventLoop;
use super::input::TxnInput;
use super::state::{Listing, Mode, Pending};
use crate::codec::{self, Frame};
use crate::command::InfoSections;
use crate::keyspace::{ScanCursor, ScanRequest};

/// Most keys KEYS answers; past it, the command fails and says to use SCAN (the reply is held
/// in the gateway until the listing ends).
pub const KEYS_REPLY_KEYS_MAX: usize = 1 << 20;

/// Most pages one SCAN asks while it has fewer keys than COUNT (sparse partitions, MATCH):
/// bounds the command's latency; past it, it answers what it has, maybe nothing, as Redis may.
pub const SCAN_PAGES_PER_COMMAND_MAX: usize = 16;

impl EventLoop {
    /// SCAN: the page the cursor names.
    pub(super) fn begin_scan(&mut self, slot: usize, request: ScanRequest) {
        let cursor = match ScanCursor::decode(request.cursor, self.cluster.partition_count()) {
            Ok(cursor) => cursor,
            Err(reply) => return self.reply(slot, &reply),
        };
        let listing = Listing {
            mode: Mode::Scan,
            partition: cursor.partition,
            after: cursor.after,
            keys_max: request.count.clamp(1, LIST_PAGE_KEYS_MAX),
            pattern: request.pattern.as_deref().map(Pattern::new).filter(|pattern| !pattern.matches_everything()),
            type_matches: request.type_matches,
            found: Vec::new(),
            pages: 1,
        };
        self.begin_transaction(slot, listing.input(), Pending::Listing(Box::new(listing)));
    }

    /// KEYS: the whole listing.
    pub(super) fn begin_keys(&mut self, slot: usize, pattern: &[u8]) {
        let listing = Listing {
            mode: Mode::Keys,
            partition: 0,
            after: None,
            keys_max: LIST_PAGE_KEYS_MAX,
            pattern: Some(Pattern::new(pattern)).filter(|pattern| !pattern.matches_everything()),
            type_matches: true,
            found: Vec::new(),
            pages: 1,
        };
        self.begin_transaction(slot, listing.input(), Pending::Listing(Box::new(listing)));
    }

    /// DBSIZE, or INFO with its keyspace section: a count of live keys first.
    pub(super) fn begin_count(&mut self, slot: usize, info: Option<InfoSections>) {
        let pending = match info {
            Some(sections) => Pending::Info(sections),
            None => Pending::DbSize,
        };
        self.begin_transaction(slot, TxnInput::Count, pending);
    }

    /// INFO's text, with the key count if it was taken.
    pub(super) fn answer_info(&mut self, slot: usize, sections: InfoSections, keys: Option<u64>) {
        let text = self.info_text(sections, keys);
        self.reply(slot, &Frame::Bulk(text));
        self.enqueue(slot);
    }

    /// A page of a SCAN or KEYS arrived: answer, or ask the next page.
    pub(super) fn listed_page(&mut self, slot: usize, mut listing: Box<Listing>, page: KeyPage) {
        if listing.type_matches {
            let pattern = listing.pattern.as_ref();
            let matching = page.keys.into_iter().filter(|key| pattern.is_none_or(|pattern| pattern.matches(key)));
            listing.found.extend(matching);
        }
        if listing.mode == Mode::Keys && listing.found.len() > KEYS_REPLY_KEYS_MAX {
            let message = format!("ERR rampkv: KEYS would answer more than {KEYS_REPLY_KEYS_MAX} keys; use SCAN");
            self.reply(slot, &Frame::error(message));
            return self.enqueue(slot);
        }
        // Where the next page starts, and the cursor that names it (None: it would read as 0).
        let (next_cursor, done) = match page.resume.filter(|resume| *resume != u64::MAX) {
            Some(resume) => {
                listing.after = Some(resume);
                (ScanCursor::encode(listing.partition, resume), false)
            }
            None => {
                listing.partition += 1;
                listing.after = None;
                let done = listing.partition >= self.cluster.partition_count();
                (ScanCursor::of_partition_start(listing.partition), done)
            }
        };
        let answer_now = match listing.mode {
            Mode::Scan => {
                let enough = listing.found.len() >= listing.keys_max || listing.pages >= SCAN_PAGES_PER_COMMAND_MAX;
                done || (next_cursor.is_some() && enough)
            }
            Mode::Keys => done,
        };
        if !answer_now {
            listing.pages += 1;
            let input = listing.input();
            self.begin_transaction(slot, input, Pending::Listing(listing));
            return self.enqueue(slot);
        }
        let cursor = if done { 0 } else { next_cursor.unwrap_or(0) };
        self.append(slot, |out, _| match listing.mode {
            Mode::Scan => {
                codec::write_array_header(out, 2);
                codec::write_bulk(out, cursor.to_string().as_bytes());
                write_keys(out, &listing.found);
            }
            Mode::Keys => write_keys(out, &listing.found),
        });
        self.enqueue(slot);
    }
}

fn write_keys(out: &mut Vec<u8>, keys: &[Vec<u8>]) {
    codec::write_array_header(out, keys.len());
    for key in keys {
        codec::write_bulk(out, key);
    }
}
