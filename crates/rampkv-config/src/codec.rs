//! Little-endian byte writing and bounds-checked reading, shared by the configuration and the
//! frame codecs. A reader never allocates more than the bytes it was given can fill.

use crate::error::ConfigError;

/// Appends fixed-width little-endian fields to a buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) bytes: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }
    pub(crate) fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }
    /// A u32 length, then the bytes.
    pub(crate) fn blob(&mut self, value: &[u8]) {
        self.u32(u32::try_from(value.len()).expect("blobs are bounded by the frame limit"));
        self.bytes.extend_from_slice(value);
    }
}

/// Reads fixed-width little-endian fields; every read checks the remaining length first.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { bytes, offset: 0, what }
    }

    pub(crate) fn error(&self, problem: &'static str) -> ConfigError {
        ConfigError::Decode { what: self.what, problem, offset: self.offset }
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], ConfigError> {
        let end = self.offset.checked_add(count).filter(|end| *end <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.error("truncated"));
        };
        let taken = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(taken)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ConfigError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, ConfigError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, ConfigError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, ConfigError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub(crate) fn blob(&mut self) -> Result<&'a [u8], ConfigError> {
        let length = self.u32()? as usize;
        self.take(length)
    }
    pub(crate) fn text(&mut self) -> Result<String, ConfigError> {
        let bytes = self.blob()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.error("text is not UTF-8"))
    }
    /// A count of items of at least `item_bytes_min` bytes each: refused when the remaining
    /// bytes cannot hold that many, so a hostile count never sizes an allocation.
    pub(crate) fn count(&mut self, item_bytes_min: usize, max: usize) -> Result<usize, ConfigError> {
        let count = self.u32()? as usize;
        let remaining = self.bytes.len() - self.offset;
        if count > max || count.saturating_mul(item_bytes_min) > remaining {
            return Err(self.error("count out of range"));
        }
        Ok(count)
    }
    pub(crate) fn finish(self) -> Result<(), ConfigError> {
        if self.offset == self.bytes.len() {
            Ok(())
        } else {
            Err(self.error("trailing bytes"))
        }
    }
}
