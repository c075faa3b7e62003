//! A crash-simulating storage medium for redb (tests only): the fault model of the durable
//! Raft state as data, not a mock.
//!
//! The medium keeps what survives a crash (every write before the last completed sync) apart
//! from what the process sees. A test lets a number of operations (writes, resizes, syncs)
//! through and fails the rest, as a process killed in the middle of a commit; then
//! [`Medium::after_crash`] keeps any subset of the writes since the last sync, as a power cut
//! may (the drive wrote some of them, in any order), and redb reopens that image.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::Rng;

#[derive(Debug, Clone)]
enum Operation {
    Write { offset: u64, bytes: Vec<u8> },
    SetLength(u64),
}

/// The bytes of a medium: what a crash keeps and what the process sees.
#[derive(Debug, Clone, Default)]
pub(crate) struct Medium {
    durable: Vec<u8>,
    visible: Vec<u8>,
    unsynced: Vec<Operation>,
    /// Operations let through before the "crash" (`None`: no crash); then every one fails.
    operations_left: Option<usize>,
    /// Operations done (to size a sweep of crash points).
    operations_done: usize,
}

impl Medium {
    /// The image a reopen finds after a crash: the durable bytes plus the unsynced operations
    /// that `rng` keeps (each with probability 1/2, in order).
    pub(crate) fn after_crash(&self, rng: &mut SmallRng) -> Medium {
        let mut bytes = self.durable.clone();
        for operation in &self.unsynced {
            if !rng.gen_bool(0.5) {
                continue;
            }
            apply(&mut bytes, operation);
        }
        Medium {
            durable: bytes.clone(),
            visible: bytes,
            unsynced: Vec::new(),
            operations_left: None,
            operations_done: 0,
        }
    }
}

fn apply(bytes: &mut Vec<u8>, operation: &Operation) {
    match operation {
        Operation::SetLength(length) => bytes.resize(*length as usize, 0),
        Operation::Write { offset, bytes: written } => {
            let end = *offset as usize + written.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[*offset as usize..end].copy_from_slice(written);
        }
    }
}

/// A redb backend over a shared [`Medium`].
#[derive(Debug, Clone, Default)]
pub(crate) struct CrashBackend(Arc<Mutex<Medium>>);

impl CrashBackend {
    pub(crate) fn over(medium: Medium) -> CrashBackend {
        CrashBackend(Arc::new(Mutex::new(medium)))
    }

    /// A copy of the medium as it is now.
    pub(crate) fn medium(&self) -> Medium {
        self.0.lock().clone()
    }

    /// Lets `operations` more through, then fails every one (the process died).
    pub(crate) fn crash_after(&self, operations: usize) {
        self.0.lock().operations_left = Some(operations);
    }

    /// Operations done since the medium was made or last counted from zero.
    pub(crate) fn operations_done(&self) -> usize {
        self.0.lock().operations_done
    }
}

fn step(medium: &mut Medium) -> io::Result<()> {
    medium.operations_done += 1;
    match &mut medium.operations_left {
        Some(0) => Err(io::Error::other("the simulated process crashed")),
        Some(left) => {
            *left -= 1;
            Ok(())
        }
        None => Ok(()),
    }
}

impl redb::StorageBackend for CrashBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.lock().visible.len() as u64)
    }

    fn read(&self, offset: u64, length: usize) -> io::Result<Vec<u8>> {
        let medium = self.0.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start.checked_add(length).filter(|end| *end <= medium.visible.len());
        let end = end.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        Ok(medium.visible[start..end].to_vec())
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        let mut medium = self.0.lock();
        step(&mut medium)?;
        let operation = Operation::SetLength(length);
        apply(&mut medium.visible, &operation);
        medium.unsynced.push(operation);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        let mut medium = self.0.lock();
        step(&mut medium)?;
        medium.durable = medium.visible.clone();
        medium.unsynced.clear();
        Ok(())
    }

    fn write(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut medium = self.0.lock();
        step(&mut medium)?;
        let operation = Operation::Write { offset, bytes: bytes.to_vec() };
        apply(&mut medium.visible, &operation);
        medium.unsynced.push(operation);
        Ok(())
    }
}
