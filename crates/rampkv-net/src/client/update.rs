//! The blocking [`Client`]'s single-key conditional writes: INCRBY, SETNX, SET XX, GETSET,
//! GETDEL and APPEND as Redis names them (`rampkv_core::protocol::update` has the semantics
//! and the retries; docs/architecture.md, "Single-key conditional writes", the argument).
//!
//! # Failover
//! An update is not idempotent (an INCR applied twice counts twice), so, unlike a write, it is
//! tried again after a failover only when the server refused it without applying it (it is not
//! the partition's primary: [`ClientError::is_not_primary`]). After a timeout or a lost
//! connection the caller gets the error: the update may or may not have been applied, as with
//! Redis.

use std::time::Duration;

use super::error::{ClientError, UpdateError};
use super::{follows_failover, Client, TxnResult};
use crate::transport::ClientTransport;
use rampkv_core::limits::{FAILOVER_CLIENT_RETRY_MS_MAX, FAILOVER_RETRY_BACKOFF_MS};
use rampkv_core::types::Timestamp;
use rampkv_core::wire::{SetCondition, SetExpiry, UpdateOp, UpdateResult};

/// What an update did, for the ops that return more than a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updated {
    /// The timestamp of the version it wrote (`None`: it wrote nothing).
    pub written: Option<Timestamp>,
    /// The value before (`None`: absent, or the op does not return it).
    pub old: Option<Vec<u8>>,
    /// The op's number (INCRBY's new value, APPEND's new length, SET's 1 or 0).
    pub integer: i64,
}

impl<T: ClientTransport> Client<T> {
    /// Applies `op` to `key` at its server, linearizably for the key. Fails with
    /// [`ClientError::Update`] when the op refused the value it found.
    pub fn update(&mut self, key: Vec<u8>, op: UpdateOp) -> Result<Updated, ClientError> {
        let deadline = std::time::Instant::now() + Duration::from_millis(FAILOVER_CLIENT_RETRY_MS_MAX);
        loop {
            match self.update_once(key.clone(), op.clone()) {
                Err(error)
                    if error.is_not_primary()
                        && follows_failover(&self.cluster)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(FAILOVER_RETRY_BACKOFF_MS));
                    let _ = self.reconnect(); // a failure shows in the next attempt
                }
                result => return result,
            }
        }
    }

    fn update_once(&mut self, key: Vec<u8>, op: UpdateOp) -> Result<Updated, ClientError> {
        self.driver.begin_update(0, key, op)?;
        let result = match self.wait()? {
            TxnResult::Update(result) => result,
            other => unreachable!("an update session finished {other:?}"),
        };
        match result {
            UpdateResult::Done { written, old, integer } => Ok(Updated { written, old, integer }),
            UpdateResult::NotAnInteger => Err(UpdateError::NotAnInteger.into()),
            UpdateResult::Overflow => Err(UpdateError::Overflow.into()),
            UpdateResult::TooLarge { bytes } => Err(UpdateError::TooLarge { bytes }.into()),
            other => unreachable!("the session retries {other:?}"),
        }
    }

    /// INCRBY: adds `delta` to the key's value read as a decimal i64 (absent: 0) and returns
    /// the sum.
    pub fn incr_by(&mut self, key: Vec<u8>, delta: i64) -> Result<i64, ClientError> {
        Ok(self.update(key, UpdateOp::IncrBy(delta))?.integer)
    }

    /// SETNX: sets the key only if it is absent; true if it did.
    pub fn set_if_absent(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<bool, ClientError> {
        let op = UpdateOp::Set { value, condition: SetCondition::IfAbsent, get_old: false, expiry: SetExpiry::Clear };
        Ok(self.update(key, op)?.written.is_some())
    }

    /// SET XX: sets the key only if it is present; true if it did.
    pub fn set_if_present(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<bool, ClientError> {
        let op = UpdateOp::Set { value, condition: SetCondition::IfPresent, get_old: false, expiry: SetExpiry::Clear };
        Ok(self.update(key, op)?.written.is_some())
    }

    /// GETSET: sets the key and returns its value before (`None`: absent).
    pub fn get_set(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<Option<Vec<u8>>, ClientError> {
        let op = UpdateOp::Set { value, condition: SetCondition::Always, get_old: true, expiry: SetExpiry::Clear };
        Ok(self.update(key, op)?.old)
    }

    /// GETDEL: deletes the key and returns its value before (`None`: it was absent).
    pub fn get_del(&mut self, key: Vec<u8>) -> Result<Option<Vec<u8>>, ClientError> {
        Ok(self.update(key, UpdateOp::GetDel)?.old)
    }

    /// APPEND: appends `suffix` to the key's value (absent: empty); returns the new length.
    pub fn append(&mut self, key: Vec<u8>, suffix: Vec<u8>) -> Result<i64, ClientError> {
        Ok(self.update(key, UpdateOp::Append(suffix))?.integer)
    }
}
