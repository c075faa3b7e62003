//! The per-server choice of medium (`rampkv_net::message::fallback`) and `--fabric`, on every
//! machine (no RDMA device needed):
//!
//! - a client whose region says it lives on another host, with no RDMA, is refused by the
//!   server's fabric (`NoMedium`) and reaches that server over TCP instead; transactions work and
//!   the choice is recorded as `tcp-fallback`;
//! - a client on the servers' host gets shared memory;
//! - `--fabric verbs` where no active RDMA port exists is a clear error with a non-zero exit
//!   status (where one exists, it runs);
//! - `--fabric shm` runs a fabric transport as before, and `bench` names the medium per server.

use std::net::SocketAddr;
use std::process::Command;

#[allow(dead_code)] // the shared harness: this test uses its round trip only
mod common;

use common::put_get_round_trip;
use rampkv::client::Driver;
use rampkv::cluster::{Cluster, Front};
use rampkv::fabric::{
    Access, AnyFabric, Fabric, FabricChoice, FabricError, LoadOrdering, OneSided, RegionDescriptor, StoreOrdering,
};
use rampkv::message::fabric::{FabricClient, FabricHandle};
use rampkv::message::fallback::{take_chosen_media, ChosenMedium, Fallback};
use rampkv::message::ring::Ring;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::{MixedWritePollTransport, Transport};

/// The process's fabric, except that the regions it describes claim another host and no RDMA:
/// what a client on a machine without RDMA looks like to a server elsewhere.
#[derive(Clone, Debug)]
struct ElsewhereFabric(AnyFabric);

impl OneSided for ElsewhereFabric {
    type RemoteRegion = <AnyFabric as OneSided>::RemoteRegion;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        self.0.remote_len_bytes(remote)
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        self.0.read(remote, offset_bytes, dst)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        self.0.write(remote, offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        self.0.compare_and_swap(remote, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        self.0.fetch_add(remote, offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        order: LoadOrdering,
    ) -> Result<u64, FabricError> {
        self.0.read_word(remote, offset_bytes, order)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        order: StoreOrdering,
    ) -> Result<(), FabricError> {
        self.0.write_word(remote, offset_bytes, value, order)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        self.0.wake(remote, offset_bytes)
    }
}

impl Fabric for ElsewhereFabric {
    type LocalRegion = <AnyFabric as Fabric>::LocalRegion;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        self.0.register(name, len_bytes, access)
    }
    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        RegionDescriptor { host: Some("another-host-without-rdma".into()), verbs: None, ..self.0.describe(local) }
    }
    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        self.0.map(descriptor)
    }
}

impl FabricHandle for ElsewhereFabric {
    fn open() -> Result<Self, FabricError> {
        Ok(Self(<AnyFabric as FabricHandle>::open()?))
    }
    fn medium_name(&self, remote: &Self::RemoteRegion) -> &'static str {
        self.0.medium_name(remote)
    }
}

/// Two servers on one TCP group with a ring front end on the process's fabric.
fn cluster() -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let rings = FrontEnd::spawn(&group, Front::Ring, localhost, None).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = rings.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, rings, cluster, control)
}

/// The media recorded for `control`'s addresses, in server order.
fn media_of(control: &[String]) -> Vec<ChosenMedium> {
    let media = take_chosen_media();
    control
        .iter()
        .map(|address| {
            let found = media.iter().find(|(_, recorded, _)| recorded == address);
            found.map(|(_, _, medium)| medium.clone()).unwrap_or_else(|| panic!("no medium recorded for {address}"))
        })
        .collect()
}

#[test]
fn a_client_on_another_host_without_rdma_falls_back_to_tcp_and_a_local_one_gets_shared_memory() {
    let (_group, _rings, cluster, control) = cluster();

    // Without TCP addresses there is nothing to fall back to: the server's refusal is the error.
    let fabric = ElsewhereFabric::open().unwrap();
    let medium = FabricClient::<ElsewhereFabric, Ring>::with_fabric(fabric, control.len()).unwrap();
    let refused = Transport::with_medium(Fallback::new(medium, &[]), &control).unwrap_err().to_string();
    assert!(refused.contains("no fabric medium"), "{refused}");

    let fabric = ElsewhereFabric::open().unwrap();
    let medium = FabricClient::<ElsewhereFabric, Ring>::with_fabric(fabric, control.len()).unwrap();
    let transport = Transport::with_medium(Fallback::new(medium, cluster.servers()), &control).unwrap();
    let mut driver = Driver::connect(transport, cluster.clone(), 1).unwrap();
    for round in 0..20 {
        put_get_round_trip(&mut driver, round);
    }
    for medium in media_of(&control) {
        assert_eq!(medium.name(), "tcp-fallback", "{medium:?}");
        let ChosenMedium::TcpFallback(reason) = medium else { unreachable!() };
        assert!(reason.contains("another host"), "{reason}");
    }

    // A client of this host: shared memory, the same servers.
    let transport = MixedWritePollTransport::connect_or_tcp(&control, cluster.servers()).unwrap();
    let mut driver = Driver::connect(transport, cluster, 1).unwrap();
    for round in 20..40 {
        put_get_round_trip(&mut driver, round);
    }
    assert_eq!(media_of(&control), vec![ChosenMedium::Fabric("shm"); 2]);
    // Forced shm does the same (a choice other than the process's, opened on its own).
    assert_eq!(AnyFabric::open(FabricChoice::Shm).unwrap().choice(), FabricChoice::Shm);
}

/// Whether this machine has an RDMA device with an active port (as `ibv_devinfo` would say).
fn active_rdma_port() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else { return false };
    devices.flatten().any(|device| {
        let ports = std::fs::read_dir(device.path().join("ports")).into_iter().flatten().flatten();
        ports
            .into_iter()
            .any(|port| std::fs::read_to_string(port.path().join("state")).is_ok_and(|state| state.contains("ACTIVE")))
    })
}

#[test]
fn fabric_verbs_without_an_active_rdma_port_is_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_rampkv"))
        .args(["bench", "--fabric", "verbs", "--transport", "writepoll", "--servers", "1", "--txns", "20"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if active_rdma_port() {
        assert!(output.status.success(), "an RDMA port is active, yet: {stderr}");
    } else {
        assert!(!output.status.success(), "--fabric verbs ran without RDMA: {stderr}");
        assert!(stderr.contains("--fabric verbs") && stderr.contains("RDMA unavailable"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_rampkv")).args(["bench", "--fabric", "rdma"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("auto, verbs or shm"), "{stderr}");
}

#[test]
fn fabric_shm_runs_the_fabric_transports_as_before_and_bench_names_the_medium() {
    for transport in ["writepoll", "onesided"] {
        let output = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["bench", "--fabric", "shm", "--transport", transport, "--servers", "2", "--txns", "300"])
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("300 transactions in"), "{stdout}");
        let media = stdout.lines().find(|line| line.starts_with("media: ")).unwrap_or_else(|| panic!("{stdout}"));
        assert_eq!(media.matches(") shm").count(), 2, "{media}");
        assert!(!stderr.contains("tcp"), "{stderr}");
    }
}
