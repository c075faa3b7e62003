//! The CoreWorkload properties, their YCSB defaults, and the shipped workloads A to F.
//!
//! [`CoreWorkloadConfig::from_properties`] reads the same names with the same defaults as
//! YCSB's `CoreWorkload.init`. Names it does not know are ignored (they belong to the client or
//! the database binding); [`unrecognized_properties`] lists them so a driver can warn about
//! typos. Values it cannot use are errors that name the property and the accepted values.
//!
//! # Deviations from YCSB's parsing (all stricter, none changes a valid workload)
//! - `recordcount=0` (or unset) is an error; YCSB silently uses 2^31 - 1.
//! - A negative proportion is an error; YCSB skips it.
//! - `insertorder` must be `hashed` or `ordered`; YCSB treats any other word as `ordered`.
//! - Booleans must be `true`/`false`; Java reads any other word as false.
//! - `requestdistribution=sequential|exponential` and `fieldlengthdistribution=histogram` are
//!   not implemented and say so.
//! - The zipfian constant is YCSB's fixed 0.99 (CoreWorkload has no property for it either).

use crate::key::{InsertOrder, KeyNames};
use crate::limits::{FIELD_COUNT_MAX, RECORD_BYTES_MAX};
use crate::{Error, Expected, Properties};

/// The property names this crate reads, as YCSB spells them.
pub mod names {
    /// Records loaded before the run (`Client.RECORD_COUNT_PROPERTY`).
    pub const RECORD_COUNT: &str = "recordcount";
    /// Operations of the run phase.
    pub const OPERATION_COUNT: &str = "operationcount";
    /// First key number this client loads (parallel loads).
    pub const INSERT_START: &str = "insertstart";
    /// Keys this client loads (default `recordcount - insertstart`).
    pub const INSERT_COUNT: &str = "insertcount";
    /// Fields per record.
    pub const FIELD_COUNT: &str = "fieldcount";
    /// Bytes per field (the maximum, for non-constant distributions).
    pub const FIELD_LENGTH: &str = "fieldlength";
    /// Smallest field, for non-constant distributions.
    pub const MIN_FIELD_LENGTH: &str = "minfieldlength";
    /// `constant`, `uniform` or `zipfian`.
    pub const FIELD_LENGTH_DISTRIBUTION: &str = "fieldlengthdistribution";
    /// Field name prefix (`field0`, `field1`, ...).
    pub const FIELD_NAME_PREFIX: &str = "fieldnameprefix";
    /// Whether reads read all fields.
    pub const READ_ALL_FIELDS: &str = "readallfields";
    /// Whether updates write all fields.
    pub const WRITE_ALL_FIELDS: &str = "writeallfields";
    /// Proportion of reads.
    pub const READ_PROPORTION: &str = "readproportion";
    /// Proportion of updates.
    pub const UPDATE_PROPORTION: &str = "updateproportion";
    /// Proportion of inserts.
    pub const INSERT_PROPORTION: &str = "insertproportion";
    /// Proportion of scans.
    pub const SCAN_PROPORTION: &str = "scanproportion";
    /// Proportion of read-modify-writes.
    pub const READ_MODIFY_WRITE_PROPORTION: &str = "readmodifywriteproportion";
    /// `uniform`, `zipfian`, `latest` or `hotspot`.
    pub const REQUEST_DISTRIBUTION: &str = "requestdistribution";
    /// Hot fraction of the keys (hotspot).
    pub const HOTSPOT_DATA_FRACTION: &str = "hotspotdatafraction";
    /// Fraction of operations that go to the hot keys (hotspot).
    pub const HOTSPOT_OPERATION_FRACTION: &str = "hotspotopnfraction";
    /// Shortest scan.
    pub const MIN_SCAN_LENGTH: &str = "minscanlength";
    /// Longest scan.
    pub const MAX_SCAN_LENGTH: &str = "maxscanlength";
    /// `uniform` or `zipfian`.
    pub const SCAN_LENGTH_DISTRIBUTION: &str = "scanlengthdistribution";
    /// `hashed` or `ordered`.
    pub const INSERT_ORDER: &str = "insertorder";
    /// Minimum digits of the number in a key name.
    pub const ZERO_PADDING: &str = "zeropadding";

    /// Every name above.
    pub const ALL: [&str; 24] = [
        RECORD_COUNT,
        OPERATION_COUNT,
        INSERT_START,
        INSERT_COUNT,
        FIELD_COUNT,
        FIELD_LENGTH,
        MIN_FIELD_LENGTH,
        FIELD_LENGTH_DISTRIBUTION,
        FIELD_NAME_PREFIX,
        READ_ALL_FIELDS,
        WRITE_ALL_FIELDS,
        READ_PROPORTION,
        UPDATE_PROPORTION,
        INSERT_PROPORTION,
        SCAN_PROPORTION,
        READ_MODIFY_WRITE_PROPORTION,
        REQUEST_DISTRIBUTION,
        HOTSPOT_DATA_FRACTION,
        HOTSPOT_OPERATION_FRACTION,
        MIN_SCAN_LENGTH,
        MAX_SCAN_LENGTH,
        SCAN_LENGTH_DISTRIBUTION,
        INSERT_ORDER,
        ZERO_PADDING,
    ];
}

/// Names that are not settings of this generator but are expected in YCSB files: the client's
/// (`workload`, `threadcount`, ...) and CoreWorkload's own that do not apply to rampkv (a table
/// name, field selection by name for reads, insertion retries, which the driver owns). Not
/// reported by [`unrecognized_properties`].
const IGNORED_PROPERTY_NAMES: [&str; 10] = [
    "workload",
    "db",
    "table",
    "threadcount",
    "target",
    "maxexecutiontime",
    "readallfieldsbyname",
    "dataintegrity",
    "core_workload_insertion_retry_limit",
    "core_workload_insertion_retry_interval",
];

/// `dataintegrity=true` asks YCSB to write deterministic values and verify every read; that
/// is not implemented (rampkv's own checker verifies reads through histories instead).
const DATA_INTEGRITY: &str = "dataintegrity";

/// Properties that are neither CoreWorkload settings read here nor common client settings:
/// likely typos (YCSB ignores them silently).
pub fn unrecognized_properties(properties: &Properties) -> Vec<&str> {
    properties
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !names::ALL.contains(name) && !IGNORED_PROPERTY_NAMES.contains(name))
        .collect()
}

/// How often each operation is chosen. Need not sum to 1: YCSB normalizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Proportions {
    /// `readproportion` (YCSB default 0.95).
    pub read: f64,
    /// `updateproportion` (default 0.05).
    pub update: f64,
    /// `insertproportion` (default 0).
    pub insert: f64,
    /// `scanproportion` (default 0).
    pub scan: f64,
    /// `readmodifywriteproportion` (default 0).
    pub read_modify_write: f64,
}

impl Default for Proportions {
    fn default() -> Self {
        Proportions { read: 0.95, update: 0.05, insert: 0.0, scan: 0.0, read_modify_write: 0.0 }
    }
}

impl Proportions {
    /// Normalized shares in the order read, update, insert, scan, read-modify-write.
    pub fn normalized(&self) -> [f64; 5] {
        let all = [self.read, self.update, self.insert, self.scan, self.read_modify_write];
        let sum: f64 = all.iter().sum();
        all.map(|proportion| if sum > 0.0 { proportion / sum } else { 0.0 })
    }
}

/// `requestdistribution`: how keys are chosen for reads, updates, scans and read-modify-writes.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RequestDistribution {
    /// Every loaded key equally likely (YCSB's default).
    Uniform,
    /// Scrambled zipfian (constant 0.99) over the loaded keys plus room for expected inserts.
    Zipfian,
    /// The most recently inserted keys are the most popular.
    Latest,
    /// `hot_data_fraction` of the keys get `hot_operation_fraction` of the requests.
    Hotspot {
        /// `hotspotdatafraction` (default 0.2).
        hot_data_fraction: f64,
        /// `hotspotopnfraction` (default 0.8).
        hot_operation_fraction: f64,
    },
}

/// `fieldlengthdistribution`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldLengthDistribution {
    /// Every field is `fieldlength` bytes (YCSB's default).
    #[default]
    Constant,
    /// Uniform in `[minfieldlength, fieldlength]`.
    Uniform,
    /// Zipfian over `[minfieldlength, fieldlength]`, favouring short fields.
    Zipfian,
}

/// `scanlengthdistribution`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScanLengthDistribution {
    /// Uniform in `[minscanlength, maxscanlength]` (YCSB's default).
    #[default]
    Uniform,
    /// Zipfian over `[minscanlength, maxscanlength]`, favouring short scans.
    Zipfian,
}

/// Every setting of a YCSB core workload. [`Default`] gives YCSB's defaults, except that
/// `record_count` must be set (see the module docs).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct CoreWorkloadConfig {
    /// `recordcount`: keys loaded before the run.
    pub record_count: u64,
    /// `operationcount`: operations of the run. The generator does not stop by itself; it
    /// uses this only to size the zipfian key space for expected inserts, as YCSB does.
    pub operation_count: u64,
    /// `insertstart` (default 0).
    pub insert_start: u64,
    /// `insertcount`; `None` means `record_count - insert_start`.
    pub insert_count: Option<u64>,
    /// `fieldcount` (default 10).
    pub field_count: u64,
    /// `fieldlength` (default 100).
    pub field_length: u64,
    /// `minfieldlength` (default 1).
    pub min_field_length: u64,
    /// `fieldlengthdistribution` (default constant).
    pub field_length_distribution: FieldLengthDistribution,
    /// `fieldnameprefix` (default "field").
    pub field_name_prefix: String,
    /// `readallfields` (default true). rampkv reads whole values, so this changes nothing
    /// in the generated transactions; it is kept for reporting.
    pub read_all_fields: bool,
    /// `writeallfields` (default false): updates write one random field, or all of them.
    pub write_all_fields: bool,
    /// The five operation proportions.
    pub proportions: Proportions,
    /// `requestdistribution` (default uniform).
    pub request_distribution: RequestDistribution,
    /// `minscanlength` (default 1).
    pub min_scan_length: u64,
    /// `maxscanlength` (default 1000).
    pub max_scan_length: u64,
    /// `scanlengthdistribution` (default uniform).
    pub scan_length_distribution: ScanLengthDistribution,
    /// `insertorder` (default hashed).
    pub insert_order: InsertOrder,
    /// `zeropadding` (default 1).
    pub zero_padding: usize,
}

impl Default for CoreWorkloadConfig {
    fn default() -> Self {
        CoreWorkloadConfig {
            record_count: 0,
            operation_count: 0,
            insert_start: 0,
            insert_count: None,
            field_count: 10,
            field_length: 100,
            min_field_length: 1,
            field_length_distribution: FieldLengthDistribution::Constant,
            field_name_prefix: "field".to_string(),
            read_all_fields: true,
            write_all_fields: false,
            proportions: Proportions::default(),
            request_distribution: RequestDistribution::Uniform,
            min_scan_length: 1,
            max_scan_length: 1000,
            scan_length_distribution: ScanLengthDistribution::Uniform,
            insert_order: InsertOrder::Hashed,
            zero_padding: 1,
        }
    }
}

impl CoreWorkloadConfig {
    /// Reads a configuration from YCSB properties, with YCSB's defaults for unset names.
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] naming the first property with a value that cannot be
    /// used, and what would be accepted.
    pub fn from_properties(properties: &Properties) -> Result<Self, Error> {
        use names::*;
        let defaults = CoreWorkloadConfig::default();
        if properties.boolean_or(DATA_INTEGRITY, false)? {
            return Err(Error::invalid(
                DATA_INTEGRITY,
                "true",
                "not implemented by rampkv-ycsb (use rampkv's history checker)",
            ));
        }
        let insert_count = match properties.get(INSERT_COUNT) {
            None => None,
            Some(_) => Some(properties.unsigned_or(INSERT_COUNT, 0)?),
        };
        let proportion = |name: &str, default: f64| properties.number_or(name, default);
        let config = CoreWorkloadConfig {
            record_count: properties.unsigned_or(RECORD_COUNT, defaults.record_count)?,
            operation_count: properties.unsigned_or(OPERATION_COUNT, defaults.operation_count)?,
            insert_start: properties.unsigned_or(INSERT_START, defaults.insert_start)?,
            insert_count,
            field_count: properties.unsigned_or(FIELD_COUNT, defaults.field_count)?,
            field_length: properties.unsigned_or(FIELD_LENGTH, defaults.field_length)?,
            min_field_length: properties.unsigned_or(MIN_FIELD_LENGTH, defaults.min_field_length)?,
            field_length_distribution: parse_field_length_distribution(properties)?,
            field_name_prefix: properties.string_or(FIELD_NAME_PREFIX, &defaults.field_name_prefix).to_string(),
            read_all_fields: properties.boolean_or(READ_ALL_FIELDS, defaults.read_all_fields)?,
            write_all_fields: properties.boolean_or(WRITE_ALL_FIELDS, defaults.write_all_fields)?,
            proportions: Proportions {
                read: proportion(READ_PROPORTION, defaults.proportions.read)?,
                update: proportion(UPDATE_PROPORTION, defaults.proportions.update)?,
                insert: proportion(INSERT_PROPORTION, defaults.proportions.insert)?,
                scan: proportion(SCAN_PROPORTION, defaults.proportions.scan)?,
                read_modify_write: proportion(READ_MODIFY_WRITE_PROPORTION, defaults.proportions.read_modify_write)?,
            },
            request_distribution: parse_request_distribution(properties)?,
            min_scan_length: properties.unsigned_or(MIN_SCAN_LENGTH, defaults.min_scan_length)?,
            max_scan_length: properties.unsigned_or(MAX_SCAN_LENGTH, defaults.max_scan_length)?,
            scan_length_distribution: parse_scan_length_distribution(properties)?,
            insert_order: parse_insert_order(properties)?,
            zero_padding: usize::try_from(properties.unsigned_or(ZERO_PADDING, 1)?).unwrap_or(usize::MAX),
        };
        config.validate()?;
        Ok(config)
    }

    /// `insertcount`, resolved: `record_count - insert_start` when unset.
    pub fn resolved_insert_count(&self) -> u64 {
        self.insert_count.unwrap_or(self.record_count.saturating_sub(self.insert_start))
    }

    /// How many key numbers beyond the loaded ones the zipfian key chooser covers:
    /// YCSB's `expectednewkeys = (int) (operationcount * insertproportion * 2.0)`, where 2
    /// is YCSB's fudge factor and the proportion is the raw, unnormalized one.
    pub fn expected_new_keys(&self) -> u64 {
        let expected = self.operation_count as f64 * self.proportions.insert * 2.0;
        // Java's (int) cast: truncates and saturates at i32::MAX.
        (expected as i32).max(0) as u64
    }

    /// Checks what the generators need and YCSB does not check (or checks by crashing).
    ///
    /// # Errors
    /// [`Error::InvalidConfiguration`] naming the property at fault.
    pub fn validate(&self) -> Result<(), Error> {
        use names::*;
        if self.record_count == 0 {
            return Err(Error::invalid(
                RECORD_COUNT,
                self.record_count,
                "must be at least 1 (YCSB silently uses 2^31 - 1 for 0; set it explicitly)",
            ));
        }
        let insert_count = self.resolved_insert_count();
        let insert_end = self.insert_start.checked_add(insert_count);
        if insert_count == 0 || !matches!(insert_end, Some(end) if end <= self.record_count) {
            return Err(Error::invalid(
                INSERT_COUNT,
                insert_count,
                Expected::AtMostSetting {
                    setting: "recordcount - insertstart",
                    value: self.record_count.saturating_sub(self.insert_start),
                },
            ));
        }
        if !(1..=FIELD_COUNT_MAX).contains(&self.field_count) {
            return Err(Error::invalid(
                FIELD_COUNT,
                self.field_count,
                Expected::Range { min: 1, max: FIELD_COUNT_MAX },
            ));
        }
        let record_bytes = self.field_count.checked_mul(self.field_length);
        if !matches!(record_bytes, Some(bytes) if bytes <= RECORD_BYTES_MAX) {
            return Err(Error::invalid(
                FIELD_LENGTH,
                self.field_length,
                Expected::AtMost {
                    max: RECORD_BYTES_MAX,
                    unit: "bytes of fieldcount * fieldlength (a record is one value)",
                },
            ));
        }
        if self.field_length_distribution != FieldLengthDistribution::Constant
            && self.min_field_length > self.field_length
        {
            return Err(Error::invalid(
                MIN_FIELD_LENGTH,
                self.min_field_length,
                Expected::AtMostSetting { setting: FIELD_LENGTH, value: self.field_length },
            ));
        }
        self.validate_proportions()?;
        if self.min_scan_length > self.max_scan_length {
            return Err(Error::invalid(
                MIN_SCAN_LENGTH,
                self.min_scan_length,
                Expected::AtMostSetting { setting: MAX_SCAN_LENGTH, value: self.max_scan_length },
            ));
        }
        KeyNames::new(self.insert_order, self.zero_padding)?;
        Ok(())
    }

    fn validate_proportions(&self) -> Result<(), Error> {
        use names::*;
        let proportions = &self.proportions;
        for (name, value) in [
            (READ_PROPORTION, proportions.read),
            (UPDATE_PROPORTION, proportions.update),
            (INSERT_PROPORTION, proportions.insert),
            (SCAN_PROPORTION, proportions.scan),
            (READ_MODIFY_WRITE_PROPORTION, proportions.read_modify_write),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Error::invalid(name, value, "must be a finite number >= 0"));
            }
        }
        if proportions.normalized().iter().all(|&share| share == 0.0) {
            return Err(Error::invalid(
                "proportions",
                "all zero",
                "at least one operation proportion must be positive",
            ));
        }
        Ok(())
    }
}

fn parse_request_distribution(properties: &Properties) -> Result<RequestDistribution, Error> {
    use names::*;
    let value = properties.string_or(REQUEST_DISTRIBUTION, "uniform");
    match value {
        "uniform" => Ok(RequestDistribution::Uniform),
        "zipfian" => Ok(RequestDistribution::Zipfian),
        "latest" => Ok(RequestDistribution::Latest),
        "hotspot" => Ok(RequestDistribution::Hotspot {
            hot_data_fraction: properties.number_or(HOTSPOT_DATA_FRACTION, 0.2)?,
            hot_operation_fraction: properties.number_or(HOTSPOT_OPERATION_FRACTION, 0.8)?,
        }),
        "sequential" | "exponential" => Err(Error::invalid(
            REQUEST_DISTRIBUTION,
            value,
            "not implemented by rampkv-ycsb; use uniform, zipfian, latest or hotspot",
        )),
        _ => Err(Error::invalid(REQUEST_DISTRIBUTION, value, "unknown; expected uniform, zipfian, latest or hotspot")),
    }
}

fn parse_field_length_distribution(properties: &Properties) -> Result<FieldLengthDistribution, Error> {
    let name = names::FIELD_LENGTH_DISTRIBUTION;
    match properties.string_or(name, "constant") {
        "constant" => Ok(FieldLengthDistribution::Constant),
        "uniform" => Ok(FieldLengthDistribution::Uniform),
        "zipfian" => Ok(FieldLengthDistribution::Zipfian),
        "histogram" => {
            Err(Error::invalid(name, "histogram", "not implemented by rampkv-ycsb; use constant, uniform or zipfian"))
        }
        other => Err(Error::invalid(name, other, "unknown; expected constant, uniform or zipfian")),
    }
}

fn parse_scan_length_distribution(properties: &Properties) -> Result<ScanLengthDistribution, Error> {
    let name = names::SCAN_LENGTH_DISTRIBUTION;
    match properties.string_or(name, "uniform") {
        "uniform" => Ok(ScanLengthDistribution::Uniform),
        "zipfian" => Ok(ScanLengthDistribution::Zipfian),
        other => Err(Error::invalid(name, other, "not allowed for scan length; expected uniform or zipfian")),
    }
}

fn parse_insert_order(properties: &Properties) -> Result<InsertOrder, Error> {
    let name = names::INSERT_ORDER;
    match properties.string_or(name, "hashed") {
        "hashed" => Ok(InsertOrder::Hashed),
        "ordered" => Ok(InsertOrder::Ordered),
        other => Err(Error::invalid(name, other, "expected hashed or ordered")),
    }
}

/// The workloads shipped with YCSB (`workloads/workloada` ... `workloadf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BuiltinWorkload {
    /// Update heavy: 50% reads, 50% updates, zipfian.
    A,
    /// Read mostly: 95% reads, 5% updates, zipfian.
    B,
    /// Read only: 100% reads, zipfian.
    C,
    /// Read latest: 95% reads, 5% inserts, latest.
    D,
    /// Short ranges: 95% scans, 5% inserts, zipfian; scans of 1..=100 records, uniform.
    E,
    /// Read-modify-write: 50% reads, 50% read-modify-writes, zipfian.
    F,
}

impl BuiltinWorkload {
    /// All six, in order.
    pub const ALL: [BuiltinWorkload; 6] = [Self::A, Self::B, Self::C, Self::D, Self::E, Self::F];

    /// Accepts `a`, `A`, `workloada` (any case).
    pub fn from_name(name: &str) -> Option<Self> {
        let lowered = name.to_ascii_lowercase();
        let letter = lowered.strip_prefix("workload").unwrap_or(&lowered);
        Self::ALL.into_iter().find(|workload| workload.letter().eq_ignore_ascii_case(letter))
    }

    /// YCSB's file name, e.g. `workloada`.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::A => "workloada",
            Self::B => "workloadb",
            Self::C => "workloadc",
            Self::D => "workloadd",
            Self::E => "workloade",
            Self::F => "workloadf",
        }
    }

    fn letter(self) -> &'static str {
        &self.file_name()["workload".len()..]
    }

    /// The settings of YCSB's shipped file, in its order.
    pub fn property_pairs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::A => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "0.5"),
                ("updateproportion", "0.5"),
                ("scanproportion", "0"),
                ("insertproportion", "0"),
                ("requestdistribution", "zipfian"),
            ],
            Self::B => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "0.95"),
                ("updateproportion", "0.05"),
                ("scanproportion", "0"),
                ("insertproportion", "0"),
                ("requestdistribution", "zipfian"),
            ],
            Self::C => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "1"),
                ("updateproportion", "0"),
                ("scanproportion", "0"),
                ("insertproportion", "0"),
                ("requestdistribution", "zipfian"),
            ],
            Self::D => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "0.95"),
                ("updateproportion", "0"),
                ("scanproportion", "0"),
                ("insertproportion", "0.05"),
                ("requestdistribution", "latest"),
            ],
            Self::E => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "0"),
                ("updateproportion", "0"),
                ("scanproportion", "0.95"),
                ("insertproportion", "0.05"),
                ("requestdistribution", "zipfian"),
                ("maxscanlength", "100"),
                ("scanlengthdistribution", "uniform"),
            ],
            Self::F => &[
                ("recordcount", "1000"),
                ("operationcount", "1000"),
                ("workload", "site.ycsb.workloads.CoreWorkload"),
                ("readallfields", "true"),
                ("readproportion", "0.5"),
                ("updateproportion", "0"),
                ("scanproportion", "0"),
                ("insertproportion", "0"),
                ("readmodifywriteproportion", "0.5"),
                ("requestdistribution", "zipfian"),
            ],
        }
    }

    /// The shipped file's settings as [`Properties`], ready for overrides such as
    /// `recordcount` before [`CoreWorkloadConfig::from_properties`].
    pub fn properties(self) -> Properties {
        let mut properties = Properties::new();
        for &(name, value) in self.property_pairs() {
            properties.set(name, value);
        }
        properties
    }

    /// The shipped file's settings as property-file text.
    pub fn property_file_text(self) -> String {
        let mut text = format!("# YCSB {} (rampkv-ycsb built-in)\n", self.file_name());
        for (name, value) in self.property_pairs() {
            text.push_str(name);
            text.push('=');
            text.push_str(value);
            text.push('\n');
        }
        text
    }

    /// The configuration, built directly (the tests check it equals the parsed file).
    pub fn config(self) -> CoreWorkloadConfig {
        let (proportions, request_distribution) = match self {
            Self::A => (proportions(0.5, 0.5, 0.0, 0.0, 0.0), RequestDistribution::Zipfian),
            Self::B => (proportions(0.95, 0.05, 0.0, 0.0, 0.0), RequestDistribution::Zipfian),
            Self::C => (proportions(1.0, 0.0, 0.0, 0.0, 0.0), RequestDistribution::Zipfian),
            Self::D => (proportions(0.95, 0.0, 0.05, 0.0, 0.0), RequestDistribution::Latest),
            Self::E => (proportions(0.0, 0.0, 0.05, 0.95, 0.0), RequestDistribution::Zipfian),
            Self::F => (proportions(0.5, 0.0, 0.0, 0.0, 0.5), RequestDistribution::Zipfian),
        };
        CoreWorkloadConfig {
            record_count: 1000,
            operation_count: 1000,
            proportions,
            request_distribution,
            max_scan_length: if self == Self::E { 100 } else { 1000 },
            ..CoreWorkloadConfig::default()
        }
    }
}

fn proportions(read: f64, update: f64, insert: f64, scan: f64, read_modify_write: f64) -> Proportions {
    Proportions { read, update, insert, scan, read_modify_write }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_files_parse_to_builtin_configs() {
        for workload in BuiltinWorkload::ALL {
            let from_pairs =
                CoreWorkloadConfig::from_properties(&workload.properties()).expect("built-in properties are valid");
            assert_eq!(from_pairs, workload.config(), "{workload:?}");
            let text = workload.property_file_text();
            let from_text =
                CoreWorkloadConfig::from_properties(&Properties::parse(&text).expect("valid")).expect("valid");
            assert_eq!(from_text, workload.config(), "{workload:?} text");
            assert!(unrecognized_properties(&workload.properties()).is_empty());
        }
    }

    #[test]
    fn builtin_names() {
        assert_eq!(BuiltinWorkload::from_name("a"), Some(BuiltinWorkload::A));
        assert_eq!(BuiltinWorkload::from_name("WorkloadF"), Some(BuiltinWorkload::F));
        assert_eq!(BuiltinWorkload::from_name("workloadg"), None);
        assert_eq!(BuiltinWorkload::from_name(""), None);
        assert_eq!(BuiltinWorkload::E.file_name(), "workloade");
    }

    #[test]
    fn defaults_are_ycsb_defaults() {
        let config =
            CoreWorkloadConfig::from_properties(&Properties::parse("recordcount=10").expect("valid")).expect("valid");
        assert_eq!(config.field_count, 10);
        assert_eq!(config.field_length, 100);
        assert_eq!(config.field_length_distribution, FieldLengthDistribution::Constant);
        assert!(config.read_all_fields);
        assert!(!config.write_all_fields);
        assert_eq!(config.proportions, Proportions::default());
        assert_eq!(config.request_distribution, RequestDistribution::Uniform);
        assert_eq!(config.max_scan_length, 1000);
        assert_eq!(config.insert_order, InsertOrder::Hashed);
        assert_eq!(config.zero_padding, 1);
        assert_eq!(config.resolved_insert_count(), 10);
    }

    #[test]
    fn full_file_parses() {
        let text = "recordcount=5000\noperationcount=100000\ninsertstart=1000\n\
                    insertcount=2000\nfieldcount=4\nfieldlength=250\nminfieldlength=10\n\
                    fieldlengthdistribution=uniform\nwriteallfields=true\nreadallfields=false\n\
                    readproportion=0.2\nupdateproportion=0.3\ninsertproportion=0.1\n\
                    scanproportion=0.25\nreadmodifywriteproportion=0.15\n\
                    requestdistribution=hotspot\nhotspotdatafraction=0.1\n\
                    hotspotopnfraction=0.9\nminscanlength=5\nmaxscanlength=50\n\
                    scanlengthdistribution=zipfian\ninsertorder=ordered\nzeropadding=12\n\
                    fieldnameprefix=f\nthreadcount=8\n";
        let properties = Properties::parse(text).expect("valid");
        let config = CoreWorkloadConfig::from_properties(&properties).expect("valid");
        assert_eq!(config.record_count, 5000);
        assert_eq!(config.resolved_insert_count(), 2000);
        assert_eq!(config.field_length_distribution, FieldLengthDistribution::Uniform);
        assert!(config.write_all_fields && !config.read_all_fields);
        assert_eq!(
            config.request_distribution,
            RequestDistribution::Hotspot { hot_data_fraction: 0.1, hot_operation_fraction: 0.9 }
        );
        assert_eq!(config.scan_length_distribution, ScanLengthDistribution::Zipfian);
        assert_eq!(config.insert_order, InsertOrder::Ordered);
        assert_eq!(config.zero_padding, 12);
        assert_eq!(config.field_name_prefix, "f");
        assert_eq!(config.expected_new_keys(), 20_000);
        assert!(unrecognized_properties(&properties).is_empty());
    }

    /// Every bad value names its property.
    #[test]
    fn bad_properties_are_errors() {
        let cases = [
            ("recordcount=1000\nrequestdistribution=zipf", "requestdistribution"),
            ("recordcount=1000\nrequestdistribution=exponential", "requestdistribution"),
            ("recordcount=1000\ninsertorder=random", "insertorder"),
            ("recordcount=1000\nscanlengthdistribution=constant", "scanlengthdistribution"),
            ("recordcount=1000\nfieldlengthdistribution=histogram", "fieldlengthdistribution"),
            ("recordcount=1000\nreadproportion=-0.5", "readproportion"),
            ("recordcount=1000\nreadproportion=abc", "readproportion"),
            ("recordcount=1000\nreadproportion=0\nupdateproportion=0", "proportions"),
            ("recordcount=-5", "recordcount"),
            ("recordcount=0", "recordcount"),
            ("operationcount=10", "recordcount"),
            ("recordcount=10\ninsertstart=5\ninsertcount=6", "insertcount"),
            ("recordcount=10\nfieldcount=0", "fieldcount"),
            ("recordcount=10\nfieldlength=100000", "fieldlength"),
            ("recordcount=10\nfieldlengthdistribution=uniform\nminfieldlength=200", "minfieldlength"),
            ("recordcount=10\nminscanlength=20\nmaxscanlength=10", "minscanlength"),
            ("recordcount=10\nzeropadding=1000", "zeropadding"),
            ("recordcount=10\nwriteallfields=yes", "writeallfields"),
            ("recordcount=10\ndataintegrity=true", "dataintegrity"),
            ("recordcount=10\nrequestdistribution=hotspot\nhotspotopnfraction=x", "hotspotopnfraction"),
        ];
        for (text, property) in cases {
            let properties = Properties::parse(text).expect("syntax is fine");
            let error = CoreWorkloadConfig::from_properties(&properties).expect_err(&format!("should reject {text:?}"));
            match &error {
                Error::InvalidConfiguration { name, .. } => {
                    assert_eq!(name, property, "for {text:?}: {error}")
                }
                other => panic!("unexpected error {other} for {text:?}"),
            }
            println!("{error}");
        }
    }

    #[test]
    fn typos_are_reported() {
        let properties = Properties::parse("recordcount=10\nreadproprotion=0.5\ntable=usertable").expect("valid");
        assert_eq!(unrecognized_properties(&properties), vec!["readproprotion"]);
    }
}
