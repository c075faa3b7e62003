//! The shared-memory fabric: the default, and the honest emulation of RDMA on one machine.
//!
//! # What stands for what
//! - A registered region is a file `/dev/shm/rampkv-<pid>-<name>-<nonce>` (tmpfs: memory only),
//!   created with mode 0600 and mapped `MAP_SHARED` by its owner. `<nonce>` is 128 random bits
//!   (32 hex digits) drawn per region, so that nobody can create a region's file before its
//!   owner does (see "Other users" below). Its descriptor is the file name, length and access.
//! - Mapping a peer's region opens that file and maps it: `PROT_READ` for a
//!   [`Access::ReadOnly`] region (a client cannot write server data even by mistake: it would
//!   fault), `PROT_READ | PROT_WRITE` for [`Access::ReadWrite`].
//! - A one-sided operation is a CPU load, store or atomic on the mapping, done by the calling
//!   thread. No thread of the owner takes part, exactly as with an RDMA NIC.
//!
//! # Fault model
//! A peer may write any word at any moment (another process, outside our memory model's
//! reach), so every access is an 8-byte relaxed atomic through [`Words`]; no reference to the
//! mapped bytes is ever created. Region files are removed when the owner's [`ShmLocalRegion`]
//! drops (clean exit); a crashed owner leaves its files, which [`cleanup_stale`] removes on
//! the next start once that pid is no longer alive. Mappings survive the file's removal, so a
//! peer that mapped a region keeps valid memory until it drops its handle.
//!
//! What this does not emulate: no NIC, no PCIe, no network latency, no in-bound/out-bound
//! asymmetry. Words of one read are in fact loaded in address order here, and x86 keeps
//! stores in order, but real RDMA promises neither, so no code in this crate relies on it.
//! Access rights are enforced by mapping protection for well-behaved peers only: all processes
//! run as one user, so a peer that forges a `ReadWrite` descriptor can map any region writable
//! (RDMA enforces rights with per-registration keys instead).
//!
//! # Other users
//! /dev/shm is shared by every user of the machine (mode 1777: anyone may create files, only a
//! file's owner may remove it, anyone may list names). Region files are 0600, so another user can
//! neither read nor map them. Starting never depends on other users' files: [`cleanup_stale`]
//! only touches files of this user and skips what it cannot remove, and a region's file name
//! carries a fresh random nonce, so another user cannot block a registration by creating the file
//! first (names with a predictable pid and counter could be squatted). What the nonce does not
//! do: hide names (anyone can list /dev/shm), or keep out a process of the *same* user, which can
//! open any region file (see docs/security.md).
//!
//! All `unsafe` of the crate lives in this module and in `futex` (the doorbell's system calls).

use crate::fabric::{Access, Fabric, FabricError, OneSided, RegionDescriptor};
use crate::futex::{futex_wait, futex_wake_all};
use crate::limits::{
    REGION_NAME_BYTES_MAX, REGION_NONCE_BYTES, SHM_DIRECTORY, SHM_FILE_PREFIX, STALE_SCAN_ENTRIES_MAX, WORD_BYTES,
};
use crate::region::check_length;
use crate::words::{self, FenceOrdering, LoadOrdering, StoreOrdering, Words};
use memmap2::{Mmap, MmapMut, MmapOptions};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shared-memory fabric of this process.
#[derive(Clone, Copy, Debug)]
pub struct ShmFabric {
    pid: u32,
}

impl ShmFabric {
    /// The fabric of this process. Removes region files left by dead processes first (see
    /// [`cleanup_stale`]), so that a crashed run does not leak memory into the next.
    ///
    /// # Errors
    /// `Io` if /dev/shm cannot be listed.
    pub fn new() -> Result<Self, FabricError> {
        cleanup_stale()?;
        Ok(Self { pid: std::process::id() })
    }

    fn file_name(&self, name: &str, nonce: &str) -> String {
        format!("{SHM_FILE_PREFIX}{}-{name}-{nonce}", self.pid)
    }
}

/// Names registered by this process and not yet dropped: the `Fabric` contract refuses a name
/// registered twice, which the per-region nonce would otherwise allow.
static REGISTERED_NAMES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Claims `name` in [`REGISTERED_NAMES`] until dropped.
#[derive(Debug)]
struct NameClaim(Option<String>);

impl NameClaim {
    fn take(name: &str) -> Result<NameClaim, FabricError> {
        let mut names = REGISTERED_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !names.insert(name.to_owned()) {
            return Err(FabricError::InvalidRegion { name: name.to_owned(), reason: "name already registered" });
        }
        Ok(NameClaim(Some(name.to_owned())))
    }
}

impl Drop for NameClaim {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            REGISTERED_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&name);
        }
    }
}

/// `REGION_NONCE_BYTES` random bytes from the kernel, as lower-case hex.
fn random_nonce() -> Result<String, FabricError> {
    let mut bytes = [0u8; REGION_NONCE_BYTES];
    File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|source| FabricError::Io { name: "/dev/urandom".to_owned(), source })?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// A region this process registered. Dropping it removes the region file (peers that already
/// mapped it keep their mapping).
#[derive(Debug)]
pub struct ShmLocalRegion {
    mapping: Mapping,
    descriptor: RegionDescriptor,
    path: PathBuf,
    // Fields drop after `Drop::drop` removed the file: the name is free again only then.
    _claim: NameClaim,
}

impl ShmLocalRegion {
    /// The descriptor peers need to map this region.
    pub fn descriptor(&self) -> &RegionDescriptor {
        &self.descriptor
    }

    /// The first byte of the owner's mapping and its length in bytes: what the verbs fabric
    /// registers with the device (`ibv_reg_mr`). The mapping lives as long as `self`.
    pub(crate) fn mapped_range(&self) -> (*mut u8, usize) {
        (self.mapping.base.as_ptr().cast::<u8>(), self.mapping.len_words * WORD_BYTES)
    }
}

impl Drop for ShmLocalRegion {
    fn drop(&mut self) {
        // A missing file is fine (cleanup_stale of a process that reused our pid cannot
        // happen, but an operator may have removed it); nothing else can be done in drop.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A peer's region mapped into this process. Cloning shares the mapping.
#[derive(Clone, Debug)]
pub struct ShmRemoteRegion {
    mapping: Arc<Mapping>,
    access: Access,
}

/// One `mmap` of a region file, accessed only as atomic words.
#[derive(Debug)]
struct Mapping {
    base: NonNull<AtomicU64>,
    len_words: usize,
    writable: bool,
    // Keeps the mapping alive; never dereferenced as bytes.
    _map: MapHolder,
}

#[derive(Debug)]
enum MapHolder {
    ReadOnly(#[allow(dead_code)] Mmap),
    ReadWrite(#[allow(dead_code)] MmapMut),
}

// SAFETY: `Mapping` owns its mmap; the memory is only ever accessed through atomic operations
// (`&AtomicU64`), which are safe to perform from any thread, so sharing and sending the raw
// base pointer between threads cannot create a data race.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: every access through `&Mapping` is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn read_only(map: Mmap) -> Self {
        let len_words = map.len() / WORD_BYTES;
        let base = NonNull::new(map.as_ptr() as *mut AtomicU64).expect("mmap returned null");
        Self { base, len_words, writable: false, _map: MapHolder::ReadOnly(map) }
    }

    fn read_write(mut map: MmapMut) -> Self {
        let len_words = map.len() / WORD_BYTES;
        let base = NonNull::new(map.as_mut_ptr() as *mut AtomicU64).expect("mmap returned null");
        Self { base, len_words, writable: true, _map: MapHolder::ReadWrite(map) }
    }

    /// The word at `index`; panics when out of range (a caller bug: ranges are checked first).
    #[inline]
    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < self.len_words, "word {index} outside a mapping of {} words", self.len_words);
        // SAFETY: `index < len_words`, so the address lies inside the mapping, which lives as
        // long as `self`. The mapping is page-aligned and the offset a multiple of 8, so the
        // pointer is aligned for `AtomicU64`. All processes access this memory only through
        // atomic operations, so viewing it as `AtomicU64` does not race with plain accesses.
        unsafe { &*self.base.as_ptr().add(index) }
    }

    /// All words as a slice (for the bulk copy).
    fn all_words(&self) -> &[AtomicU64] {
        // SAFETY: `base` points to `len_words` aligned words that live as long as `self` and
        // are only ever accessed atomically (see `word`).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len_words) }
    }

    fn assert_writable(&self) {
        // A store to a PROT_READ mapping would fault; the fabric returns NoWriteAccess before
        // ever getting here, so this is a cheap second line of defence.
        assert!(self.writable, "store to a read-only mapping");
    }
}

impl Words for Mapping {
    #[inline]
    fn len_words(&self) -> usize {
        self.len_words
    }
    #[inline]
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        words::std_load(self.word(index), ordering)
    }
    #[inline]
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        self.assert_writable();
        words::std_store(self.word(index), value, ordering)
    }
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
        self.assert_writable();
        match self.word(index).compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(previous) | Err(previous) => previous,
        }
    }
    fn fetch_add(&self, index: usize, add: u64) -> u64 {
        self.assert_writable();
        self.word(index).fetch_add(add, Ordering::AcqRel)
    }
    #[inline]
    fn fence(&self, ordering: FenceOrdering) {
        words::std_fence(ordering)
    }
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration) {
        futex_wait(self.word(index), expected_low, timeout)
    }
    fn wake_all(&self, index: usize) {
        futex_wake_all(self.word(index))
    }
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        words::copy_out_atomics(self.all_words(), first_index, dst)
    }
    fn copy_in(&self, first_index: usize, src: &[u8]) {
        self.assert_writable();
        words::copy_in_atomics(self.all_words(), first_index, src)
    }
}

impl Words for ShmLocalRegion {
    crate::words::delegate_words!(mapping);
}

impl OneSided for ShmFabric {
    type RemoteRegion = ShmRemoteRegion;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        remote.mapping.len_words * WORD_BYTES
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        words::read_bytes(&*remote.mapping, offset_bytes, dst)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        words::write_bytes(&*remote.mapping, remote.access, offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        words::compare_and_swap(&*remote.mapping, remote.access, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        words::fetch_add(&*remote.mapping, remote.access, offset_bytes, add)
    }
    #[inline]
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        words::read_word(&*remote.mapping, offset_bytes, ordering)
    }
    #[inline]
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        words::write_word(&*remote.mapping, remote.access, offset_bytes, value, ordering)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        words::wake(&*remote.mapping, remote.access, offset_bytes)
    }
}

impl Fabric for ShmFabric {
    type LocalRegion = ShmLocalRegion;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        check_registered_name(name)?;
        check_length(name, len_bytes as u64)?;
        let claim = NameClaim::take(name)?;
        let file_name = self.file_name(name, &random_nonce()?);
        let path = PathBuf::from(SHM_DIRECTORY).join(&file_name);
        let io_error = |source| FabricError::Io { name: file_name.clone(), source };
        // O_EXCL: never open a file someone else put there (with 128 random bits, an existing
        // file means a broken random source, not bad luck).
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(|source| {
                match source.kind() {
                    ErrorKind::AlreadyExists => {
                        FabricError::InvalidRegion { name: file_name.clone(), reason: "region file already exists" }
                    }
                    _ => io_error(source),
                }
            })?;
        // From here on the file exists: the region owns it, so an error below removes it.
        let cleanup = RemoveOnError(Some(path.clone()));
        file.set_len(len_bytes as u64).map_err(io_error)?;
        // SAFETY: the file was just created by us (O_EXCL) with mode 0600 and has exactly
        // `len_bytes`; the owner never shrinks it, so the mapping stays backed. Other
        // processes may write it concurrently, which is why it is only accessed atomically.
        let map = unsafe { MmapOptions::new().len(len_bytes).map_mut(&file) }.map_err(io_error)?;
        cleanup.disarm();
        Ok(ShmLocalRegion {
            mapping: Mapping::read_write(map),
            descriptor: RegionDescriptor::new(file_name, len_bytes as u64, access),
            path,
            _claim: claim,
        })
    }

    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        local.descriptor.clone()
    }

    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        let name = &descriptor.name;
        check_file_name(name)?;
        check_length(name, descriptor.len_bytes)?;
        let path = PathBuf::from(SHM_DIRECTORY).join(name);
        let open = match descriptor.access {
            Access::ReadOnly => File::open(&path),
            Access::ReadWrite => OpenOptions::new().read(true).write(true).open(&path),
        };
        let file = open.map_err(|source| match source.kind() {
            ErrorKind::NotFound => FabricError::RegionMissing { name: name.clone() },
            _ => FabricError::Io { name: name.clone(), source },
        })?;
        let io_error = |source| FabricError::Io { name: name.clone(), source };
        let file_len_bytes = file.metadata().map_err(io_error)?.len();
        if file_len_bytes != descriptor.len_bytes {
            return Err(FabricError::InvalidRegion {
                name: name.clone(),
                reason: "descriptor length differs from the region's",
            });
        }
        let len_bytes = descriptor.len_bytes as usize;
        let mapping = match descriptor.access {
            Access::ReadOnly => {
                // SAFETY: the file has `len_bytes` (checked above) and its owner never shrinks
                // it. The mapping is PROT_READ and only read with atomic loads.
                let map = unsafe { MmapOptions::new().len(len_bytes).map(&file) }.map_err(io_error)?;
                Mapping::read_only(map)
            }
            Access::ReadWrite => {
                // SAFETY: as above; the shared writable mapping is only accessed atomically.
                let map = unsafe { MmapOptions::new().len(len_bytes).map_mut(&file) }.map_err(io_error)?;
                Mapping::read_write(map)
            }
        };
        Ok(ShmRemoteRegion { mapping: Arc::new(mapping), access: descriptor.access })
    }
}

/// Removes a half-created region file if registration fails.
struct RemoveOnError(Option<PathBuf>);

impl RemoveOnError {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnError {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.')
}

/// A name given to `register`: 1..=REGION_NAME_BYTES_MAX bytes of `[A-Za-z0-9_.-]`, starting
/// with a letter or digit.
fn check_registered_name(name: &str) -> Result<(), FabricError> {
    let reason = if name.is_empty() || name.len() > REGION_NAME_BYTES_MAX {
        "name must have 1 to REGION_NAME_BYTES_MAX bytes"
    } else if !name.bytes().all(is_name_byte) || !name.as_bytes()[0].is_ascii_alphanumeric() {
        "name may only contain [A-Za-z0-9_.-] and must start with a letter or digit"
    } else {
        return Ok(());
    };
    Err(FabricError::InvalidRegion { name: name.to_owned(), reason })
}

/// A name from a peer's descriptor: `rampkv-<pid>-<registered name>-<nonce>`, nothing that could
/// leave /dev/shm.
fn check_file_name(name: &str) -> Result<(), FabricError> {
    let registered_and_nonce = parse_file_name(name).map(|(_, rest)| rest);
    let well_formed = registered_and_nonce.and_then(|rest| rest.rsplit_once('-')).is_some_and(|(registered, nonce)| {
        check_registered_name(registered).is_ok()
            && nonce.len() == 2 * REGION_NONCE_BYTES
            && nonce.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    });
    if well_formed {
        Ok(())
    } else {
        Err(FabricError::InvalidRegion {
            name: name.to_owned(),
            reason: "not a rampkv region file name (rampkv-<pid>-<name>-<nonce>)",
        })
    }
}

/// Splits `rampkv-<pid>-<rest>` into (pid, rest).
fn parse_file_name(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix(SHM_FILE_PREFIX)?;
    let (pid, registered) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    Some((pid, registered))
}

/// Whether process `pid` exists (a zombie counts as alive; a reused pid looks alive, which
/// only means a stale file is kept a little longer).
fn process_alive(pid: u32) -> bool {
    // pid 0 and values beyond pid_t would address process groups or be invalid: never signal.
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists and
    // may be signalled. No memory is passed.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// What one [`cleanup_stale`] pass did with the region files of dead processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StaleCleanup {
    /// Files of this user whose owner process is gone, removed.
    pub removed: usize,
    /// Files of other users, left alone (only their owner may remove them, and they are theirs).
    pub foreign: usize,
    /// Files of this user that could not be removed (the error is not ours to fix: skipped).
    pub failed: usize,
}

/// Removes region files (`rampkv-<pid>-*` under /dev/shm) of this user whose owner process is
/// gone. Looks at most at `STALE_SCAN_ENTRIES_MAX` entries. Files of this process and of live
/// processes are kept; files of other users and files that cannot be removed are skipped and
/// counted, never an error: nothing another user puts in /dev/shm can stop a start.
///
/// # Errors
/// `Io` if /dev/shm cannot be listed.
pub fn cleanup_stale() -> Result<StaleCleanup, FabricError> {
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let user = unsafe { libc::geteuid() };
    cleanup_stale_in(Path::new(SHM_DIRECTORY), user)
}

/// [`cleanup_stale`] over `directory`, for the files of `user`.
fn cleanup_stale_in(directory: &Path, user: libc::uid_t) -> Result<StaleCleanup, FabricError> {
    let io_error = |source| FabricError::Io { name: directory.display().to_string(), source };
    let own_pid = std::process::id();
    let mut outcome = StaleCleanup::default();
    for entry in std::fs::read_dir(directory).map_err(io_error)?.take(STALE_SCAN_ENTRIES_MAX) {
        let Ok(entry) = entry else { continue };
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let Some((pid, _)) = parse_file_name(name) else {
            continue;
        };
        if pid == own_pid || process_alive(pid) {
            continue;
        }
        // Not followed if it is a symbolic link: the owner of the entry itself counts.
        let Ok(metadata) = entry.metadata() else {
            continue; // vanished meanwhile
        };
        if metadata.uid() != user {
            outcome.foreign += 1;
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => outcome.removed += 1,
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(_) => outcome.failed += 1,
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    /// Region names unique within this test process (tests run in parallel).
    fn unique(name: &str) -> String {
        format!("unit-{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    #[test]
    fn register_map_read_write_and_remove_on_drop() {
        let fabric = ShmFabric::new().unwrap();
        let local = fabric.register(&unique("rw"), 4096, Access::ReadWrite).unwrap();
        let descriptor = fabric.describe(&local);
        assert!(descriptor.name.starts_with(&format!("rampkv-{}-unit-rw-", std::process::id())));
        let remote = fabric.map(&descriptor).unwrap();
        fabric.write(&remote, 16, b"hello fabric").unwrap();
        let mut buf = [0u8; 12];
        fabric.read(&remote, 16, &mut buf).unwrap();
        assert_eq!(&buf, b"hello fabric");
        // The owner sees the peer's write through its own mapping.
        assert_eq!(local.load(2, LoadOrdering::Acquire), u64::from_le_bytes(*b"hello fa"));
        assert_eq!(fabric.fetch_add(&remote, 0, 5).unwrap(), 0);
        assert_eq!(fabric.compare_and_swap(&remote, 0, 5, 9).unwrap(), 5);
        assert_eq!(local.load(0, LoadOrdering::Relaxed), 9);
        assert!(matches!(fabric.read(&remote, 4096, &mut buf), Err(FabricError::OutOfBounds { .. })));
        let path = PathBuf::from(SHM_DIRECTORY).join(&descriptor.name);
        assert!(path.exists());
        drop(local);
        assert!(!path.exists());
        // The peer's mapping outlives the file.
        assert_eq!(fabric.read_word(&remote, 0, LoadOrdering::Relaxed).unwrap(), 9);
        assert!(matches!(fabric.map(&descriptor), Err(FabricError::RegionMissing { .. })));
    }

    #[test]
    fn read_only_regions_refuse_writes_and_atomics() {
        let fabric = ShmFabric::new().unwrap();
        let local = fabric.register(&unique("ro"), 64, Access::ReadOnly).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        local.store(0, 7, StoreOrdering::Release);
        assert_eq!(fabric.read_word(&remote, 0, LoadOrdering::Acquire).unwrap(), 7);
        assert!(matches!(fabric.write(&remote, 0, b"x"), Err(FabricError::NoWriteAccess)));
        assert!(matches!(fabric.compare_and_swap(&remote, 0, 7, 8), Err(FabricError::NoWriteAccess)));
        assert!(matches!(fabric.fetch_add(&remote, 0, 1), Err(FabricError::NoWriteAccess)));
        assert!(matches!(fabric.wake(&remote, 0), Err(FabricError::NoWriteAccess)));
        assert!(!remote.mapping.writable);
    }

    #[test]
    fn bad_names_and_descriptors_are_errors_not_panics() {
        let fabric = ShmFabric::new().unwrap();
        for name in ["", "a/b", "..", "x y", &"n".repeat(REGION_NAME_BYTES_MAX + 1)] {
            assert!(
                matches!(fabric.register(name, 64, Access::ReadOnly), Err(FabricError::InvalidRegion { .. })),
                "{name:?}"
            );
        }
        let name = unique("dup");
        let _first = fabric.register(&name, 64, Access::ReadOnly).unwrap();
        assert!(fabric.register(&name, 64, Access::ReadOnly).is_err());
        assert!(fabric.register(&unique("len"), 12, Access::ReadOnly).is_err());
        let nonce = "0123456789abcdef0123456789abcdef";
        for bad in [
            "../etc/passwd".to_owned(),
            "rampkv-12-../x".to_owned(),
            "rampkv--x".to_owned(),
            "other-1-x".to_owned(),
            "rampkv-1".to_owned(),
            "rampkv-1-x".to_owned(),                        // no nonce
            format!("rampkv-1-x-{}", &nonce[1..]),          // short nonce
            format!("rampkv-1-x-{}", nonce.to_uppercase()), // not as we write it
            format!("rampkv-1-../x-{nonce}"),
        ] {
            let descriptor = RegionDescriptor::new(bad.clone(), 64, Access::ReadOnly);
            assert!(matches!(fabric.map(&descriptor), Err(FabricError::InvalidRegion { .. })), "{bad}");
        }
        let mut descriptor = fabric.describe(&_first);
        descriptor.len_bytes = 128;
        assert!(matches!(fabric.map(&descriptor), Err(FabricError::InvalidRegion { .. })));
    }

    #[test]
    fn cleanup_stale_removes_files_of_dead_processes_only() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dead = PathBuf::from(SHM_DIRECTORY).join(format!("rampkv-{dead_pid}-stale-test"));
        std::fs::write(&dead, b"x").unwrap();
        let fabric = ShmFabric::new().unwrap();
        let own = fabric.register(&unique("keep"), 64, Access::ReadOnly).unwrap();
        cleanup_stale().unwrap();
        assert!(!dead.exists(), "file of dead pid {dead_pid} kept");
        assert!(PathBuf::from(SHM_DIRECTORY).join(&own.descriptor().name).exists());
    }

    /// A pid that no process has (the child has been reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// Issue 15: an empty file `/dev/shm/rampkv-99999-x` of another user stopped every
    /// non-root rampkv process from starting: removing it failed (EPERM: /dev/shm is sticky)
    /// and the error went up. Files of other users are now left alone and files that cannot be
    /// removed are skipped. Here in a directory of our own: "another user" is a uid that is not
    /// ours (what `cleanup_stale` compares), and "cannot be removed" a directory under a region
    /// file's name (unlink fails, as it does with EPERM, for root too).
    #[test]
    fn cleanup_skips_files_of_other_users_and_files_it_cannot_remove() {
        let directory = std::env::temp_dir().join(format!("rampkv-cleanup-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let pid = dead_pid();
        let stale = directory.join(format!("rampkv-{pid}-stale"));
        let unremovable = directory.join(format!("rampkv-{pid}-unremovable"));
        let unrelated = directory.join("other-file");
        std::fs::write(&stale, b"").unwrap();
        std::fs::create_dir(&unremovable).unwrap();
        std::fs::write(&unrelated, b"").unwrap();
        // SAFETY: geteuid cannot fail and takes no memory.
        let user = unsafe { libc::geteuid() };

        let as_another_user = cleanup_stale_in(&directory, user.wrapping_add(1)).unwrap();
        assert_eq!(as_another_user, StaleCleanup { removed: 0, foreign: 2, failed: 0 });
        assert!(stale.exists(), "another user's file removed");

        let as_owner = cleanup_stale_in(&directory, user).unwrap();
        assert_eq!(as_owner, StaleCleanup { removed: 1, foreign: 0, failed: 1 });
        assert!(!stale.exists() && unremovable.exists() && unrelated.exists());
        std::fs::remove_dir_all(&directory).unwrap();
    }

    /// Region file names carry a random nonce: a file another user put at the name an earlier
    /// version would have used (pid and name, both predictable) does not stop a registration,
    /// and two processes' regions of one name never collide.
    #[test]
    fn a_file_at_the_predictable_name_does_not_block_a_registration() {
        let fabric = ShmFabric::new().unwrap();
        let name = unique("squat");
        let squatted = PathBuf::from(SHM_DIRECTORY).join(format!("rampkv-{}-{name}", std::process::id()));
        std::fs::write(&squatted, b"").unwrap();
        let registered = fabric.register(&name, 64, Access::ReadWrite);
        std::fs::remove_file(&squatted).unwrap();
        let region = registered.unwrap();
        let file_name = &region.descriptor().name;
        let nonce = file_name.rsplit_once('-').unwrap().1;
        assert_eq!(nonce.len(), 2 * REGION_NONCE_BYTES, "{file_name}");
        assert!(check_file_name(file_name).is_ok());
        let again = fabric.register(&unique("squat"), 64, Access::ReadWrite).unwrap();
        assert_ne!(again.descriptor().name.rsplit_once('-').unwrap().1, nonce, "a fresh nonce per region");
        // The name is free again once the region is dropped.
        drop(region);
        assert!(fabric.register(&name, 64, Access::ReadWrite).is_ok());
    }
}
