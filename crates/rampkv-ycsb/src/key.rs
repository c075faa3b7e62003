//! Key names: YCSB's `CoreWorkload.buildKeyName`.
//!
//! ```text
//! number = insertorder == hashed ? fnvhash64(key_number) : key_number   (a Java long)
//! digits = Long.toString(number)
//! name   = "user" + "0" * max(0, zeropadding - len(digits)) + digits
//! ```
//!
//! With the default `insertorder=hashed` and `zeropadding=1`, key number 0 is
//! `user6284781860667377211`. Generators work with key numbers (cheap integers) and format a
//! name only when a caller needs the bytes; formatting writes into a stack buffer
//! ([`KeyName`]) or appends to a caller's reusable `Vec`, never allocating on its own.

use std::fmt;

use crate::hash::fnv_hash64;
use crate::limits::{KEY_NAME_BYTES_MAX, ZERO_PADDING_MAX};
use crate::{Error, Expected};

/// YCSB's hard-coded key prefix.
pub const KEY_PREFIX: &[u8] = b"user";

/// Whether key numbers are scattered by hashing before they become names (YCSB `insertorder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InsertOrder {
    /// `insertorder=hashed` (YCSB's default): the name carries `fnvhash64(key_number)`, so
    /// consecutive inserts land far apart in key order.
    #[default]
    Hashed,
    /// `insertorder=ordered`: the name carries the key number itself.
    Ordered,
}

/// How key numbers become key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyNames {
    insert_order: InsertOrder,
    zero_padding: usize,
}

impl KeyNames {
    /// Names for `insert_order` with `zero_padding` (YCSB's default is 1, i.e. no padding).
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] if `zero_padding` exceeds [`ZERO_PADDING_MAX`].
    pub fn new(insert_order: InsertOrder, zero_padding: usize) -> Result<Self, Error> {
        if zero_padding > ZERO_PADDING_MAX {
            return Err(Error::invalid(
                "zeropadding",
                zero_padding,
                Expected::AtMost { max: ZERO_PADDING_MAX as u64, unit: "digits" },
            ));
        }
        Ok(KeyNames { insert_order, zero_padding })
    }

    /// The name of `key_number`, in a stack buffer.
    #[inline]
    pub fn name(&self, key_number: u64) -> KeyName {
        let mut digits = [0u8; DECIMAL_BYTES_MAX];
        let digit_count = write_decimal(self.number(key_number), &mut digits);
        let fill = self.zero_padding.saturating_sub(digit_count);
        let mut name = KeyName { bytes: [b'0'; KEY_NAME_BYTES_MAX], length: 0 };
        let prefix_end = KEY_PREFIX.len();
        name.bytes[..prefix_end].copy_from_slice(KEY_PREFIX);
        // Bytes [prefix_end, prefix_end + fill) are already '0'.
        let digits_start = prefix_end + fill;
        let end = digits_start + digit_count;
        name.bytes[digits_start..end].copy_from_slice(&digits[DECIMAL_BYTES_MAX - digit_count..]);
        name.length = end as u8;
        name
    }

    /// Appends the name of `key_number` to `out` (which a caller reuses across keys).
    #[inline]
    pub fn append_name(&self, key_number: u64, out: &mut Vec<u8>) {
        // Written straight into `out` rather than through a `KeyName`: one copy fewer.
        let mut digits = [0u8; DECIMAL_BYTES_MAX];
        let digit_count = write_decimal(self.number(key_number), &mut digits);
        let fill = self.zero_padding.saturating_sub(digit_count);
        out.extend_from_slice(KEY_PREFIX);
        out.resize(out.len() + fill, b'0');
        out.extend_from_slice(&digits[DECIMAL_BYTES_MAX - digit_count..]);
    }

    /// The number printed in the name: YCSB works in Java `long`s, so the key number is
    /// read as an `i64` (it never exceeds `i64::MAX` in practice) and hashed as one.
    #[inline]
    fn number(&self, key_number: u64) -> i64 {
        match self.insert_order {
            InsertOrder::Hashed => fnv_hash64(key_number as i64),
            InsertOrder::Ordered => key_number as i64,
        }
    }

    /// The configured insert order.
    pub fn insert_order(&self) -> InsertOrder {
        self.insert_order
    }

    /// The configured zero padding.
    pub fn zero_padding(&self) -> usize {
        self.zero_padding
    }
}

impl Default for KeyNames {
    /// YCSB's defaults: hashed, zero padding 1.
    fn default() -> Self {
        KeyNames { insert_order: InsertOrder::Hashed, zero_padding: 1 }
    }
}

/// A formatted key name, held on the stack.
#[derive(Clone, Copy)]
pub struct KeyName {
    bytes: [u8; KEY_NAME_BYTES_MAX],
    length: u8,
}

impl KeyName {
    /// The name's bytes (ASCII).
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.length)]
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, '-' and the prefix are ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl fmt::Debug for KeyName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "KeyName({:?})", self.as_str())
    }
}

impl PartialEq for KeyName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for KeyName {}

/// Longest decimal `i64`: a sign and 19 digits.
pub(crate) const DECIMAL_BYTES_MAX: usize = 20;

/// Two-digit lookup: "00", "01", ... "99". Halves the divisions of digit-by-digit printing.
const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes `number` in decimal (Java `Long.toString`) right-aligned into `out`, returning how
/// many bytes it used.
///
/// Hashed key numbers have 19 digits. Printing them two digits per division is a chain of ten
/// dependent divisions; instead the number is cut into blocks of eight digits (at most two
/// divisions), and each block is printed as four independent digit pairs.
#[inline]
pub(crate) fn write_decimal(number: i64, out: &mut [u8; DECIMAL_BYTES_MAX]) -> usize {
    const BLOCK: u64 = 100_000_000;
    let mut magnitude = number.unsigned_abs();
    let mut start = DECIMAL_BYTES_MAX;
    while magnitude >= BLOCK {
        let block = (magnitude % BLOCK) as u32;
        magnitude /= BLOCK;
        start -= 8;
        write_eight_digits(block, &mut out[start..start + 8]);
    }
    let mut rest = magnitude as u32;
    while rest >= 100 {
        start -= 2;
        write_pair(rest % 100, &mut out[start..start + 2]);
        rest /= 100;
    }
    if rest >= 10 {
        start -= 2;
        write_pair(rest, &mut out[start..start + 2]);
    } else {
        start -= 1;
        out[start] = b'0' + rest as u8;
    }
    if number < 0 {
        start -= 1;
        out[start] = b'-';
    }
    DECIMAL_BYTES_MAX - start
}

/// Exactly eight digits (with leading zeros) of `block < 10^8`.
#[inline]
fn write_eight_digits(block: u32, out: &mut [u8]) {
    let (high, low) = (block / 10_000, block % 10_000);
    write_pair(high / 100, &mut out[0..2]);
    write_pair(high % 100, &mut out[2..4]);
    write_pair(low / 100, &mut out[4..6]);
    write_pair(low % 100, &mut out[6..8]);
}

/// Two digits of `pair < 100`.
#[inline]
fn write_pair(pair: u32, out: &mut [u8]) {
    let index = pair as usize * 2;
    out.copy_from_slice(&DIGIT_PAIRS[index..index + 2]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_names_match_ycsb() {
        let names = KeyNames::default();
        assert_eq!(names.name(0).as_str(), "user6284781860667377211");
        assert_eq!(names.name(1).as_str(), "user8517097267634966620");
        assert_eq!(names.name(999).as_str(), "user2071219101098386137");
    }

    #[test]
    fn ordered_names_and_padding() {
        let ordered = KeyNames::new(InsertOrder::Ordered, 1).expect("valid");
        assert_eq!(ordered.name(0).as_str(), "user0");
        assert_eq!(ordered.name(5).as_str(), "user5");
        assert_eq!(ordered.name(1234).as_str(), "user1234");
        // YCSB's javadoc example: row 5 with zeropadding=8 is 'user00000005'.
        let padded = KeyNames::new(InsertOrder::Ordered, 8).expect("valid");
        assert_eq!(padded.name(5).as_str(), "user00000005");
        assert_eq!(padded.name(123_456_789).as_str(), "user123456789");
        let hashed_padded = KeyNames::new(InsertOrder::Hashed, 25).expect("valid");
        assert_eq!(hashed_padded.name(0).as_str(), "user0000006284781860667377211");
        let widest = KeyNames::new(InsertOrder::Ordered, ZERO_PADDING_MAX).expect("valid");
        assert_eq!(widest.name(7).as_bytes().len(), KEY_NAME_BYTES_MAX);
    }

    #[test]
    fn padding_limit_is_an_error() {
        assert!(KeyNames::new(InsertOrder::Hashed, ZERO_PADDING_MAX + 1).is_err());
    }

    #[test]
    fn decimal_matches_std_formatting() {
        let seed = 21;
        println!("seed {seed}");
        let mut random = crate::Random::new(seed);
        let check = |number: i64| {
            let mut out = [0u8; DECIMAL_BYTES_MAX];
            let length = write_decimal(number, &mut out);
            assert_eq!(&out[DECIMAL_BYTES_MAX - length..], number.to_string().as_bytes());
        };
        for number in
            [0, 1, 9, 10, 99, 100, 101, 999, 1000, 99_999_999, 100_000_000, 100_000_001, i64::MAX, i64::MIN, -1, -10]
        {
            check(number);
        }
        for _ in 0..10_000 {
            check(random.next_u64() as i64);
            check((random.next_u64() % 100_000) as i64);
        }
    }

    #[test]
    fn append_reuses_buffer() {
        let names = KeyNames::new(InsertOrder::Ordered, 1).expect("valid");
        let mut buffer = Vec::with_capacity(64);
        names.append_name(1, &mut buffer);
        names.append_name(22, &mut buffer);
        assert_eq!(buffer, b"user1user22");
    }

    #[test]
    fn append_equals_name() {
        let seed = 22;
        println!("seed {seed}");
        let mut random = crate::Random::new(seed);
        for (order, padding) in [(InsertOrder::Hashed, 1), (InsertOrder::Ordered, 12), (InsertOrder::Hashed, 30)] {
            let names = KeyNames::new(order, padding).expect("valid");
            let mut buffer = Vec::new();
            for _ in 0..1000 {
                let key_number = random.below(1 << 45);
                buffer.clear();
                names.append_name(key_number, &mut buffer);
                assert_eq!(buffer, names.name(key_number).as_bytes());
            }
        }
    }
}
