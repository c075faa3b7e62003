//! The cluster's shared secret (`--secret-file`) and the challenge-responses built on it: the
//! binary port's authentication step (`rampkv_core::wire::auth`; the replication and the
//! configuration-service ports run the same step, the latter through [`ConfigPortAuth`]) and
//! the proofs in the fabric control handshake (`message::fabric`).
//!
//! # Contract
//! Both sides prove they know the secret without sending it: each sends 32 random bytes (the
//! client a nonce, the server a challenge), and each answers with HMAC-SHA-256 of both under
//! the secret, with a label saying who answers and on which port, so that no answer can be
//! replayed as another (a server's proof is never a valid client proof, a control proof never a
//! binary-port proof). Proofs are compared in constant time (`hmac`'s `verify_slice`). The
//! server checks the client's proof before it answers with its own, so a client without the
//! secret gets nothing computed from it. No encryption: TLS is out of scope (docs/security.md).
//!
//! # Fault model
//! A secret file that is short, long, unreadable, or open to group or others is a clear error at
//! start-up, never a weak key. Everything a peer sends is a fixed-size byte string; a wrong one
//! is a refusal, never a panic.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rampkv_core::limits::{AUTH_REPLY_BODY_BYTES_MAX, AUTH_TIMEOUT_MS, SECRET_BYTES_MAX, SECRET_BYTES_MIN};
use rampkv_core::wire::response::ERROR_MESSAGE_BYTES_MAX;
use rampkv_core::wire::{AuthFrame, FrameHeader, Response, WireError, AUTH_BYTES, FRAME_HEADER_BYTES};
use sha2::Sha256;

/// Why a secret cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("cannot read the secret file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "the secret file {path} can be accessed by group or others (mode {mode:04o}); it must be \
         readable by its owner only: chmod 600 {path}"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error(
        "the secret holds {bytes} bytes; it needs at least {min} (e.g. head -c 32 /dev/urandom > FILE; chmod 600 FILE)"
    )]
    TooShort { bytes: usize, min: usize },
    #[error("the secret holds more than {max} bytes: name a key file, not a document")]
    TooLong { max: usize },
}

/// Who answers, on which port: part of every MAC, so no proof is valid in another place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofLabel {
    /// The binary port, the client's proof.
    BinaryClient,
    /// The binary port, the server's proof.
    BinaryServer,
    /// The fabric control port, the client's proof.
    ControlClient,
    /// The fabric control port, the server's proof.
    ControlServer,
}

impl ProofLabel {
    fn bytes(self) -> &'static [u8] {
        match self {
            ProofLabel::BinaryClient => b"rampkv-auth-1 client",
            ProofLabel::BinaryServer => b"rampkv-auth-1 server",
            ProofLabel::ControlClient => b"rampkv-control-1 client",
            ProofLabel::ControlServer => b"rampkv-control-1 server",
        }
    }
}

/// The cluster's shared secret: the bytes of the secret file, all of them.
pub struct SharedSecret {
    bytes: Vec<u8>,
}

impl std::fmt::Debug for SharedSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SharedSecret({} bytes)", self.bytes.len())
    }
}

impl SharedSecret {
    /// A secret of `bytes` (`SECRET_BYTES_MIN..=SECRET_BYTES_MAX` of them).
    ///
    /// # Errors
    /// `TooShort`, `TooLong`.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if bytes.len() < SECRET_BYTES_MIN {
            return Err(SecretError::TooShort { bytes: bytes.len(), min: SECRET_BYTES_MIN });
        }
        if bytes.len() > SECRET_BYTES_MAX {
            return Err(SecretError::TooLong { max: SECRET_BYTES_MAX });
        }
        Ok(Self { bytes })
    }

    /// Reads the secret from `path`: a file its owner only may access (no group or other
    /// permission bit: a secret others can read is no secret, and one others can write is
    /// theirs), of `SECRET_BYTES_MIN..=SECRET_BYTES_MAX` bytes. The mode is checked on the
    /// opened file, so the file read is the file checked.
    ///
    /// # Errors
    /// `Read`, `Permissions`, `TooShort`, `TooLong`.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let read_error = |source| SecretError::Read { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mode = file.metadata().map_err(read_error)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::Permissions { path: path.to_owned(), mode: mode & 0o7777 });
        }
        let mut bytes = Vec::with_capacity(SECRET_BYTES_MIN);
        file.take(SECRET_BYTES_MAX as u64 + 1).read_to_end(&mut bytes).map_err(read_error)?;
        Self::from_bytes(bytes)
    }

    fn mac(&self, label: ProofLabel, first: &[u8; AUTH_BYTES], second: &[u8; AUTH_BYTES]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.bytes).expect("HMAC takes keys of any length");
        mac.update(label.bytes());
        mac.update(first);
        mac.update(second);
        mac
    }

    /// The proof `label`'s side sends: HMAC-SHA-256(secret, label || first || second). Clients
    /// put the server's challenge first, servers the client's nonce.
    pub fn proof(&self, label: ProofLabel, first: &[u8; AUTH_BYTES], second: &[u8; AUTH_BYTES]) -> [u8; AUTH_BYTES] {
        self.mac(label, first, second).finalize().into_bytes().into()
    }

    /// Whether `proof` is [`SharedSecret::proof`] of the same inputs, compared in constant time.
    pub fn verify(
        &self,
        label: ProofLabel,
        first: &[u8; AUTH_BYTES],
        second: &[u8; AUTH_BYTES],
        proof: &[u8; AUTH_BYTES],
    ) -> bool {
        self.mac(label, first, second).verify_slice(proof).is_ok()
    }
}

/// The secret this process's clients prove (None: they do not authenticate). Set once by the
/// binary from `--secret-file`; client media read it when they open (`TcpClient`,
/// `FabricClient`), so every transport the process builds, the gateway's and recovery's
/// included, authenticates without threading the secret through each.
static CLIENT_SECRET: RwLock<Option<Arc<SharedSecret>>> = RwLock::new(None);

/// Sets the secret this process's clients prove from now on.
pub fn set_client_secret(secret: Option<Arc<SharedSecret>>) {
    *CLIENT_SECRET.write().unwrap_or_else(std::sync::PoisonError::into_inner) = secret;
}

/// The secret this process's clients prove, if any.
pub fn client_secret() -> Option<Arc<SharedSecret>> {
    CLIENT_SECRET.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// `AUTH_BYTES` random bytes from the kernel.
pub fn random_token() -> std::io::Result<[u8; AUTH_BYTES]> {
    random_bytes()
}

/// `N` random bytes from the kernel (challenges, nonces: here and in the fabric's control
/// handshake).
pub(crate) fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).map_err(std::io::Error::other)?;
    Ok(bytes)
}

/// Why a client's authentication failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("authentication: {0}")]
    Io(#[from] std::io::Error),
    /// The server refused (its words: no secret there, a wrong proof, ...).
    #[error("the server refused authentication: {message}")]
    Refused { message: String },
    /// The server's proof is wrong: it does not know our secret (or is not the server).
    #[error("the server could not prove it knows the shared secret: is its --secret-file the same file?")]
    ServerProofWrong,
    /// The server answered with something the step does not allow.
    #[error("the server's authentication reply is malformed: {0}")]
    Malformed(#[from] WireError),
    #[error("the server answered the authentication step with an unexpected frame (kind {kind:#04x})")]
    Unexpected { kind: u8 },
}

// Every reply the step allows fits the bound: an ERROR with the longest message, a proof.
const _: () =
    assert!(AUTH_REPLY_BODY_BYTES_MAX >= 6 + ERROR_MESSAGE_BYTES_MAX && AUTH_REPLY_BODY_BYTES_MAX >= AUTH_BYTES);

/// Runs the client's side of the binary port's authentication step on a connected, blocking
/// `stream` (the whole step within `AUTH_TIMEOUT_MS`): nonce, challenge, proofs both ways.
///
/// # Errors
/// `Refused` with the server's words, `ServerProofWrong`, `Malformed`, `Unexpected`, `Io`.
pub fn authenticate_client(stream: &mut std::net::TcpStream, secret: &SharedSecret) -> Result<(), AuthError> {
    let deadline = Instant::now() + Duration::from_millis(AUTH_TIMEOUT_MS);
    let nonce = random_token()?;
    let mut frame = Vec::with_capacity(2 * (FRAME_HEADER_BYTES + AUTH_BYTES));
    AuthFrame::Begin { nonce }.encode_frame(0, &mut frame);
    stream.write_all(&frame)?;
    let challenge = match read_auth_reply(stream, deadline)? {
        AuthFrame::Challenge { challenge } => challenge,
        other => return Err(AuthError::Unexpected { kind: other.kind() }),
    };
    frame.clear();
    let proof = secret.proof(ProofLabel::BinaryClient, &challenge, &nonce);
    AuthFrame::Proof { proof }.encode_frame(0, &mut frame);
    stream.write_all(&frame)?;
    let server_proof = match read_auth_reply(stream, deadline)? {
        AuthFrame::Accepted { proof } => proof,
        other => return Err(AuthError::Unexpected { kind: other.kind() }),
    };
    if !secret.verify(ProofLabel::BinaryServer, &nonce, &challenge, &server_proof) {
        return Err(AuthError::ServerProofWrong);
    }
    stream.set_read_timeout(None)?;
    Ok(())
}

/// Runs the server's side of the binary port's authentication step on a blocking `stream`
/// (the whole step within `AUTH_TIMEOUT_MS`), for a port served by threads (the replication
/// port). As [`authenticate_server_by`].
///
/// # Errors
/// As [`authenticate_server_by`].
pub fn authenticate_server_blocking(
    stream: &mut std::net::TcpStream,
    secret: &Arc<SharedSecret>,
) -> Result<(), AuthError> {
    let deadline = Instant::now() + Duration::from_millis(AUTH_TIMEOUT_MS);
    authenticate_server_by(stream, secret, deadline)
}

/// Runs the server's side of the binary port's authentication step on a blocking `stream`,
/// the whole step by `deadline` however the client trickles its bytes. A refusal is sent to the
/// client as the poller sends it (an ERROR reply with the step's words, which the client's
/// [`authenticate_client`] returns as `Refused`) and returned; the caller closes the
/// connection. The stream's read timeout is restored on success.
///
/// # Errors
/// `Refused` (the step's words), `Malformed`, `Unexpected` (an oversized frame), `Io` (a
/// timeout among them).
pub fn authenticate_server_by(
    stream: &mut std::net::TcpStream,
    secret: &Arc<SharedSecret>,
    deadline: Instant,
) -> Result<(), AuthError> {
    let previous = stream.read_timeout()?;
    let mut auth = ServerAuth::new(Arc::clone(secret));
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + AUTH_BYTES);
    loop {
        let (header, body) = read_auth_frame(stream, deadline)?;
        out.clear();
        match auth.on_frame(header.kind, &body) {
            AuthStep::Reply(frame) => frame.encode_frame(0, &mut out),
            AuthStep::Accepted(frame) => {
                frame.encode_frame(0, &mut out);
                stream.write_all(&out)?;
                stream.set_read_timeout(previous)?;
                return Ok(());
            }
            AuthStep::Deny(message) | AuthStep::Refuse(message) => {
                Response::bad_request(message.as_str()).encode_frame(header.request_id, &mut out);
                // The refusal is a courtesy: the connection closes whether or not it arrives.
                let _ = stream.write_all(&out);
                return Err(AuthError::Refused { message });
            }
        }
        stream.write_all(&out)?;
    }
}

/// Fills `buffer` from `stream`, every read bounded by `deadline`.
fn read_exact_by(stream: &mut std::net::TcpStream, buffer: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buffer.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "authentication step not finished in time"));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Reads one frame of the authentication step (either side's) by `deadline`, its body bounded
/// by `AUTH_REPLY_BODY_BYTES_MAX` before anything is allocated.
fn read_auth_frame(stream: &mut std::net::TcpStream, deadline: Instant) -> Result<(FrameHeader, Vec<u8>), AuthError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    read_exact_by(stream, &mut header, deadline)?;
    let header = FrameHeader::decode(&header)?;
    if header.body_length as usize > AUTH_REPLY_BODY_BYTES_MAX {
        return Err(AuthError::Unexpected { kind: header.kind });
    }
    let mut body = vec![0u8; header.body_length as usize];
    read_exact_by(stream, &mut body, deadline)?;
    Ok((header, body))
}

/// The configuration-service port's authentication: the binary port's step under the cluster's
/// shared secret, the node that dials proving like a client and the node that accepts checking
/// like a server (`rampkv_config::auth` says where it runs).
#[derive(Debug, Clone)]
pub struct ConfigPortAuth(pub Arc<SharedSecret>);

impl rampkv_config::auth::PortAuthenticator for ConfigPortAuth {
    fn prove(&self, stream: &mut std::net::TcpStream) -> Result<(), rampkv_config::auth::AuthFailure> {
        Ok(authenticate_client(stream, &self.0)?)
    }

    fn check(
        &self,
        stream: &mut std::net::TcpStream,
        deadline: Instant,
    ) -> Result<(), rampkv_config::auth::AuthFailure> {
        Ok(authenticate_server_by(stream, &self.0, deadline)?)
    }
}

/// Reads one frame of the server's by `deadline` and decodes it as an authentication frame (an
/// ERROR is a refusal with its message).
fn read_auth_reply(stream: &mut std::net::TcpStream, deadline: Instant) -> Result<AuthFrame, AuthError> {
    let (header, body) = read_auth_frame(stream, deadline)?;
    if AuthFrame::is_auth_kind(header.kind) {
        return Ok(AuthFrame::decode(header.kind, &body)?);
    }
    match Response::decode(header.kind, &body)? {
        Response::Error { message, .. } => Err(AuthError::Refused { message }),
        _ => Err(AuthError::Unexpected { kind: header.kind }),
    }
}

/// The server's side of the binary port's authentication step on one connection (see the
/// module docs). Until it accepts, the connection gets no other service.
#[derive(Debug)]
pub struct ServerAuth {
    secret: Arc<SharedSecret>,
    /// The client's nonce and our challenge, once the client began.
    begun: Option<([u8; AUTH_BYTES], [u8; AUTH_BYTES])>,
}

/// What the server does with one frame of a connection not yet authenticated.
#[derive(Debug)]
pub enum AuthStep {
    /// Send this frame; the step goes on.
    Reply(AuthFrame),
    /// Send this frame (the server's proof): the connection is authenticated.
    Accepted(AuthFrame),
    /// Send an ERROR with this message; the connection stays unauthenticated (a request
    /// before the step: a client without the secret, which may have pipelined more requests,
    /// each of which gets the same answer; closing with its requests unread would reset the
    /// connection and could lose this reply).
    Deny(String),
    /// Send an ERROR with this message and close the connection (the step failed: the client
    /// waits for this reply, so nothing of its is left unread).
    Refuse(String),
}

impl ServerAuth {
    /// A connection that must authenticate with `secret`.
    pub fn new(secret: Arc<SharedSecret>) -> Self {
        Self { secret, begun: None }
    }

    /// Handles one frame of the connection (`kind`, `body`).
    pub fn on_frame(&mut self, kind: u8, body: &[u8]) -> AuthStep {
        if !AuthFrame::is_auth_kind(kind) {
            return AuthStep::Deny(
                "authentication required: this server has a shared secret; connect with --secret-file naming \
                 the same file as the server's"
                    .to_owned(),
            );
        }
        let frame = match AuthFrame::decode(kind, body) {
            Ok(frame) => frame,
            Err(error) => return AuthStep::Refuse(format!("malformed authentication frame: {error}")),
        };
        match (frame, self.begun) {
            (AuthFrame::Begin { nonce }, None) => match random_token() {
                Ok(challenge) => {
                    self.begun = Some((nonce, challenge));
                    AuthStep::Reply(AuthFrame::Challenge { challenge })
                }
                Err(error) => AuthStep::Refuse(format!("the server has no random challenge to give: {error}")),
            },
            (AuthFrame::Proof { proof }, Some((nonce, challenge))) => {
                if self.secret.verify(ProofLabel::BinaryClient, &challenge, &nonce, &proof) {
                    let proof = self.secret.proof(ProofLabel::BinaryServer, &nonce, &challenge);
                    AuthStep::Accepted(AuthFrame::Accepted { proof })
                } else {
                    AuthStep::Refuse("wrong proof: the client's secret is not the server's".to_owned())
                }
            }
            _ => AuthStep::Refuse("authentication frames out of order".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> SharedSecret {
        SharedSecret::from_bytes((0..32).collect()).unwrap()
    }

    #[test]
    fn proofs_verify_only_with_the_same_secret_label_and_inputs() {
        let (nonce, challenge) = ([1u8; AUTH_BYTES], [2u8; AUTH_BYTES]);
        let secret = secret();
        let proof = secret.proof(ProofLabel::BinaryClient, &challenge, &nonce);
        assert!(secret.verify(ProofLabel::BinaryClient, &challenge, &nonce, &proof));
        assert!(!secret.verify(ProofLabel::BinaryServer, &challenge, &nonce, &proof), "labels separate");
        assert!(!secret.verify(ProofLabel::ControlClient, &challenge, &nonce, &proof), "ports separate");
        assert!(!secret.verify(ProofLabel::BinaryClient, &nonce, &challenge, &proof), "order matters");
        let other = SharedSecret::from_bytes((1..33).collect()).unwrap();
        assert!(!other.verify(ProofLabel::BinaryClient, &challenge, &nonce, &proof), "another secret");
        let mut flipped = proof;
        flipped[31] ^= 1;
        assert!(!secret.verify(ProofLabel::BinaryClient, &challenge, &nonce, &flipped));
        // HMAC-SHA-256 as RFC 4231 defines it (test case 2: key "Jefe").
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap().chain_update(b"what do ya want for nothing?");
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let hex: String = mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(hex, expected);
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        let directory = std::env::temp_dir().join(format!("rampkv-secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("secret");
        let write = |bytes: &[u8], mode: u32| {
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&[7; 32], 0o600);
        assert!(SharedSecret::from_file(&path).is_ok());
        write(&[7; 32], 0o400);
        assert!(SharedSecret::from_file(&path).is_ok());
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            write(&[7; 32], mode);
            let error = SharedSecret::from_file(&path).unwrap_err();
            assert!(matches!(error, SecretError::Permissions { .. }), "mode {mode:o}: {error}");
            assert!(error.to_string().contains("chmod 600"), "{error}");
        }
        write(&[7; 31], 0o600);
        assert!(matches!(SharedSecret::from_file(&path), Err(SecretError::TooShort { bytes: 31, min: 32 })));
        write(&vec![7; SECRET_BYTES_MAX + 1], 0o600);
        assert!(matches!(SharedSecret::from_file(&path), Err(SecretError::TooLong { .. })));
        let missing = directory.join("missing");
        assert!(matches!(SharedSecret::from_file(&missing), Err(SecretError::Read { .. })));
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
