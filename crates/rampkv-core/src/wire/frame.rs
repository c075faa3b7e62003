//! The frame header that delimits messages on a byte stream.
//!
//! # Format
//! ```text
//! offset size field
//!      0    4 body_length   u32 LE, bytes after the header, at most FRAME_BODY_BYTES_MAX
//!      4    1 version       u8, always 1
//!      5    1 kind          u8, message kind (requests 0x01.., responses 0x81..)
//!      6    2 reserved      u16 LE, must be 0
//!      8    8 request_id    u64 LE, chosen by the client, echoed in the response
//!     16    . body          body_length bytes, layout by kind (see request.rs, response.rs)
//! ```
//! A reader first checks that the header is valid and the whole frame is present
//! ([`FrameHeader::check`]), and only then parses the body: a partial frame is never parsed.

use super::WireError;
use crate::limits::FRAME_BODY_BYTES_MAX;

/// Bytes in a frame header.
pub const FRAME_HEADER_BYTES: usize = 16;

/// The only protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_length: u32,
    pub kind: u8,
    pub request_id: u64,
}

impl FrameHeader {
    /// Bytes of the whole frame (header and body).
    pub fn frame_bytes(&self) -> usize {
        FRAME_HEADER_BYTES + self.body_length as usize
    }

    /// Writes the header for a body of `body_length` bytes.
    pub fn encode(&self, out: &mut [u8; FRAME_HEADER_BYTES]) {
        out[0..4].copy_from_slice(&self.body_length.to_le_bytes());
        out[4] = PROTOCOL_VERSION;
        out[5] = self.kind;
        out[6..8].copy_from_slice(&0u16.to_le_bytes());
        out[8..16].copy_from_slice(&self.request_id.to_le_bytes());
    }

    /// Checks the start of `buffer` for a frame: `Ok(None)` when more bytes are needed,
    /// `Ok(Some(header))` when a whole valid frame is present (its bytes are
    /// `buffer[..header.frame_bytes()]`), an error when the header is invalid (the stream
    /// cannot be resynchronised and the connection should close).
    pub fn check(buffer: &[u8]) -> Result<Option<FrameHeader>, WireError> {
        let Some(header_bytes) = buffer.get(..FRAME_HEADER_BYTES) else {
            return Ok(None);
        };
        let header = Self::decode(header_bytes.try_into().expect("slice of header length"))?;
        if buffer.len() < header.frame_bytes() {
            return Ok(None);
        }
        Ok(Some(header))
    }

    /// [`FrameHeader::check`], and for a whole frame also its body (`buffer[16..frame_bytes]`).
    pub fn split(buffer: &[u8]) -> Result<Option<(FrameHeader, &[u8])>, WireError> {
        Ok(Self::check(buffer)?.map(|header| (header, &buffer[FRAME_HEADER_BYTES..header.frame_bytes()])))
    }

    /// Decodes and validates a header (version, reserved bits, body length bound).
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, WireError> {
        let body_length = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if bytes[4] != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion(bytes[4]));
        }
        let reserved = u16::from_le_bytes(bytes[6..8].try_into().expect("2 bytes"));
        if reserved != 0 {
            return Err(WireError::ReservedBitsSet(reserved));
        }
        if body_length as usize > FRAME_BODY_BYTES_MAX {
            return Err(WireError::FrameTooLarge { length: body_length as usize, max: FRAME_BODY_BYTES_MAX });
        }
        let request_id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        Ok(FrameHeader { body_length, kind: bytes[5], request_id })
    }
}

/// Appends one frame (header then the body produced by `encode_body`) to `out`, for frames
/// whose size the limits bound below `FRAME_BODY_BYTES_MAX`: every request (the largest, a
/// PREPARE of `TXN_KEYS_MAX` keys and values of `VALUE_BYTES_MAX`, is about 17 MB, pinned by
/// a test) and the small replies. VERSIONS replies are not bounded so: they go through
/// [`try_append_frame`].
///
/// # Panics
/// If the body exceeds `FRAME_BODY_BYTES_MAX` (an encoder bug, ruled out by the limits).
pub fn append_frame(out: &mut Vec<u8>, kind: u8, request_id: u64, encode_body: impl FnOnce(&mut Vec<u8>)) {
    let appended = try_append_frame(out, kind, request_id, encode_body);
    assert!(appended.is_ok(), "encoder produced an oversized frame");
}

/// Appends one frame (header then the body produced by `encode_body`) to `out`. The body
/// length is patched in after encoding, so bodies are written once, in place. A body over
/// `FRAME_BODY_BYTES_MAX` is taken back out (`out` is as before) and the error says how large
/// it was.
pub fn try_append_frame(
    out: &mut Vec<u8>,
    kind: u8,
    request_id: u64,
    encode_body: impl FnOnce(&mut Vec<u8>),
) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    encode_body(out);
    let body_length = out.len() - start - FRAME_HEADER_BYTES;
    if body_length > FRAME_BODY_BYTES_MAX {
        out.truncate(start);
        return Err(WireError::FrameTooLarge { length: body_length, max: FRAME_BODY_BYTES_MAX });
    }
    let header = FrameHeader { body_length: body_length as u32, kind, request_id };
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    header.encode(&mut header_bytes);
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&header_bytes);
    Ok(())
}
