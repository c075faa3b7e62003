//! Device discovery: which RDMA devices exist, which port is ACTIVE, which GID to use.
//!
//! # Choosing a GID
//! A RoCE port has one GID per IP address of its network device, each in two flavours
//! (RoCE v1, an Ethernet frame, and RoCE v2, a UDP/IP packet), and rxe lists only v2. The
//! GID decides which address and which encapsulation a connection uses, and both ends must
//! agree on the flavour. [`choose_gid`] prefers, in order: RoCE v2 with an IPv4-mapped GID
//! (`::ffff:a.b.c.d`: routable, and what clusters configure first), RoCE v2 with an IPv6
//! address that is not link-local, any other RoCE v2 GID, then whatever is left (RoCE v1, or
//! a GID whose type the kernel does not report); ties go to the lower index. The type of an
//! entry comes from sysfs (`/sys/class/infiniband/DEV/ports/N/gid_attrs/types/INDEX`, the
//! file rdma-core's own tools read). On InfiniBand the GID at index 0 (subnet prefix and port
//! GUID) is used, with the port's LID. [`DeviceSelection::gid_index`] overrides the choice.

use super::error::VerbsError;
use super::ffi::{self, Api, IbvContext, IbvDevice, IbvDeviceAttr, IbvGid, PortAttrBuffer};
use super::limits::{GID_ENTRIES_SCANNED_MAX, PORTS_PER_DEVICE_MAX, READ_ATOMIC_DEPTH_MAX};
use serde::{Deserialize, Serialize};
use std::ffi::{c_int, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

/// The error of a failed libibverbs call: functions that return an `int` return the errno
/// value itself (or -1 with `errno` set, in older providers); those that return a pointer
/// return NULL with `errno` set (pass 0 then).
pub(crate) fn call_error(call: &'static str, returned: c_int) -> VerbsError {
    let source =
        if returned > 0 { std::io::Error::from_raw_os_error(returned) } else { std::io::Error::last_os_error() };
    VerbsError::Call { call, source }
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID within a subnet.
    InfiniBand,
    /// Ethernet (RoCE, including Soft-RoCE): addressed by GID.
    Ethernet,
    /// The provider did not say (old providers; treated as InfiniBand would be by verbs).
    Unspecified,
}

impl LinkLayer {
    fn from_raw(raw: u8) -> LinkLayer {
        match raw {
            ffi::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            ffi::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            ffi::IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::Unspecified,
            _ => LinkLayer::Unspecified,
        }
    }
}

/// The flavour of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GidKind {
    /// RoCE v2 (UDP/IP encapsulation).
    RoceV2,
    /// InfiniBand, or RoCE v1 (the kernel names both "IB/RoCE v1").
    RoceV1OrInfiniBand,
    /// The kernel does not say.
    Unknown,
}

/// One non-zero entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index in the table (the `sgid_index` a queue pair names).
    pub index: u8,
    /// The GID (an IPv6 address for RoCE).
    pub gid: [u8; 16],
    /// Its flavour.
    pub kind: GidKind,
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|byte| *byte == 0) && gid[10] == 0xff && gid[11] == 0xff
}

fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// The GID a connection on a port with `link_layer` should use (see the module docs), or
/// `None` when `entries` has none.
pub fn choose_gid(link_layer: LinkLayer, entries: &[GidEntry]) -> Option<GidEntry> {
    if link_layer == LinkLayer::InfiniBand {
        return entries.iter().min_by_key(|entry| entry.index).copied();
    }
    let rank = |entry: &GidEntry| match (entry.kind, is_ipv4_mapped(&entry.gid), is_link_local(&entry.gid)) {
        (GidKind::RoceV2, true, _) => 0,
        (GidKind::RoceV2, false, false) => 1,
        (GidKind::RoceV2, false, true) => 2,
        (GidKind::Unknown, true, _) => 3,
        _ => 4,
    };
    entries.iter().min_by_key(|entry| (rank(entry), entry.index)).copied()
}

/// Which device, port and GID to use; `None` fields are chosen (the first device with an
/// ACTIVE port, its first ACTIVE port, the GID by [`choose_gid`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSelection {
    /// Device name (as `ibv_devices` lists it, e.g. `rxe0`, `mlx5_0`).
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: Option<u8>,
    /// GID table index.
    pub gid_index: Option<u8>,
}

/// An ACTIVE port ready for connections: what a process tells peers it can do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The active MTU in bytes (256 to 4096).
    pub active_mtu_bytes: u32,
    /// The chosen GID's index.
    pub gid_index: u8,
    /// The chosen GID.
    pub gid: [u8; 16],
    /// The chosen GID's flavour.
    pub gid_kind: GidKind,
    /// Most RDMA READs and atomics one queue pair may have outstanding (device limit, capped
    /// at `READ_ATOMIC_DEPTH_MAX`).
    pub read_atomic_depth: u8,
    /// Whether the device supports 8-byte atomics (compare-and-swap, fetch-and-add).
    pub atomics: bool,
}

/// One port of a listed device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSummary {
    /// Port number.
    pub port: u8,
    /// Whether it is ACTIVE.
    pub active: bool,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// The GID [`choose_gid`] picks, if any.
    pub gid: Option<GidEntry>,
}

/// A device as [`devices`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Device name.
    pub name: String,
    /// Its ports (or why it could not be opened).
    pub ports: Result<Vec<PortSummary>, String>,
}

/// The device list of libibverbs, freed on drop.
struct DeviceList {
    api: &'static Api,
    list: NonNull<*mut IbvDevice>,
    count: usize,
}

impl DeviceList {
    fn get(api: &'static Api) -> Result<DeviceList, VerbsError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer; the list is freed in Drop.
        let list = unsafe { (api.get_device_list)(&mut count) };
        // NULL: no RDMA subsystem in the kernel (ENOSYS) or nothing to list; either way none.
        let list = NonNull::new(list).ok_or(VerbsError::NoDevice)?;
        let list = DeviceList { api, list, count: usize::try_from(count).unwrap_or(0) };
        if list.count == 0 {
            return Err(VerbsError::NoDevice);
        }
        Ok(list)
    }

    fn device(&self, position: usize) -> *mut IbvDevice {
        debug_assert!(position < self.count);
        // SAFETY: the list holds `count` device pointers (then a NULL), and position < count.
        unsafe { *self.list.as_ptr().add(position) }
    }

    fn name(&self, position: usize) -> String {
        // SAFETY: a device pointer of the live list; the name is a NUL-terminated string owned
        // by the device, copied out at once.
        let name = unsafe { (self.api.get_device_name)(self.device(position)) };
        if name.is_null() {
            return format!("device{position}");
        }
        // SAFETY: non-NULL, NUL-terminated, valid while the list lives.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { (self.api.free_device_list)(self.list.as_ptr()) }
    }
}

/// An opened device context, closed on drop (after everything that holds it).
pub(crate) struct ContextInner {
    pub(crate) api: &'static Api,
    pub(crate) raw: NonNull<IbvContext>,
}

// SAFETY: libibverbs contexts may be used from any thread (all verbs are thread-safe; the
// provider locks what it shares), and this type only passes the pointer to verbs.
unsafe impl Send for ContextInner {}
// SAFETY: as above: no verb called through a shared reference needs exclusive access.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device and closed once; every child object holds an Arc
        // of this context, so none is left.
        let _ = unsafe { (self.api.close_device)(self.raw.as_ptr()) };
    }
}

impl ContextInner {
    fn query_device(&self) -> Result<Box<IbvDeviceAttr>, VerbsError> {
        // SAFETY: IbvDeviceAttr is integers only: all-zero is a valid value.
        let mut attr: Box<IbvDeviceAttr> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: a live context and a buffer of the full struct's size.
        let returned = unsafe { (self.api.query_device)(self.raw.as_ptr(), &mut *attr) };
        if returned != 0 {
            return Err(call_error("ibv_query_device", returned));
        }
        Ok(attr)
    }

    fn query_port(&self, port: u8) -> Result<PortAttrBuffer, VerbsError> {
        let mut attr = PortAttrBuffer::zeroed();
        // SAFETY: a live context; the buffer is larger than any version of the struct (the
        // exported function fills the older, shorter layout).
        let returned = unsafe { (self.api.query_port)(self.raw.as_ptr(), port, &mut attr.attr) };
        if returned != 0 {
            return Err(call_error("ibv_query_port", returned));
        }
        Ok(attr)
    }

    /// The non-zero GID entries of a port (at most `GID_ENTRIES_SCANNED_MAX`).
    fn gid_entries(&self, device: &str, port: u8, table_len: c_int) -> Vec<GidEntry> {
        let scanned = u32::try_from(table_len).unwrap_or(0).min(GID_ENTRIES_SCANNED_MAX);
        let mut entries = Vec::new();
        for index in 0..scanned {
            let mut gid = IbvGid::default();
            // SAFETY: a live context and a 16-byte GID buffer; index < the table's length.
            let returned = unsafe { (self.api.query_gid)(self.raw.as_ptr(), port, index as c_int, &mut gid) };
            if returned != 0 || gid.raw == [0; 16] {
                continue;
            }
            let kind = gid_kind_from_sysfs(device, port, index);
            entries.push(GidEntry { index: index as u8, gid: gid.raw, kind });
        }
        entries
    }
}

fn gid_kind_from_sysfs(device: &str, port: u8, index: u32) -> GidKind {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}");
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim() == "RoCE v2" => GidKind::RoceV2,
        Ok(text) if text.trim() == "IB/RoCE v1" => GidKind::RoceV1OrInfiniBand,
        _ => GidKind::Unknown,
    }
}

fn mtu_bytes(raw: u32) -> u32 {
    match raw {
        ffi::IBV_MTU_256..=ffi::IBV_MTU_4096 => 128 << raw,
        _ => 256,
    }
}

/// An opened RDMA device with one chosen ACTIVE port and GID: the root of every other object.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
    port: PortInfo,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Context").field("port", &self.port).finish()
    }
}

impl Context {
    /// Opens the device and port that `selection` names, or the first ACTIVE one.
    ///
    /// # Errors
    /// `LibraryNotFound` / `MissingSymbol` without a usable libibverbs, `NoDevice` when it
    /// lists none, `DeviceNotFound` for a name not listed, `NoActivePort` when no port (or
    /// not the one named) is ACTIVE, `NoUsableGid` when the port has no GID (or the index
    /// named is empty), `Call` when a device cannot be opened or queried.
    pub fn open(selection: &DeviceSelection) -> Result<Context, VerbsError> {
        let api = ffi::api()?;
        let list = DeviceList::get(api)?;
        let names: Vec<String> = (0..list.count).map(|position| list.name(position)).collect();
        let positions: Vec<usize> = match &selection.device {
            Some(wanted) => match names.iter().position(|name| name == wanted) {
                Some(position) => vec![position],
                None => return Err(VerbsError::DeviceNotFound { name: wanted.clone(), present: names.join(", ") }),
            },
            None => (0..list.count).collect(),
        };
        let mut last_error = None;
        for position in positions {
            match Self::open_at(api, &list, position, &names[position], selection) {
                Ok(context) => return Ok(context),
                Err(error) => last_error = Some(error),
            }
        }
        Err(match last_error {
            Some(VerbsError::NoActivePort { .. }) | None => {
                VerbsError::NoActivePort { device: selection.device.clone().unwrap_or_else(|| names.join(", ")) }
            }
            Some(other) => other,
        })
    }

    fn open_at(
        api: &'static Api,
        list: &DeviceList,
        position: usize,
        name: &str,
        selection: &DeviceSelection,
    ) -> Result<Context, VerbsError> {
        // SAFETY: a device pointer of the live list.
        let raw = unsafe { (api.open_device)(list.device(position)) };
        let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_open_device", 0))?;
        let inner = Arc::new(ContextInner { api, raw });
        let device = inner.query_device()?;
        let ports: Vec<u8> = match selection.port {
            Some(port) => vec![port],
            None => (1..=device.phys_port_cnt.min(PORTS_PER_DEVICE_MAX)).collect(),
        };
        for port in ports {
            let attr = inner.query_port(port)?;
            if attr.attr.state != ffi::IBV_PORT_ACTIVE {
                continue;
            }
            let link_layer = LinkLayer::from_raw(attr.attr.link_layer);
            let entries = inner.gid_entries(name, port, attr.attr.gid_tbl_len);
            let chosen = match selection.gid_index {
                Some(index) => entries.iter().find(|entry| entry.index == index).copied(),
                None => choose_gid(link_layer, &entries),
            };
            let Some(gid) = chosen else {
                return Err(VerbsError::NoUsableGid { device: name.to_owned(), port });
            };
            let read_atomic_depth = u8::try_from(device.max_qp_rd_atom.clamp(1, READ_ATOMIC_DEPTH_MAX.into()))
                .unwrap_or(READ_ATOMIC_DEPTH_MAX);
            let port = PortInfo {
                device: name.to_owned(),
                port,
                link_layer,
                lid: attr.attr.lid,
                active_mtu_bytes: mtu_bytes(attr.attr.active_mtu),
                gid_index: gid.index,
                gid: gid.gid,
                gid_kind: gid.kind,
                read_atomic_depth,
                atomics: device.atomic_cap != 0,
            };
            return Ok(Context { inner, port });
        }
        Err(VerbsError::NoActivePort { device: name.to_owned() })
    }

    /// The port and GID this context uses.
    pub fn port(&self) -> &PortInfo {
        &self.port
    }
}

/// Every device libibverbs lists, with its ports' state and chosen GID.
///
/// # Errors
/// `LibraryNotFound` / `MissingSymbol` without a usable libibverbs, `NoDevice` when it lists
/// none. A device that cannot be opened is listed with its error.
pub fn devices() -> Result<Vec<DeviceSummary>, VerbsError> {
    let api = ffi::api()?;
    let list = DeviceList::get(api)?;
    let mut summaries = Vec::with_capacity(list.count);
    for position in 0..list.count {
        let name = list.name(position);
        let ports = summarize(api, &list, position, &name).map_err(|error| error.to_string());
        summaries.push(DeviceSummary { name, ports });
    }
    Ok(summaries)
}

fn summarize(
    api: &'static Api,
    list: &DeviceList,
    position: usize,
    name: &str,
) -> Result<Vec<PortSummary>, VerbsError> {
    // SAFETY: a device pointer of the live list.
    let raw = unsafe { (api.open_device)(list.device(position)) };
    let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_open_device", 0))?;
    let inner = ContextInner { api, raw };
    let device = inner.query_device()?;
    let mut ports = Vec::new();
    for port in 1..=device.phys_port_cnt.min(PORTS_PER_DEVICE_MAX) {
        let attr = inner.query_port(port)?;
        let link_layer = LinkLayer::from_raw(attr.attr.link_layer);
        let entries = inner.gid_entries(name, port, attr.attr.gid_tbl_len);
        ports.push(PortSummary {
            port,
            active: attr.attr.state == ffi::IBV_PORT_ACTIVE,
            link_layer,
            gid: choose_gid(link_layer, &entries),
        });
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u8, gid: [u8; 16], kind: GidKind) -> GidEntry {
        GidEntry { index, gid, kind }
    }

    const LINK_LOCAL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xb8, 0x57, 0xbb, 0xff, 0xfe, 0x38, 0x2c, 0xe8];
    const IPV4_MAPPED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1];
    const GLOBAL_IPV6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    #[test]
    fn roce_prefers_v2_ipv4_mapped_then_global_then_link_local() {
        // rxe's table: 0 = link-local from the MAC, 1 = the IPv4 address (both RoCE v2).
        let rxe = [entry(0, LINK_LOCAL, GidKind::RoceV2), entry(1, IPV4_MAPPED, GidKind::RoceV2)];
        assert_eq!(choose_gid(LinkLayer::Ethernet, &rxe).map(|chosen| chosen.index), Some(1));
        // A hardware RoCE port lists each address as v1 and v2: 0/1 link-local, 2/3 IPv4.
        let mlx = [
            entry(0, LINK_LOCAL, GidKind::RoceV1OrInfiniBand),
            entry(1, LINK_LOCAL, GidKind::RoceV2),
            entry(2, IPV4_MAPPED, GidKind::RoceV1OrInfiniBand),
            entry(3, IPV4_MAPPED, GidKind::RoceV2),
        ];
        assert_eq!(choose_gid(LinkLayer::Ethernet, &mlx).map(|chosen| chosen.index), Some(3));
        let ipv6_only = [entry(0, LINK_LOCAL, GidKind::RoceV2), entry(4, GLOBAL_IPV6, GidKind::RoceV2)];
        assert_eq!(choose_gid(LinkLayer::Ethernet, &ipv6_only).map(|chosen| chosen.index), Some(4));
        let link_local_only =
            [entry(0, LINK_LOCAL, GidKind::RoceV1OrInfiniBand), entry(1, LINK_LOCAL, GidKind::RoceV2)];
        assert_eq!(choose_gid(LinkLayer::Ethernet, &link_local_only).map(|chosen| chosen.index), Some(1));
        // No type information (an old kernel): an IPv4-mapped GID still wins.
        let untyped = [entry(0, LINK_LOCAL, GidKind::Unknown), entry(1, IPV4_MAPPED, GidKind::Unknown)];
        assert_eq!(choose_gid(LinkLayer::Ethernet, &untyped).map(|chosen| chosen.index), Some(1));
        assert_eq!(choose_gid(LinkLayer::Ethernet, &[]), None);
    }

    #[test]
    fn infiniband_uses_the_lowest_index() {
        let ib =
            [entry(2, GLOBAL_IPV6, GidKind::RoceV1OrInfiniBand), entry(0, LINK_LOCAL, GidKind::RoceV1OrInfiniBand)];
        assert_eq!(choose_gid(LinkLayer::InfiniBand, &ib).map(|chosen| chosen.index), Some(0));
    }

    #[test]
    fn mtu_codes_become_bytes() {
        assert_eq!(mtu_bytes(1), 256);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(0), 256);
        assert_eq!(mtu_bytes(9), 256);
    }

    #[test]
    fn a_failed_call_names_the_function_and_the_errno() {
        let error = call_error("ibv_modify_qp", 22);
        assert!(error.to_string().starts_with("ibv_modify_qp failed"), "{error}");
        match error {
            VerbsError::Call { source, .. } => assert_eq!(source.raw_os_error(), Some(22)),
            other => panic!("{other:?}"),
        }
    }
}
