//! Fuzzing of the two decoders that take bytes from anyone who can connect: the binary frame
//! decoder (`FrameHeader::split`, `Request::decode`, `Response::decode`, `AuthFrame::decode`: the
//! authentication step's frames, which anyone reaches before authenticating) and the RESP request
//! parser with the command table behind it (`RequestParser`, `parse_request`).
//!
//! A seeded, mutation-based fuzzer (cargo-fuzz needs a nightly toolchain; this runs in the
//! ordinary test command). Each case is arbitrary bytes, or a valid input (frames of every
//! kind, RESP requests of every command, pipelines of them) put through 1 to 8 mutations: bit
//! flips, interesting bytes and integers (little-endian for frames, decimal for RESP lengths),
//! inserted, deleted, duplicated and spliced ranges, dictionary tokens, truncation. The
//! properties checked on every case:
//! - no panic;
//! - a decoded message encodes and decodes back to itself (the decoders accept nothing the
//!   encoders cannot express);
//! - the parser consumes at least one byte and never more than it was given, and never returns
//!   more arguments than its limits allow;
//! - **memory grows with the bytes given, never with a declared length**: the bytes allocated
//!   while decoding one input stay under [`ALLOCATION_FACTOR`] times its length plus
//!   [`ALLOCATION_SLACK_BYTES`] (a 17-byte frame declaring 20 MiB, say, gets a few hundred
//!   bytes), measured by a counting global allocator (`stats_alloc`).
//!
//! Budget: `RAMPKV_FUZZ_SECONDS` per target (default 2, as part of the test command), or exactly
//! `RAMPKV_FUZZ_CASES` cases. Every run prints its seed and counts; `RAMPKV_FUZZ_SEED=S` replays
//! a run, `RAMPKV_FUZZ_CASE=N` only its case N (a failure prints both and writes the input to a
//! file). The longer runs recorded in docs/security.md used `RAMPKV_FUZZ_SECONDS=600` with
//! `--release`.

use std::alloc::System;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

use rampkv::limits::FRAME_BODY_BYTES_MAX;
use rampkv::resp::auth::{Permissions, Users};
use rampkv::resp::codec::{parse_frame, Frame, Protocol, RequestLimits, RequestParser};
use rampkv::resp::command::{parse_request, Request as RespRequest};
use rampkv::wire::{
    request, AuthFrame, ErrorCode, ExpireCondition, FrameHeader, GetExExpiry, GetItem, Metadata, Request, Response,
    Selector, SetCondition, SetExpiry, TxnState, UpdateOp, VersionItem, Write, WriteSet, AUTH_BYTES,
    FRAME_HEADER_BYTES,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocation counts are process-wide: the tests of this file take turns (under `cargo
/// test`, which runs tests on parallel threads; nextest runs each in its own process).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Bytes a decoder may allocate per input byte. Decoded items are bigger than their encoding
/// (a key of 2 length bytes becomes a 24-byte `Vec` header, a GET item of 3 bytes a 56-byte
/// struct), so the factor is well above 1; what matters is that it is a constant.
const ALLOCATION_FACTOR: usize = 32;

/// Bytes a decoder may allocate whatever its input (error messages, small fixed tables).
const ALLOCATION_SLACK_BYTES: usize = 16 * 1024;

/// What `parse_request` may allocate whatever its input: the slack, and a reply known at once,
/// the largest being a bare `COMMAND`'s, the whole command table (16.4 KiB with the commands of
/// MULTI/EXEC and expiry: it grows with the table, never with the input).
const COMMAND_REPLY_SLACK_BYTES: usize = 32 * 1024;

/// Longest input a mutation may grow to: past the RESP inline line bound (64 KiB), so that
/// bound is reached too.
const INPUT_BYTES_MAX: usize = 80 * 1024;

const SECONDS_DEFAULT: f64 = 2.0;

/// Run settings from the environment, printed.
struct Budget {
    seed: u64,
    only_case: Option<u64>,
    cases: Option<u64>,
    duration: Duration,
}

impl Budget {
    fn from_env(target: &str) -> Budget {
        let number = |name: &str| std::env::var(name).ok().map(|text| text.parse::<u64>().expect(name));
        let seed = number("RAMPKV_FUZZ_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |t| t.as_nanos() as u64)
        });
        let seconds = std::env::var("RAMPKV_FUZZ_SECONDS")
            .ok()
            .map_or(SECONDS_DEFAULT, |text| text.parse::<f64>().expect("RAMPKV_FUZZ_SECONDS"));
        let budget = Budget {
            seed,
            only_case: number("RAMPKV_FUZZ_CASE"),
            cases: number("RAMPKV_FUZZ_CASES"),
            duration: Duration::from_secs_f64(seconds),
        };
        println!("fuzz {target}: seed {seed} (replay: RAMPKV_FUZZ_SEED={seed}, one case: RAMPKV_FUZZ_CASE=N)");
        budget
    }

    /// Runs `case` for every case number in the budget; on a panic, saves the input and says
    /// how to replay it. Returns how many cases ran.
    fn run(&self, target: &str, mut case: impl FnMut(&mut SmallRng) -> Vec<u8>, mut check: impl FnMut(&[u8])) -> u64 {
        let started = Instant::now();
        let mut number = self.only_case.unwrap_or(0);
        loop {
            let done = number - self.only_case.unwrap_or(0);
            let finished = match (self.only_case, self.cases) {
                (Some(_), _) => done == 1,
                (None, Some(cases)) => done == cases,
                (None, None) => started.elapsed() >= self.duration,
            };
            if finished {
                return done;
            }
            // Each case has its own generator, so that one case replays alone.
            let mut rng = SmallRng::seed_from_u64(self.seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let input = case(&mut rng);
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| check(&input))) {
                let path = std::env::temp_dir().join(format!("rampkv-fuzz-{target}-{}-{number}.bin", self.seed));
                let _ = std::fs::write(&path, &input);
                println!(
                    "fuzz {target}: case {number} of seed {} failed ({} input bytes in {}); replay with \
                     RAMPKV_FUZZ_SEED={} RAMPKV_FUZZ_CASE={number}",
                    self.seed,
                    input.len(),
                    path.display(),
                    self.seed
                );
                std::panic::resume_unwind(panic);
            }
            number += 1;
        }
    }
}

/// Counts of what the cases reached, printed at the end (a fuzzer that never gets past the
/// first check tests nothing).
#[derive(Default)]
struct Tally(BTreeMap<String, u64>);

impl Tally {
    fn add(&mut self, what: impl Into<String>) {
        *self.0.entry(what.into()).or_default() += 1;
    }

    fn get(&self, what: &str) -> u64 {
        self.0.get(what).copied().unwrap_or(0)
    }

    fn print(&self, target: &str, cases: u64, elapsed: Duration) {
        println!("fuzz {target}: {cases} cases in {:.1} s", elapsed.as_secs_f64());
        let ratio = ALLOCATION_RATIO_MAX_MILLI.load(Ordering::Relaxed) as f64 / 1000.0;
        println!(
            "fuzz {target}: at most {ratio:.2} bytes allocated per input byte (inputs of {RATIO_INPUT_BYTES_MIN} B \
             or more; bound {ALLOCATION_FACTOR} + {ALLOCATION_SLACK_BYTES} B)"
        );
        for (what, count) in &self.0 {
            println!("fuzz {target}:   {what}: {count}");
        }
    }
}

/// The most bytes allocated per input byte seen so far (in thousandths), over inputs of at
/// least [`RATIO_INPUT_BYTES_MIN`] bytes: how close the decoders come to [`ALLOCATION_FACTOR`].
static ALLOCATION_RATIO_MAX_MILLI: AtomicUsize = AtomicUsize::new(0);

/// Inputs shorter than this are dominated by the slack, not the factor.
const RATIO_INPUT_BYTES_MIN: usize = 256;

/// Runs `decode` and checks what it allocated against the bound for `input_bytes`.
fn within_allocation_bound<T>(what: &str, input_bytes: usize, decode: impl FnOnce() -> T) -> T {
    within_allocation_bound_and_slack(what, input_bytes, ALLOCATION_SLACK_BYTES, decode)
}

/// [`within_allocation_bound`] with `slack_bytes` in place of [`ALLOCATION_SLACK_BYTES`].
fn within_allocation_bound_and_slack<T>(
    what: &str,
    input_bytes: usize,
    slack_bytes: usize,
    decode: impl FnOnce() -> T,
) -> T {
    let region = Region::new(GLOBAL);
    let decoded = decode();
    let change = region.change();
    // stats_alloc counts what a reallocation grows by in `bytes_allocated` already.
    let allocated = change.bytes_allocated;
    let bound = ALLOCATION_FACTOR * input_bytes + slack_bytes;
    assert!(allocated <= bound, "{what}: {allocated} bytes allocated for {input_bytes} input bytes (bound {bound})");
    if input_bytes >= RATIO_INPUT_BYTES_MIN {
        ALLOCATION_RATIO_MAX_MILLI.fetch_max(allocated * 1000 / input_bytes, Ordering::Relaxed);
    }
    decoded
}

// ---------------------------------------------------------------------------------------------
// Mutations

/// Bytes and integers that tend to sit on boundaries.
const INTERESTING_BYTES: &[u8] =
    &[0, 1, 0x7f, 0x80, 0xfe, 0xff, b'\r', b'\n', b'$', b'*', b'-', b'0', b'9', b' ', b'"'];

fn interesting_integers(input_len: usize) -> [u64; 14] {
    let len = input_len as u64;
    [
        0,
        1,
        2,
        255,
        256,
        u64::from(u16::MAX),
        u64::from(u32::MAX),
        u64::from(u32::MAX) - 1,
        i32::MAX as u64,
        FRAME_BODY_BYTES_MAX as u64,
        FRAME_BODY_BYTES_MAX as u64 + 1,
        len,
        len.saturating_sub(16),
        u64::MAX,
    ]
}

/// 1 to 8 mutations of `input`, drawing splices from `corpus` and tokens from `dictionary`.
fn mutate(rng: &mut SmallRng, input: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[&[u8]]) {
    for _ in 0..rng.gen_range(1..=8) {
        let len = input.len();
        let at = |rng: &mut SmallRng| rng.gen_range(0..=len);
        match rng.gen_range(0..11) {
            0 if len > 0 => {
                let index = rng.gen_range(0..len);
                input[index] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let index = rng.gen_range(0..len);
                input[index] = rng.gen();
            }
            2 if len > 0 => {
                let index = rng.gen_range(0..len);
                input[index] = INTERESTING_BYTES[rng.gen_range(0..INTERESTING_BYTES.len())];
            }
            3 => {
                let bytes: Vec<u8> = (0..rng.gen_range(1..=16)).map(|_| rng.gen()).collect();
                let position = at(rng);
                input.splice(position..position, bytes);
            }
            4 if len > 0 => {
                let start = rng.gen_range(0..len);
                let end = rng.gen_range(start..=len.min(start + 64));
                input.drain(start..end);
            }
            5 if len > 0 => {
                let start = rng.gen_range(0..len);
                let end = rng.gen_range(start..=len.min(start + 64));
                let copy = input[start..end].to_vec();
                let position = at(rng);
                input.splice(position..position, copy);
            }
            6 if len > 0 => {
                // A length or count field: little-endian of 1, 2, 4 or 8 bytes.
                let value = interesting_integers(len)[rng.gen_range(0..14)];
                let width = [1, 2, 4, 8][rng.gen_range(0..4)];
                let start = rng.gen_range(0..len);
                let end = len.min(start + width);
                input[start..end].copy_from_slice(&value.to_le_bytes()[..end - start]);
            }
            7 => {
                // A RESP length: the decimal of an interesting number at a random place.
                let value = interesting_integers(len)[rng.gen_range(0..14)] as i64;
                let text = if rng.gen_bool(0.2) { (-value).to_string() } else { value.to_string() };
                let position = at(rng);
                input.splice(position..position, text.into_bytes());
            }
            8 if !corpus.is_empty() => {
                let other = &corpus[rng.gen_range(0..corpus.len())];
                let start = rng.gen_range(0..=other.len());
                let end = rng.gen_range(start..=other.len());
                let position = at(rng);
                input.splice(position..position, other[start..end].iter().copied());
            }
            9 if !dictionary.is_empty() => {
                let token = dictionary[rng.gen_range(0..dictionary.len())];
                let position = at(rng);
                input.splice(position..position, token.iter().copied());
            }
            _ if len > 0 => input.truncate(rng.gen_range(0..len)),
            _ => {}
        }
    }
    input.truncate(INPUT_BYTES_MAX);
}

/// A case: arbitrary bytes (one in eight), else a mutated member of the corpus.
fn next_input(rng: &mut SmallRng, corpus: &[Vec<u8>], dictionary: &[&[u8]]) -> Vec<u8> {
    if rng.gen_range(0..8) == 0 {
        let length = rng.gen_range(0..512);
        return (0..length).map(|_| rng.gen()).collect();
    }
    let mut input = corpus[rng.gen_range(0..corpus.len())].clone();
    mutate(rng, &mut input, corpus, dictionary);
    input
}

// ---------------------------------------------------------------------------------------------
// The binary frame decoder

fn bytes(rng: &mut SmallRng, max: usize) -> Vec<u8> {
    (0..rng.gen_range(0..=max)).map(|_| rng.gen()).collect()
}

fn metadata(rng: &mut SmallRng) -> Metadata {
    match rng.gen_range(0..3) {
        0 => Metadata::None,
        1 => {
            let keys: Vec<Vec<u8>> = (0..rng.gen_range(0..5)).map(|_| bytes(rng, 12)).collect();
            Metadata::WriteSet(WriteSet::from_keys(&keys).unwrap())
        }
        _ => Metadata::Bloom(bytes(rng, 32)),
    }
}

fn cluster_view(rng: &mut SmallRng) -> Option<rampkv::wire::ClusterView> {
    rng.gen_bool(0.5).then(|| rampkv::wire::ClusterView { partitions: rng.gen(), server_index: rng.gen() })
}

/// An expiry word: mostly none, sometimes a deadline, a deletion or (in replies) reclaimed.
fn expiry_word(rng: &mut SmallRng, reclaimed: bool) -> u64 {
    let word = match rng.gen_range(0..4) {
        0 | 1 => 0,
        2 => 1,
        _ => rng.gen_range(0..=rampkv::types::Expiry::DEADLINE_MS_MAX),
    };
    if reclaimed && word != 0 && rng.gen_bool(0.3) {
        word | rampkv::types::Expiry::RECLAIMED_BIT
    } else {
        word
    }
}

fn writes(rng: &mut SmallRng) -> Vec<Write> {
    (0..rng.gen_range(0..5)).map(|_| Write::expiring(bytes(rng, 12), bytes(rng, 40), expiry_word(rng, false))).collect()
}

fn get_items(rng: &mut SmallRng) -> Vec<GetItem> {
    (0..rng.gen_range(0..5))
        .map(|_| {
            let selector = match rng.gen_range(0..4) {
                0 => Selector::Latest,
                1 => Selector::LatestTimestamp,
                2 => Selector::Exact(rng.gen()),
                _ => Selector::HighestOf((0..rng.gen_range(0..4)).map(|_| rng.gen()).collect()),
            };
            GetItem { key: bytes(rng, 12), selector }
        })
        .collect()
}

fn request(rng: &mut SmallRng, variant: usize) -> Request {
    let ts = rng.gen();
    let keys = |rng: &mut SmallRng| (0..rng.gen_range(0..5)).map(|_| bytes(rng, 12)).collect();
    match variant % 12 {
        11 => Request::Update { ts, metadata: metadata(rng), key: bytes(rng, 12), op: update_op(rng) },
        0 => Request::Hello { client_ids_wanted: rng.gen(), cluster: cluster_view(rng) },
        1 => Request::Get { items: get_items(rng) },
        2 => Request::GetLocate { items: get_items(rng) },
        3 => Request::Prepare { ts, metadata: metadata(rng), write_set: keys(rng), writes: writes(rng) },
        4 => Request::Commit { ts },
        5 => Request::Put { ts, writes: writes(rng) },
        6 => Request::LockRead { ts, keys: keys(rng) },
        7 => Request::LockWrite { ts, writes: writes(rng) },
        8 => Request::CommitLocked { ts },
        9 => Request::Release { ts },
        _ => Request::Status { ts, keys: keys(rng) },
    }
}

/// An UPDATE's op of every tag (the expiry ops' deadlines among them up to the largest).
fn update_op(rng: &mut SmallRng) -> UpdateOp {
    let deadline_ms = |rng: &mut SmallRng| rng.gen_range(0..=rampkv::types::Expiry::DEADLINE_MS_MAX);
    let conditions = [SetCondition::Always, SetCondition::IfAbsent, SetCondition::IfPresent];
    match rng.gen_range(0..7) {
        0 => UpdateOp::IncrBy(rng.gen()),
        1 => {
            let expiry = match rng.gen_range(0..3) {
                0 => SetExpiry::Clear,
                1 => SetExpiry::Keep,
                _ => SetExpiry::At(deadline_ms(rng)),
            };
            let condition = conditions[rng.gen_range(0..3)];
            UpdateOp::Set { value: bytes(rng, 40), condition, get_old: rng.gen(), expiry }
        }
        2 => UpdateOp::GetDel,
        3 => UpdateOp::Append(bytes(rng, 40)),
        4 => {
            let conditions = [
                ExpireCondition::Always,
                ExpireCondition::IfNone,
                ExpireCondition::IfSome,
                ExpireCondition::IfLater,
                ExpireCondition::IfEarlier,
                ExpireCondition::IfSomeAndEarlier,
            ];
            UpdateOp::Expire { deadline_ms: deadline_ms(rng), condition: conditions[rng.gen_range(0..6)] }
        }
        5 => UpdateOp::Persist,
        _ => UpdateOp::GetEx(match rng.gen_range(0..3) {
            0 => GetExExpiry::Keep,
            1 => GetExExpiry::Persist,
            _ => GetExExpiry::At(deadline_ms(rng)),
        }),
    }
}

fn version(rng: &mut SmallRng) -> VersionItem {
    let (ts, value, metadata) = (rng.gen(), bytes(rng, 40), metadata(rng));
    VersionItem { ts, value: value.into(), metadata, expiry: rampkv::types::Expiry::from_word(expiry_word(rng, true)) }
}

fn response(rng: &mut SmallRng, variant: usize) -> Response {
    match variant % 7 {
        0 => Response::Hello { client_id_first: rng.gen(), client_ids_granted: rng.gen(), cluster: cluster_view(rng) },
        6 => {
            let items: Vec<VersionItem> = (0..rng.gen_range(0..4)).map(|_| version(rng)).collect();
            let on_arrival = items.iter().map(|_| rng.gen()).collect();
            Response::VersionsLocked { items, on_arrival }
        }
        1 => Response::Versions { items: (0..rng.gen_range(0..4)).map(|_| version(rng)).collect() },
        2 => {
            let items: Vec<VersionItem> = (0..rng.gen_range(0..4)).map(|_| version(rng)).collect();
            let slots = items.iter().map(|_| rng.gen_bool(0.5).then(|| rng.gen_range(0..u32::MAX))).collect();
            Response::VersionsLocated { items, slots }
        }
        3 => Response::Ack,
        4 => {
            let states = [TxnState::Unknown, TxnState::Prepared, TxnState::Committed, TxnState::Aborted];
            Response::Status { state: states[rng.gen_range(0..4)] }
        }
        _ => {
            let codes = [ErrorCode::BadRequest, ErrorCode::VersionGone, ErrorCode::Internal, ErrorCode::Aborted];
            Response::Error { code: codes[rng.gen_range(0..4)], message: "bad request: key too large".into() }
        }
    }
}

/// Frames of every request and response kind, alone and in streams of two or three.
fn wire_corpus(seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut frames = Vec::new();
    for variant in 0..72 {
        let mut frame = Vec::new();
        request(&mut rng, variant).encode_frame(rng.gen(), &mut frame);
        frames.push(frame);
        let mut frame = Vec::new();
        response(&mut rng, variant).encode_frame(rng.gen(), &mut frame);
        frames.push(frame);
    }
    for variant in 0..8 {
        let bytes: [u8; AUTH_BYTES] = rng.gen();
        let frame = [
            AuthFrame::Begin { nonce: bytes },
            AuthFrame::Challenge { challenge: bytes },
            AuthFrame::Proof { proof: bytes },
            AuthFrame::Accepted { proof: bytes },
        ][variant % 4];
        let mut encoded = Vec::new();
        frame.encode_frame(rng.gen(), &mut encoded);
        frames.push(encoded);
    }
    let streams: Vec<Vec<u8>> = (0..40)
        .map(|_| (0..rng.gen_range(2..=3)).flat_map(|_| frames[rng.gen_range(0..frames.len())].clone()).collect())
        .collect();
    frames.extend(streams);
    frames
}

/// Decodes every whole frame at the front of `input` as a stream reader would, each body as a
/// request and as a response; checks the properties in the module docs.
fn check_wire(input: &[u8], tally: &mut Tally) {
    let mut rest = input;
    loop {
        let split = within_allocation_bound("FrameHeader::split", rest.len(), || FrameHeader::split(rest));
        let (header, body) = match split {
            Ok(Some(frame)) => frame,
            Ok(None) => return tally.add("stream: incomplete frame (waits for more)"),
            Err(error) => return tally.add(format!("header refused: {}", variant_name(&error))),
        };
        tally.add("frames split");
        check_decoder("request", header.kind, body, Request::decode, Request::encode_body, tally);
        check_decoder("response", header.kind, body, Response::decode, Response::encode_body, tally);
        check_decoder("auth", header.kind, body, AuthFrame::decode, AuthFrame::encode_body, tally);
        rest = &rest[header.frame_bytes()..];
    }
}

/// Decodes `body` as a message of `kind` with `decode` within the allocation bound; what decodes
/// must encode (`encode`) and decode back to itself.
fn check_decoder<T: PartialEq + std::fmt::Debug>(
    what: &str,
    kind: u8,
    body: &[u8],
    decode: fn(u8, &[u8]) -> Result<T, rampkv::wire::WireError>,
    encode: fn(&T, &mut Vec<u8>),
    tally: &mut Tally,
) {
    match within_allocation_bound(what, body.len(), || decode(kind, body)) {
        Ok(message) => {
            tally.add(format!("{what} decoded: kind {kind:#04x}"));
            let mut again = Vec::new();
            encode(&message, &mut again);
            assert_eq!(decode(kind, &again).as_ref(), Ok(&message), "{what} round trip");
        }
        Err(error) => tally.add(format!("{what} refused: {}", variant_name(&error))),
    }
}

/// A wire case: as [`next_input`], and half the time with a valid header rewritten over the
/// front whose length is the rest's, so that mutated bodies reach the body decoders rather than
/// dying at the header check (the version byte alone stops most blind mutations).
fn wire_input(rng: &mut SmallRng, corpus: &[Vec<u8>], dictionary: &[&[u8]]) -> Vec<u8> {
    let mut input = next_input(rng, corpus, dictionary);
    if input.len() >= FRAME_HEADER_BYTES && rng.gen_bool(0.5) {
        let kind = if rng.gen_bool(0.5) {
            input[5]
        } else {
            [0x01, 0x02, 0x03, 0x05, 0x06, 0x81, 0x82, 0x83][rng.gen_range(0..8)]
        };
        let body_length = (input.len() - FRAME_HEADER_BYTES) as u32;
        let mut header = [0u8; FRAME_HEADER_BYTES];
        FrameHeader { body_length, kind, request_id: rng.gen() }.encode(&mut header);
        input[..FRAME_HEADER_BYTES].copy_from_slice(&header);
    }
    input
}

/// The variant of an error, without its fields (`FieldTooLarge { .. }` -> `FieldTooLarge`).
fn variant_name(error: &impl std::fmt::Debug) -> String {
    let text = format!("{error:?}");
    text.split(|c: char| !c.is_alphanumeric()).next().unwrap_or_default().to_owned()
}

#[test]
fn fuzz_the_binary_frame_decoder() {
    let _turn = one_at_a_time();
    let budget = Budget::from_env("wire");
    let corpus = wire_corpus(budget.seed);
    let dictionary: &[&[u8]] = &[&[1, 0x82, 0, 0], &[0, 0, 0, 0], &[0xff, 0xff, 0xff, 0xff], &[1, 0, 0, 0, 0, 0, 0, 0]];
    let mut tally = Tally::default();
    let started = Instant::now();
    let cases = budget.run("wire", |rng| wire_input(rng, &corpus, dictionary), |input| check_wire(input, &mut tally));
    tally.print("wire", cases, started.elapsed());
    if budget.only_case.is_none() {
        // The mutations must reach the decoders, not only the header check.
        assert!(tally.0.keys().any(|what| what.starts_with("request decoded")), "no request decoded");
        assert!(tally.0.keys().any(|what| what.starts_with("response refused")), "no response refused");
        assert!(tally.get("frames split") > cases / 4, "too few cases got past the header");
    }
}

/// The frame the issue used: 17 bytes declaring a 20 MiB body. The decoder does nothing with a
/// declared length but wait for the bytes, so nothing is allocated for it.
#[test]
fn a_frame_declaring_twenty_mebibytes_allocates_nothing_for_them() {
    let _turn = one_at_a_time();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    FrameHeader { body_length: FRAME_BODY_BYTES_MAX as u32, kind: request::KIND_PREPARE, request_id: 7 }
        .encode(&mut header);
    let prefix = [&header[..], &[0]].concat();
    assert_eq!(prefix.len(), 17);
    let region = Region::new(GLOBAL);
    assert_eq!(FrameHeader::split(&prefix), Ok(None), "waits for the rest");
    assert_eq!(region.change().bytes_allocated, 0);
    // Bodies whose count fields declare up to 2^32 items, with none present.
    for kind in [request::KIND_GET, request::KIND_PREPARE, request::KIND_PUT, request::KIND_LOCK_READ] {
        let region = Region::new(GLOBAL);
        assert!(Request::decode(kind, &[0xff; 12]).is_err());
        assert!(region.change().bytes_allocated < ALLOCATION_SLACK_BYTES);
    }
}

// ---------------------------------------------------------------------------------------------
// The RESP request parser and the command table

/// Every command of the gateway in the forms clients send, as arrays of bulk strings and
/// inline, alone and pipelined.
fn resp_corpus(seed: u64) -> Vec<Vec<u8>> {
    let commands: &[&[&str]] = &[
        &["GET", "k"],
        &["SET", "k", "v"],
        &["SET", "k", "v", "EX", "10"],
        &["MGET", "a", "b", "c"],
        &["MSET", "a", "1", "b", "2"],
        &["DEL", "a", "b"],
        &["EXISTS", "a"],
        &["UNLINK", "a", "b"],
        &["STRLEN", "k"],
        &["TYPE", "k"],
        &["EXPIRE", "k", "10", "NX"],
        &["PEXPIRE", "k", "-5", "XX", "LT"],
        &["EXPIREAT", "k", "1700000000", "GT"],
        &["PEXPIREAT", "k", "9223372036854775807"],
        &["PERSIST", "k"],
        &["GETEX", "k", "PX", "100"],
        &["GETEX", "k", "PERSIST"],
        &["SET", "k", "v", "NX", "GET", "EX", "10"],
        &["SET", "k", "v", "XX", "KEEPTTL"],
        &["MULTI"],
        &["EXEC"],
        &["EXEC", "x"],
        &["DISCARD"],
        &["WATCH", "k"],
        &["UNWATCH"],
        &["PING"],
        &["PING", "hello"],
        &["ECHO", "x"],
        &["HELLO", "3", "AUTH", "default", "pw", "SETNAME", "me"],
        &["HELLO", "2"],
        &["AUTH", "pw"],
        &["AUTH", "alice", "pw"],
        &["ACL", "WHOAMI"],
        &["INFO"],
        &["INFO", "server", "ALL", "nosuch"],
        &["DBSIZE"],
        &["COMMAND", "INFO", "get", "mset"],
        &["COMMAND", "COUNT"],
        &["COMMAND", "DOCS"],
        &["SELECT", "0"],
        &["CLIENT", "SETNAME", "x"],
        &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
        &["CONFIG", "GET", "*"],
        &["CONFIG", "SET", "a", "b"],
        &["QUIT"],
    ];
    let encode = |words: &[&str]| -> Vec<u8> {
        let mut request = format!("*{}\r\n", words.len()).into_bytes();
        for word in words {
            request.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
        }
        request
    };
    let mut corpus: Vec<Vec<u8>> = commands.iter().map(|words| encode(words)).collect();
    corpus.extend(commands.iter().map(|words| format!("{}\r\n", words.join(" ")).into_bytes()));
    corpus.push(b"SET \"a b\" 'c d' \"\\x41\\n\"\r\n".to_vec());
    // At the inline bounds: 513 words (one more is too many), a line of 64 KiB.
    corpus.push(format!("MGET{}\r\n", " k".repeat(rampkv::resp::RESP_ARGS_MAX - 1)).into_bytes());
    corpus.push(format!("GET {}\r\n", "x".repeat(rampkv::resp::RESP_INLINE_BYTES_MAX - 8)).into_bytes());
    let mut rng = SmallRng::seed_from_u64(seed);
    let pipelines: Vec<Vec<u8>> = (0..30)
        .map(|_| (0..rng.gen_range(2..=6)).flat_map(|_| corpus[rng.gen_range(0..corpus.len())].clone()).collect())
        .collect();
    corpus.extend(pipelines);
    corpus
}

/// Parses requests from the front of `input` as the gateway does (within `limits`), translates
/// each with every kind of permissions, encodes every reply in both protocols; checks the
/// properties in the module docs.
fn check_resp(input: &[u8], permissions: &[Permissions], tally: &mut Tally) {
    let mut parser = RequestParser::new();
    for limits in [RequestLimits::AUTHENTICATED, RequestLimits::UNAUTHENTICATED] {
        let mut rest = input;
        // Bounded: each round consumes at least one byte, and a pipeline is checked 64 deep.
        for _ in 0..64 {
            // Only the parser is measured: the arguments are looked at after (translate_every_way
            // parses the request again).
            let parsed = within_allocation_bound("RequestParser::parse_within", rest.len(), || {
                parser.parse_within(rest, limits).map(|parsed| parsed.map(|(args, consumed)| (args.len(), consumed)))
            });
            let (arguments, consumed) = match parsed {
                Ok(Some(request)) => request,
                Ok(None) => {
                    tally.add("incomplete request (waits for more)");
                    break;
                }
                Err(error) => {
                    tally.add(format!("protocol error: {}", variant_name(&error)));
                    break;
                }
            };
            assert!(consumed > 0 && consumed <= rest.len(), "consumed {consumed} of {}", rest.len());
            assert!(arguments <= rampkv::resp::RESP_ARGS_MAX);
            if rest[0] == b'*' {
                assert!(arguments <= limits.args_max, "{arguments} arguments past the limit");
            }
            tally.add("requests parsed");
            if arguments > 0 {
                translate_every_way(&mut parser, &rest[..consumed], limits, permissions, tally);
            }
            rest = &rest[consumed..];
        }
    }
    // The general frame parser (replies, tests) on the same bytes.
    if let Ok(Some((_, consumed))) = within_allocation_bound("parse_frame", input.len(), || parse_frame(input)) {
        assert!(consumed <= input.len());
        tally.add("frames parsed by parse_frame");
    }
}

/// `parse_request` of one parsed request under each of `permissions`, and the encoding of its
/// reply in both protocols (which must parse back).
fn translate_every_way(
    parser: &mut RequestParser,
    request: &[u8],
    limits: RequestLimits,
    permissions: &[Permissions],
    tally: &mut Tally,
) {
    let (args, _) = parser.parse_within(request, limits).unwrap().unwrap();
    for &permission in permissions {
        let translated =
            within_allocation_bound_and_slack("parse_request", request.len(), COMMAND_REPLY_SLACK_BYTES, || {
                parse_request(&args, permission)
            });
        match translated {
            RespRequest::Reply(frame) | RespRequest::ExecRefused(frame) => {
                tally.add(if matches!(frame, Frame::Error(_)) { "error replies" } else { "immediate replies" });
                for protocol in [Protocol::Resp2, Protocol::Resp3] {
                    let encoded = frame.to_bytes(protocol);
                    let (_, length) = parse_frame(&encoded).expect("a reply parses").expect("a whole reply");
                    assert_eq!(length, encoded.len());
                }
            }
            RespRequest::Get { .. }
            | RespRequest::MultiGet { .. }
            | RespRequest::Exists { .. }
            | RespRequest::Set { .. }
            | RespRequest::MultiSet { .. }
            | RespRequest::Delete { .. }
            | RespRequest::Unlink { .. }
            | RespRequest::Strlen { .. }
            | RespRequest::Type { .. } => tally.add("transactions"),
            _ => tally.add("connection commands"),
        }
    }
}

#[test]
fn fuzz_the_resp_request_parser_and_command_table() {
    let _turn = one_at_a_time();
    let budget = Budget::from_env("resp");
    let corpus = resp_corpus(budget.seed);
    let users = Users::from_acl(
        "user default on nopass allkeys allcommands\nuser nocommands on nopass\n\
                                 user nokeys on nopass allcommands\n",
    )
    .unwrap();
    let permissions = [
        Permissions::ALL,
        Permissions::UNAUTHENTICATED,
        users.permissions(users.authenticate(b"nocommands", b"")),
        users.permissions(users.authenticate(b"nokeys", b"")),
    ];
    let dictionary: &[&[u8]] =
        &[b"\r\n", b"*", b"$", b"*-1\r\n", b"$-1\r\n", b"\"", b"'", b"\\x", b"AUTH", b"HELLO", b"MSET", b"CLIENT"];
    let mut tally = Tally::default();
    let started = Instant::now();
    let cases = budget.run(
        "resp",
        |rng| next_input(rng, &corpus, dictionary),
        |input| check_resp(input, &permissions, &mut tally),
    );
    tally.print("resp", cases, started.elapsed());
    if budget.only_case.is_none() {
        for reached in ["transactions", "error replies", "requests parsed", "connection commands"] {
            assert!(tally.get(reached) > 0, "no case reached {reached}");
        }
        assert!(tally.0.keys().any(|what| what.starts_with("protocol error")), "no protocol error met");
    }
}
