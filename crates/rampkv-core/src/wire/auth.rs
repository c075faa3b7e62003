//! The binary port's authentication step (issue 15): a challenge-response on the cluster's
//! shared secret, run by the client's transport on every TCP connection to a server that has a
//! secret, before any other request. It is a connection-level exchange (like TLS's handshake
//! records): its frames never reach the server core, so it composes with whatever HELLO
//! carries.
//!
//! # Format
//! Four frames, each with a fixed 32-byte body (`AUTH_BYTES`); `docs/wire.md` has the tables.
//! ```text
//! client -> server  0x0C AUTH_BEGIN      nonce      32 random bytes of the client
//! server -> client  0x87 AUTH_CHALLENGE  challenge  32 random bytes of the server
//! client -> server  0x0D AUTH_PROOF      proof      HMAC-SHA-256(secret, "rampkv-auth-1 client" || challenge || nonce)
//! server -> client  0x88 AUTH_ACCEPTED   proof      HMAC-SHA-256(secret, "rampkv-auth-1 server" || nonce || challenge)
//! ```
//! A server refuses with `ERROR BadRequest` (the message says why) and closes the connection.
//! The MACs are computed where the secret is (`rampkv-net`'s `auth` module); this module only
//! frames the bytes.

use super::frame::append_frame;
use super::{Decoder, WireError};

/// Bytes of every authentication body (nonce, challenge, proof).
pub const AUTH_BYTES: usize = 32;

/// Request kind: the client's nonce, opening the exchange.
pub const AUTH_BEGIN_KIND: u8 = 0x0C;
/// Request kind: the client's proof.
pub const AUTH_PROOF_KIND: u8 = 0x0D;
/// Response kind: the server's challenge.
pub const AUTH_CHALLENGE_KIND: u8 = 0x87;
/// Response kind: the server's proof (the client is in).
pub const AUTH_ACCEPTED_KIND: u8 = 0x88;

/// One frame of the authentication step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFrame {
    Begin { nonce: [u8; AUTH_BYTES] },
    Challenge { challenge: [u8; AUTH_BYTES] },
    Proof { proof: [u8; AUTH_BYTES] },
    Accepted { proof: [u8; AUTH_BYTES] },
}

impl AuthFrame {
    /// Whether `kind` is one of the authentication step's frame kinds.
    pub fn is_auth_kind(kind: u8) -> bool {
        matches!(kind, AUTH_BEGIN_KIND | AUTH_PROOF_KIND | AUTH_CHALLENGE_KIND | AUTH_ACCEPTED_KIND)
    }

    /// The frame kind.
    pub fn kind(&self) -> u8 {
        match self {
            AuthFrame::Begin { .. } => AUTH_BEGIN_KIND,
            AuthFrame::Challenge { .. } => AUTH_CHALLENGE_KIND,
            AuthFrame::Proof { .. } => AUTH_PROOF_KIND,
            AuthFrame::Accepted { .. } => AUTH_ACCEPTED_KIND,
        }
    }

    fn body(&self) -> &[u8; AUTH_BYTES] {
        match self {
            AuthFrame::Begin { nonce: bytes }
            | AuthFrame::Challenge { challenge: bytes }
            | AuthFrame::Proof { proof: bytes }
            | AuthFrame::Accepted { proof: bytes } => bytes,
        }
    }

    /// Appends this frame (header and body) to `out`.
    pub fn encode_frame(&self, request_id: u64, out: &mut Vec<u8>) {
        append_frame(out, self.kind(), request_id, |body| self.encode_body(body));
    }

    /// Appends the body of this frame (no header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.body());
    }

    /// Decodes the body of a frame of `kind`: exactly `AUTH_BYTES` bytes.
    ///
    /// # Errors
    /// `UnknownKind` for a kind that is not an authentication frame, `Truncated` or
    /// `TrailingBytes` for a body of another length.
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, WireError> {
        let mut decoder = Decoder::new(body);
        let bytes: [u8; AUTH_BYTES] = decoder.take(AUTH_BYTES)?.try_into().expect("took AUTH_BYTES");
        decoder.finish()?;
        match kind {
            AUTH_BEGIN_KIND => Ok(AuthFrame::Begin { nonce: bytes }),
            AUTH_CHALLENGE_KIND => Ok(AuthFrame::Challenge { challenge: bytes }),
            AUTH_PROOF_KIND => Ok(AuthFrame::Proof { proof: bytes }),
            AUTH_ACCEPTED_KIND => Ok(AuthFrame::Accepted { proof: bytes }),
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameHeader;

    #[test]
    fn auth_frames_are_exact_byte_by_byte_and_refuse_other_lengths() {
        let mut nonce = [0u8; AUTH_BYTES];
        nonce.iter_mut().enumerate().for_each(|(index, byte)| *byte = index as u8);
        let mut out = Vec::new();
        AuthFrame::Begin { nonce }.encode_frame(7, &mut out);
        assert_eq!(&out[..16], &[32, 0, 0, 0, 1, 0x0C, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[16..], &nonce);
        let (header, body) = FrameHeader::split(&out).unwrap().unwrap();
        assert_eq!(AuthFrame::decode(header.kind, body), Ok(AuthFrame::Begin { nonce }));
        for frame in [
            AuthFrame::Challenge { challenge: nonce },
            AuthFrame::Proof { proof: nonce },
            AuthFrame::Accepted { proof: nonce },
        ] {
            let mut out = Vec::new();
            frame.encode_frame(1, &mut out);
            assert_eq!(AuthFrame::decode(frame.kind(), &out[16..]), Ok(frame));
            assert!(AuthFrame::is_auth_kind(frame.kind()));
        }
        assert!(matches!(AuthFrame::decode(AUTH_PROOF_KIND, &nonce[..31]), Err(WireError::Truncated { .. })));
        assert!(matches!(AuthFrame::decode(AUTH_PROOF_KIND, &[0; 33]), Err(WireError::TrailingBytes(1))));
        assert_eq!(AuthFrame::decode(0x02, &nonce), Err(WireError::UnknownKind(0x02)));
        assert!(!AuthFrame::is_auth_kind(0x01));
    }
}
