//! The fabric the product runs on: shared memory between processes of one host, RDMA (the
//! [`VerbsFabric`]) between hosts where both sides have an active RDMA port, chosen per peer.
//!
//! # Choice of medium (per mapped region, i.e. per peer)
//! | descriptor's host | choice `shm` | choice `auto` | choice `verbs` |
//! | --- | --- | --- | --- |
//! | absent (a plain shm peer) | shm | shm | verbs if it has an RDMA address, else `NoMedium` |
//! | ours | shm | shm | verbs if both have RDMA, else `NoMedium` |
//! | another host | `NoMedium` | verbs if both have RDMA, else `NoMedium` | the same |
//!
//! `NoMedium` is a clear error for the layer above, which falls back to TCP.
//!
//! # Cost on one host
//! A local region is always a shm region (its [`Words`] go straight to the mapping); a remote
//! region is a two-variant enum, so each one-sided operation is one match, no allocation and no
//! `dyn` on top of the shm fabric's own work.

use crate::error::FabricError;
use crate::fabric::{Access, Fabric, OneSided, RegionDescriptor};
use crate::region::host_identity;
use crate::shm::{ShmFabric, ShmRemoteRegion};
use crate::verbs_fabric::{VerbsConfig, VerbsFabric, VerbsLocalRegion, VerbsPort, VerbsRemoteRegion};
use crate::words::{LoadOrdering, StoreOrdering};
use std::sync::Arc;

/// Which medium a process may use for its peers (`--fabric auto|verbs|shm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FabricChoice {
    /// Shared memory with peers on this host, RDMA with other hosts where both can.
    #[default]
    Auto,
    /// RDMA with every peer, this host's too; opening fails without an active RDMA port.
    Verbs,
    /// Shared memory only (peers on other hosts: `NoMedium`).
    Shm,
}

impl FabricChoice {
    /// The choice's name as the flag spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricChoice::Auto => "auto",
            FabricChoice::Verbs => "verbs",
            FabricChoice::Shm => "shm",
        }
    }
}

impl std::fmt::Display for FabricChoice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// A fabric choice that is not `auto`, `verbs` or `shm`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown fabric {given:?}: expected auto, verbs or shm")]
pub struct ParseFabricChoiceError {
    /// What was given.
    pub given: String,
}

impl std::str::FromStr for FabricChoice {
    type Err = ParseFabricChoiceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(FabricChoice::Auto),
            "verbs" => Ok(FabricChoice::Verbs),
            "shm" => Ok(FabricChoice::Shm),
            _ => Err(ParseFabricChoiceError { given: text.chars().take(64).collect() }),
        }
    }
}

/// The medium a mapped region is reached through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Shared memory (/dev/shm) on this host.
    Shm,
    /// RDMA (libibverbs) to the owner's host.
    Verbs,
}

impl Medium {
    /// The medium's name (`shm` or `verbs`).
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Shm => "shm",
            Medium::Verbs => "verbs",
        }
    }
}

impl std::fmt::Display for Medium {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// What this process's fabric can do, for the layer above to say what it chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The choice the fabric was opened with.
    pub choice: FabricChoice,
    /// This host's identity (boot id), when readable.
    pub host: Option<String>,
    /// The RDMA port in use, or why there is none.
    pub verbs: Result<VerbsPort, String>,
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "fabric {}: shm", self.choice)?;
        match &self.verbs {
            Ok(port) => write!(formatter, ", verbs on {port}"),
            Err(reason) => write!(formatter, ", no verbs ({reason})"),
        }
    }
}

/// The product's fabric: shm and, where there is an RDMA port, verbs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AnyFabric {
    shm: ShmFabric,
    verbs: Option<VerbsFabric>,
    choice: FabricChoice,
    /// Why there is no verbs fabric (when there is none).
    verbs_missing: Option<Arc<str>>,
}

/// A region this process registered (shared memory, registered for RDMA when there is a port).
pub type AnyLocalRegion = VerbsLocalRegion;

/// A peer's region as mapped: over shared memory or over RDMA.
#[derive(Clone, Debug)]
pub enum AnyRemoteRegion {
    /// Mapped through /dev/shm.
    Shm(ShmRemoteRegion),
    /// Reached over RDMA.
    Verbs(VerbsRemoteRegion),
}

impl AnyFabric {
    /// Opens this process's fabric for `choice` with the default device and rendezvous address.
    ///
    /// # Errors
    /// `VerbsUnavailable` when `choice` is `Verbs` and RDMA cannot be used (naming why: library
    /// missing, no device, no active port, ...); `Io` when /dev/shm cannot be listed.
    pub fn open(choice: FabricChoice) -> Result<AnyFabric, FabricError> {
        AnyFabric::open_with(choice, &VerbsConfig::default())
    }

    /// As [`AnyFabric::open`], with the device and rendezvous address of `config`.
    ///
    /// # Errors
    /// As [`AnyFabric::open`].
    pub fn open_with(choice: FabricChoice, config: &VerbsConfig) -> Result<AnyFabric, FabricError> {
        let shm = ShmFabric::new()?;
        let (verbs, verbs_missing) = match choice {
            FabricChoice::Shm => (None, Some(Arc::from("the fabric choice is shm"))),
            FabricChoice::Auto => match VerbsFabric::open(config) {
                Ok(verbs) => (Some(verbs), None),
                Err(error) => (None, Some(Arc::from(unavailable_reason(&error)))),
            },
            FabricChoice::Verbs => (Some(VerbsFabric::open(config)?), None),
        };
        Ok(AnyFabric { shm, verbs, choice, verbs_missing })
    }

    /// The choice it was opened with.
    pub fn choice(&self) -> FabricChoice {
        self.choice
    }

    /// Its verbs fabric, when it has one.
    pub fn verbs(&self) -> Option<&VerbsFabric> {
        self.verbs.as_ref()
    }

    /// What it can do.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            choice: self.choice,
            host: host_identity().map(str::to_owned),
            verbs: match &self.verbs {
                Some(verbs) => Ok(verbs.port()),
                None => Err(self.verbs_missing.as_deref().unwrap_or("no RDMA").to_owned()),
            },
        }
    }

    /// The medium a mapped region is reached through.
    pub fn medium_of(&self, remote: &AnyRemoteRegion) -> Medium {
        match remote {
            AnyRemoteRegion::Shm(_) => Medium::Shm,
            AnyRemoteRegion::Verbs(_) => Medium::Verbs,
        }
    }

    /// The medium [`Fabric::map`] would choose for `descriptor`, or why none serves.
    ///
    /// # Errors
    /// `NoMedium` naming which side lacks what.
    pub fn medium_for(&self, descriptor: &RegionDescriptor) -> Result<Medium, FabricError> {
        let no_medium = |reason: String| FabricError::NoMedium { name: descriptor.name.clone(), reason };
        let ours = host_identity();
        let same_host = match (&descriptor.host, ours) {
            (None, _) => true,
            (Some(theirs), Some(ours)) => theirs == ours,
            (Some(_), None) => false,
        };
        let verbs_reason = || {
            if self.verbs.is_none() {
                Some(format!("this process has no RDMA ({})", self.verbs_missing.as_deref().unwrap_or("no RDMA")))
            } else if descriptor.verbs.is_none() {
                Some("the region's owner has no RDMA".to_owned())
            } else {
                None
            }
        };
        match (self.choice, same_host) {
            (FabricChoice::Shm, true) | (FabricChoice::Auto, true) => Ok(Medium::Shm),
            (FabricChoice::Shm, false) => {
                Err(no_medium("the owner runs on another host and the fabric choice is shm".to_owned()))
            }
            (FabricChoice::Auto, false) | (FabricChoice::Verbs, _) => match verbs_reason() {
                None => Ok(Medium::Verbs),
                Some(reason) if same_host => Err(no_medium(format!("the fabric choice is verbs, but {reason}"))),
                Some(reason) => Err(no_medium(format!("the owner runs on another host and {reason}"))),
            },
        }
    }
}

fn unavailable_reason(error: &FabricError) -> String {
    match error {
        FabricError::VerbsUnavailable { reason } => reason.clone(),
        other => other.to_string(),
    }
}

impl OneSided for AnyFabric {
    type RemoteRegion = AnyRemoteRegion;

    #[inline]
    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.remote_len_bytes(region),
            AnyRemoteRegion::Verbs(region) => region.remote_len_bytes(),
        }
    }
    #[inline]
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.read(region, offset_bytes, dst),
            AnyRemoteRegion::Verbs(region) => region.read(offset_bytes, dst),
        }
    }
    #[inline]
    fn read_many(&self, remote: &Self::RemoteRegion, reads: &mut [(usize, &mut [u8])]) -> Result<(), FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.read_many(region, reads),
            AnyRemoteRegion::Verbs(region) => region.read_many(reads),
        }
    }
    #[inline]
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.write(region, offset_bytes, src),
            AnyRemoteRegion::Verbs(region) => region.write(offset_bytes, src),
        }
    }
    #[inline]
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.compare_and_swap(region, offset_bytes, expected, new),
            AnyRemoteRegion::Verbs(region) => region.compare_and_swap(offset_bytes, expected, new),
        }
    }
    #[inline]
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.fetch_add(region, offset_bytes, add),
            AnyRemoteRegion::Verbs(region) => region.fetch_add(offset_bytes, add),
        }
    }
    #[inline]
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.read_word(region, offset_bytes, ordering),
            AnyRemoteRegion::Verbs(region) => region.read_word(offset_bytes),
        }
    }
    #[inline]
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.write_word(region, offset_bytes, value, ordering),
            AnyRemoteRegion::Verbs(region) => region.write_word(offset_bytes, value),
        }
    }
    #[inline]
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        match remote {
            AnyRemoteRegion::Shm(region) => self.shm.wake(region, offset_bytes),
            AnyRemoteRegion::Verbs(region) => region.wake(offset_bytes),
        }
    }
    #[inline]
    fn reads_are_round_trips(&self, remote: &Self::RemoteRegion) -> bool {
        matches!(remote, AnyRemoteRegion::Verbs(_))
    }
}

impl Fabric for AnyFabric {
    type LocalRegion = AnyLocalRegion;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        let region = self.shm.register(name, len_bytes, access)?;
        match &self.verbs {
            Some(verbs) => verbs.register_region(region, access),
            None => Ok(VerbsLocalRegion::shm_only(region)),
        }
    }

    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        let mut descriptor = local.shm().descriptor().clone();
        match &self.verbs {
            Some(verbs) => verbs.describe_region(local, &mut descriptor),
            None => descriptor.host = host_identity().map(str::to_owned),
        }
        descriptor
    }

    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        match self.medium_for(descriptor)? {
            Medium::Shm => self.shm.map(descriptor).map(AnyRemoteRegion::Shm),
            Medium::Verbs => {
                let verbs = self.verbs.as_ref().ok_or_else(|| FabricError::NoMedium {
                    name: descriptor.name.clone(),
                    reason: "this process has no RDMA".to_owned(),
                })?;
                verbs.map_region(descriptor).map(AnyRemoteRegion::Verbs)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::VerbsRegionInfo;
    use crate::words::Words;

    fn unique(name: &str) -> String {
        format!("any-{name}-{}", std::process::id())
    }

    #[test]
    fn the_handles_meet_the_bounds_of_the_message_layer() {
        fn shared<T: Send + Sync + 'static>() {}
        fn cloneable<T: Clone>() {}
        shared::<AnyFabric>();
        shared::<AnyLocalRegion>();
        shared::<AnyRemoteRegion>();
        cloneable::<AnyFabric>();
        cloneable::<AnyRemoteRegion>();
        shared::<VerbsFabric>();
        cloneable::<VerbsFabric>();
    }

    #[test]
    fn fabric_choices_parse_and_print() {
        for (text, choice) in [("auto", FabricChoice::Auto), ("verbs", FabricChoice::Verbs), ("shm", FabricChoice::Shm)]
        {
            assert_eq!(text.parse::<FabricChoice>().expect("parses"), choice);
            assert_eq!(choice.to_string(), text);
        }
        let error = "rdma".parse::<FabricChoice>().expect_err("not a choice");
        assert_eq!(error.to_string(), "unknown fabric \"rdma\": expected auto, verbs or shm");
        assert!("".parse::<FabricChoice>().is_err());
        assert!("Auto".parse::<FabricChoice>().is_err());
        assert_eq!(FabricChoice::default(), FabricChoice::Auto);
    }

    #[test]
    fn shm_choice_registers_maps_and_runs_every_operation_over_shared_memory() {
        let fabric = AnyFabric::open(FabricChoice::Shm).expect("open");
        assert!(fabric.verbs().is_none());
        let capabilities = fabric.capabilities();
        assert_eq!(capabilities.choice, FabricChoice::Shm);
        assert!(capabilities.verbs.is_err());
        assert!(capabilities.to_string().starts_with("fabric shm: shm, no verbs"), "{capabilities}");

        let local = fabric.register(&unique("ops"), 64, Access::ReadWrite).expect("register");
        assert!(!local.is_registered());
        let descriptor = fabric.describe(&local);
        assert_eq!(descriptor.host.as_deref(), host_identity());
        assert!(descriptor.verbs.is_none());
        let remote = fabric.map(&descriptor).expect("map");
        assert_eq!(fabric.medium_of(&remote), Medium::Shm);
        assert_eq!(fabric.remote_len_bytes(&remote), 64);

        fabric.write(&remote, 8, b"hello, world").expect("write");
        let mut back = [0u8; 12];
        fabric.read(&remote, 8, &mut back).expect("read");
        assert_eq!(&back, b"hello, world");
        assert_eq!(fabric.compare_and_swap(&remote, 32, 0, 7).expect("cas"), 0);
        assert_eq!(fabric.compare_and_swap(&remote, 32, 0, 9).expect("cas"), 7);
        assert_eq!(fabric.fetch_add(&remote, 32, 3).expect("faa"), 7);
        fabric.write_word(&remote, 40, 42, StoreOrdering::Release).expect("write word");
        assert_eq!(fabric.read_word(&remote, 40, LoadOrdering::Acquire).expect("read word"), 42);
        // The owner sees it all through its words.
        assert_eq!(local.load(4, LoadOrdering::Acquire), 10);
        assert_eq!(local.load(5, LoadOrdering::Acquire), 42);
        fabric.wake(&remote, 40).expect("wake");
        assert!(matches!(fabric.read(&remote, 56, &mut back), Err(FabricError::OutOfBounds { .. })));
        assert!(matches!(fabric.write(&remote, 3, b"x"), Err(FabricError::Misaligned { .. })));
    }

    #[test]
    fn auto_maps_same_host_and_plain_shm_descriptors_over_shared_memory() {
        let fabric = AnyFabric::open(FabricChoice::Auto).expect("auto opens on every machine");
        let local = fabric.register(&unique("auto"), 32, Access::ReadOnly).expect("register");
        local.store(1, 5, StoreOrdering::Release);
        let descriptor = fabric.describe(&local);
        assert_eq!(fabric.medium_for(&descriptor).expect("a medium"), Medium::Shm);
        let remote = fabric.map(&descriptor).expect("map");
        assert_eq!(fabric.medium_of(&remote), Medium::Shm);
        assert_eq!(fabric.read_word(&remote, 8, LoadOrdering::Acquire).expect("read"), 5);
        assert!(matches!(fabric.write_word(&remote, 8, 1, StoreOrdering::Release), Err(FabricError::NoWriteAccess)));
        // A descriptor of the plain shm fabric (no host) is a same-host one.
        let plain = RegionDescriptor::new(descriptor.name.clone(), 32, Access::ReadOnly);
        assert_eq!(fabric.medium_for(&plain).expect("a medium"), Medium::Shm);
        fabric.map(&plain).expect("map a plain descriptor");
    }

    #[test]
    fn another_host_without_rdma_is_no_medium_with_a_reason() {
        let fabric = AnyFabric::open(FabricChoice::Shm).expect("open");
        let mut descriptor = RegionDescriptor::new("rampkv-1-x-00", 64, Access::ReadWrite);
        descriptor.host = Some("another-boot".to_owned());
        let error = fabric.map(&descriptor).expect_err("no medium");
        assert!(matches!(&error, FabricError::NoMedium { .. }), "{error}");
        assert!(error.to_string().contains("another host"), "{error}");
        descriptor.verbs = Some(VerbsRegionInfo { rendezvous: "10.0.0.1:4000".to_owned(), addr: 4096, rkey: 1 });
        let error = fabric.map(&descriptor).expect_err("still no medium: the choice is shm");
        assert!(error.to_string().contains("choice is shm"), "{error}");
        let auto = AnyFabric::open(FabricChoice::Auto).expect("open");
        if auto.verbs().is_none() {
            descriptor.verbs = None;
            let error = auto.map(&descriptor).expect_err("no medium");
            assert!(error.to_string().contains("this process has no RDMA"), "{error}");
        }
    }

    #[test]
    fn forcing_verbs_without_a_device_is_a_clear_error() {
        let devices_present =
            std::fs::read_dir("/sys/class/infiniband").map(|mut dir| dir.next().is_some()).unwrap_or(false);
        if devices_present {
            // With a device, forcing verbs opens it or says why not (say, no active port).
            match AnyFabric::open(FabricChoice::Verbs) {
                Ok(fabric) => assert!(fabric.capabilities().verbs.is_ok()),
                Err(FabricError::VerbsUnavailable { reason }) => assert!(!reason.is_empty()),
                Err(other) => panic!("forcing verbs: {other}"),
            }
            return;
        }
        let error = AnyFabric::open(FabricChoice::Verbs).expect_err("no RDMA here");
        assert!(matches!(&error, FabricError::VerbsUnavailable { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("no RDMA device") || message.contains("libibverbs not found"), "{message}");
        let auto = AnyFabric::open(FabricChoice::Auto).expect("auto falls back");
        let reason = auto.capabilities().verbs.expect_err("no verbs");
        assert!(!reason.is_empty());
    }

    #[test]
    fn old_descriptors_without_the_new_fields_still_parse_and_shm_ones_serialize_as_before() {
        let old = r#"{"name":"rampkv-1-a-00","len_bytes":64,"access":"ReadWrite"}"#;
        let descriptor: RegionDescriptor = serde_json::from_str(old).expect("old JSON parses");
        assert_eq!(descriptor, RegionDescriptor::new("rampkv-1-a-00", 64, Access::ReadWrite));
        assert_eq!(serde_json::to_string(&descriptor).expect("serialize"), old);
        let mut full = descriptor.clone();
        full.host = Some("b00t".to_owned());
        full.verbs = Some(VerbsRegionInfo { rendezvous: "10.99.0.1:4791".to_owned(), addr: 8192, rkey: 77 });
        let json = serde_json::to_string(&full).expect("serialize");
        assert!(json.contains("\"rendezvous\":\"10.99.0.1:4791\""), "{json}");
        assert_eq!(serde_json::from_str::<RegionDescriptor>(&json).expect("parse"), full);
    }
}
