//! The C side of libibverbs: the few structs, constants and functions the verbs core uses,
//! declared here by hand and loaded from `libibverbs.so.1` at run time.
//!
//! # Why by hand
//! Every Rust binding on crates.io generates its declarations with bindgen (libclang) and
//! most build rdma-core's C sources with cmake, at *build* time; rampkv must build on a machine
//! with only the Rust toolchain (docs/architecture.md, "The verbs binding"). The verbs ABI is
//! stable (the structs below have kept their layout since `IBVERBS_1.1`, 2006: providers
//! compiled against any rdma-core release work with any later libibverbs), so a small set of
//! declarations is enough, and [`tests::layouts_match_the_installed_headers`] compares every
//! size and offset below with the C compiler's, wherever libibverbs-dev is installed (the lab
//! installs it and requires the check).
//!
//! # What is declared
//! Only structs this crate allocates are declared whole (work requests, scatter-gather entries,
//! work completions, attribute structs). Structs that libibverbs allocates (`ibv_context`,
//! `ibv_cq`, `ibv_qp`, ...) are declared as the *prefix* this crate reads, and only ever used
//! through pointers that libibverbs returned.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are `static inline`
//! in `verbs.h`: they call through the provider's function table in `ibv_context.ops`, and so
//! does this crate ([`IbvContextOps`]).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// The shared object loaded at run time (the SONAME of every libibverbs since 2006).
pub(crate) const LIBRARY_NAME: &str = "libibverbs.so.1";

/// `struct ibv_device`: opaque (its name comes from `ibv_get_device_name`).
#[repr(C)]
pub(crate) struct IbvDevice {
    _opaque: [u8; 0],
}

/// `struct ibv_pd`: opaque here.
#[repr(C)]
pub(crate) struct IbvPd {
    _opaque: [u8; 0],
}

/// `struct ibv_context_ops`: 32 function pointers; the four that `verbs.h` calls inline are
/// named, the rest (compatibility slots and verbs this crate does not use) are padding.
#[repr(C)]
pub(crate) struct IbvContextOps {
    _before_poll_cq: [*mut c_void; 11],
    pub(crate) poll_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int>,
    pub(crate) req_notify_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int>,
    _before_post_send: [*mut c_void; 12],
    pub(crate) post_send: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int>,
    pub(crate) post_recv: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int>,
    _after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context`, up to `num_comp_vectors` (a mutex and a pointer follow).
#[repr(C)]
pub(crate) struct IbvContext {
    pub(crate) device: *mut IbvDevice,
    pub(crate) ops: IbvContextOps,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub(crate) struct IbvCompChannel {
    pub(crate) context: *mut IbvContext,
    pub(crate) fd: c_int,
    pub(crate) refcnt: c_int,
}

/// `struct ibv_cq`, up to `cqe` (a mutex, a condition variable and two counters follow).
#[repr(C)]
pub(crate) struct IbvCq {
    pub(crate) context: *mut IbvContext,
    pub(crate) channel: *mut IbvCompChannel,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// `struct ibv_qp`, up to `qp_type` (a mutex, a condition variable and a counter follow).
#[repr(C)]
pub(crate) struct IbvQp {
    pub(crate) context: *mut IbvContext,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut IbvPd,
    pub(crate) send_cq: *mut IbvCq,
    pub(crate) recv_cq: *mut IbvCq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(crate) struct IbvMr {
    pub(crate) context: *mut IbvContext,
    pub(crate) pd: *mut IbvPd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its other member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvGid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_device_attr` (the fields before `max_qp_rd_atom` are read for nothing but kept
/// for the layout).
#[repr(C)]
pub(crate) struct IbvDeviceAttr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_uint,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

/// `struct ibv_port_attr` as of rdma-core 44. The exported `ibv_query_port` fills the older,
/// shorter `_compat_ibv_port_attr` (a prefix of this one, as `verbs.h` itself relies on), and
/// newer rdma-core may append fields; [`PortAttrBuffer`] leaves room for them.
#[repr(C)]
pub(crate) struct IbvPortAttr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

/// A zeroed `ibv_port_attr` with 64 spare bytes after it.
#[repr(C)]
pub(crate) struct PortAttrBuffer {
    pub(crate) attr: IbvPortAttr,
    _spare: [u8; 64],
}

impl PortAttrBuffer {
    pub(crate) fn zeroed() -> Self {
        // SAFETY: every field is an integer or an array of integers: all-zero bytes are valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvQpCap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct IbvQpInitAttr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut IbvCq,
    pub(crate) recv_cq: *mut IbvCq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: IbvQpCap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvGlobalRoute {
    pub(crate) dgid: IbvGid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvAhAttr {
    pub(crate) grh: IbvGlobalRoute,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvQpAttr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: IbvQpCap,
    pub(crate) ah_attr: IbvAhAttr,
    pub(crate) alt_ah_attr: IbvAhAttr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct IbvSge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IbvRdmaWr {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IbvAtomicWr {
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) rkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (its `ud` member, for UD queue pairs, is smaller
/// than `atomic` and never used here).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union IbvWrUnion {
    pub(crate) rdma: IbvRdmaWr,
    pub(crate) atomic: IbvAtomicWr,
}

/// `struct ibv_send_wr`. The trailing unions (`qp_type.xrc`, and `bind_mw` / `tso`) are unused
/// for RC queue pairs and kept zeroed as padding.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IbvSendWr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut IbvSendWr,
    pub(crate) sg_list: *mut IbvSge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    /// `imm_data` (network byte order) or `invalidate_rkey`.
    pub(crate) imm_data: u32,
    pub(crate) wr: IbvWrUnion,
    pub(crate) qp_type: u32,
    pub(crate) bind_mw_or_tso: [u64; 6],
}

impl IbvSendWr {
    pub(crate) fn zeroed() -> Self {
        // SAFETY: integers, null raw pointers and unions of integers: all-zero bytes are valid.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct IbvRecvWr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut IbvRecvWr,
    pub(crate) sg_list: *mut IbvSge,
    pub(crate) num_sge: c_int,
}

impl IbvRecvWr {
    pub(crate) fn zeroed() -> Self {
        Self { wr_id: 0, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct IbvWc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// `imm_data` (network byte order) or `invalidated_rkey`.
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

// Constants of verbs.h (enum values are part of the ABI).
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;
pub(crate) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
pub(crate) const IBV_QPT_RC: c_uint = 2;
pub(crate) const IBV_QPS_RESET: c_uint = 0;
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
pub(crate) const IBV_QPS_SQD: c_uint = 4;
pub(crate) const IBV_QPS_SQE: c_uint = 5;
pub(crate) const IBV_QPS_ERR: c_uint = 6;
pub(crate) const IBV_QP_STATE: c_int = 1;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub(crate) const IBV_WR_SEND: c_uint = 2;
pub(crate) const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub(crate) const IBV_WR_RDMA_READ: c_uint = 4;
pub(crate) const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub(crate) const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
pub(crate) const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub(crate) const IBV_WC_SEND: c_uint = 0;
pub(crate) const IBV_WC_RDMA_WRITE: c_uint = 1;
pub(crate) const IBV_WC_RDMA_READ: c_uint = 2;
pub(crate) const IBV_WC_COMP_SWAP: c_uint = 3;
pub(crate) const IBV_WC_FETCH_ADD: c_uint = 4;
pub(crate) const IBV_WC_RECV: c_uint = 1 << 7;
pub(crate) const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;
pub(crate) const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub(crate) const IBV_MTU_256: c_uint = 1;
pub(crate) const IBV_MTU_4096: c_uint = 5;

/// The functions of libibverbs this crate calls, resolved once per process.
///
/// Each is an exported symbol of `libibverbs.so.1`; the dynamic linker picks the default
/// symbol version (`IBVERBS_1.1` for those that also have a 1.0 version), which is the one
/// `verbs.h` links against.
pub(crate) struct Api {
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut IbvDevice),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut IbvDevice) -> *const c_char,
    pub(crate) open_device: unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext,
    pub(crate) close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    pub(crate) query_device: unsafe extern "C" fn(*mut IbvContext, *mut IbvDeviceAttr) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub(crate) create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    pub(crate) destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    pub(crate) create_cq:
        unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut IbvCompChannel, c_int) -> *mut IbvCq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    pub(crate) get_cq_event: unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int,
    pub(crate) ack_cq_events: unsafe extern "C" fn(*mut IbvCq, c_uint),
    pub(crate) create_qp: unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    pub(crate) query_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int, *mut IbvQpInitAttr) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    /// Kept so that the functions above stay mapped for the life of the process.
    _library: libloading::Library,
}

/// Why libibverbs could not be used (cloneable, so that one failed load answers every caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LoadError {
    /// `dlopen` failed (libibverbs is not installed, or not loadable).
    NotFound { library: String, detail: String },
    /// The library lacks a function every libibverbs since 2006 exports.
    MissingSymbol { library: String, symbol: &'static str },
}

static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();

/// The process's libibverbs, loaded on first use.
pub(crate) fn api() -> Result<&'static Api, LoadError> {
    API.get_or_init(|| Api::load(LIBRARY_NAME)).as_ref().map_err(Clone::clone)
}

/// Resolves `name` in `library` as a value of type `T` (a function pointer type).
///
/// # Safety
/// `T` must be the function pointer type of the C declaration of `name`, and the returned value
/// must not be used after `library` is unloaded.
///
/// # Errors
/// `MissingSymbol` when the library does not export `name`.
unsafe fn symbol<T: Copy>(library: &libloading::Library, path: &str, name: &'static str) -> Result<T, LoadError> {
    let mut symbol_name = Vec::with_capacity(name.len() + 1);
    symbol_name.extend_from_slice(name.as_bytes());
    symbol_name.push(0);
    // SAFETY: the caller promises that T is the C function's type; the symbol is copied out as
    // a plain function pointer, valid while `library` stays loaded (the caller's duty).
    unsafe { library.get::<T>(&symbol_name) }
        .map(|symbol| *symbol)
        .map_err(|_| LoadError::MissingSymbol { library: path.to_owned(), symbol: name })
}

impl Api {
    /// Loads `path` (a SONAME or a path) and resolves every function.
    pub(crate) fn load(path: &str) -> Result<Api, LoadError> {
        // SAFETY: loading libibverbs runs its initialisers, which only set up its own state
        // (no constructors with preconditions on the caller).
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|error| LoadError::NotFound { library: path.to_owned(), detail: error.to_string() })?;
        // SAFETY: for every `symbol` call below, each type is copied from the declaration in
        // verbs.h (rdma-core 44) of the function named, and the pointers live in `Api` beside
        // the `Library` that keeps them mapped; `Api` lives in a process-wide static.
        unsafe {
            Ok(Api {
                get_device_list: symbol(&library, path, "ibv_get_device_list")?,
                free_device_list: symbol(&library, path, "ibv_free_device_list")?,
                get_device_name: symbol(&library, path, "ibv_get_device_name")?,
                open_device: symbol(&library, path, "ibv_open_device")?,
                close_device: symbol(&library, path, "ibv_close_device")?,
                query_device: symbol(&library, path, "ibv_query_device")?,
                query_port: symbol(&library, path, "ibv_query_port")?,
                query_gid: symbol(&library, path, "ibv_query_gid")?,
                alloc_pd: symbol(&library, path, "ibv_alloc_pd")?,
                dealloc_pd: symbol(&library, path, "ibv_dealloc_pd")?,
                reg_mr: symbol(&library, path, "ibv_reg_mr")?,
                dereg_mr: symbol(&library, path, "ibv_dereg_mr")?,
                create_comp_channel: symbol(&library, path, "ibv_create_comp_channel")?,
                destroy_comp_channel: symbol(&library, path, "ibv_destroy_comp_channel")?,
                create_cq: symbol(&library, path, "ibv_create_cq")?,
                destroy_cq: symbol(&library, path, "ibv_destroy_cq")?,
                get_cq_event: symbol(&library, path, "ibv_get_cq_event")?,
                ack_cq_events: symbol(&library, path, "ibv_ack_cq_events")?,
                create_qp: symbol(&library, path, "ibv_create_qp")?,
                modify_qp: symbol(&library, path, "ibv_modify_qp")?,
                query_qp: symbol(&library, path, "ibv_query_qp")?,
                destroy_qp: symbol(&library, path, "ibv_destroy_qp")?,
                _library: library,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    #[test]
    fn a_missing_library_is_an_error_value() {
        match Api::load("/nonexistent/libibverbs.so.1") {
            Err(LoadError::NotFound { library, .. }) => assert_eq!(library, "/nonexistent/libibverbs.so.1"),
            Err(other) => panic!("expected NotFound, got {other:?}"),
            Ok(_) => panic!("a library that does not exist loaded"),
        }
    }

    #[test]
    fn a_library_without_verbs_is_an_error_value() {
        // libc is on every Linux machine and exports none of the ibv_ functions.
        match Api::load("libc.so.6") {
            Err(LoadError::MissingSymbol { symbol, .. }) => assert_eq!(symbol, "ibv_get_device_list"),
            Err(other) => panic!("expected MissingSymbol, got {other:?}"),
            Ok(_) => panic!("libc passed for libibverbs"),
        }
    }

    /// (C expression, value in Rust) for every size and offset the declarations rely on.
    fn layout_facts() -> Vec<(&'static str, usize)> {
        vec![
            ("sizeof(struct ibv_context_ops)", size_of::<IbvContextOps>()),
            ("offsetof(struct ibv_context_ops, poll_cq)", offset_of!(IbvContextOps, poll_cq)),
            ("offsetof(struct ibv_context_ops, req_notify_cq)", offset_of!(IbvContextOps, req_notify_cq)),
            ("offsetof(struct ibv_context_ops, post_send)", offset_of!(IbvContextOps, post_send)),
            ("offsetof(struct ibv_context_ops, post_recv)", offset_of!(IbvContextOps, post_recv)),
            ("offsetof(struct ibv_context, ops)", offset_of!(IbvContext, ops)),
            ("offsetof(struct ibv_context, cmd_fd)", offset_of!(IbvContext, cmd_fd)),
            ("offsetof(struct ibv_context, num_comp_vectors)", offset_of!(IbvContext, num_comp_vectors)),
            ("sizeof(struct ibv_comp_channel)", size_of::<IbvCompChannel>()),
            ("offsetof(struct ibv_comp_channel, fd)", offset_of!(IbvCompChannel, fd)),
            ("offsetof(struct ibv_cq, cq_context)", offset_of!(IbvCq, cq_context)),
            ("offsetof(struct ibv_cq, cqe)", offset_of!(IbvCq, cqe)),
            ("offsetof(struct ibv_qp, qp_num)", offset_of!(IbvQp, qp_num)),
            ("offsetof(struct ibv_qp, state)", offset_of!(IbvQp, state)),
            ("offsetof(struct ibv_qp, qp_type)", offset_of!(IbvQp, qp_type)),
            ("sizeof(struct ibv_mr)", size_of::<IbvMr>()),
            ("offsetof(struct ibv_mr, length)", offset_of!(IbvMr, length)),
            ("offsetof(struct ibv_mr, lkey)", offset_of!(IbvMr, lkey)),
            ("offsetof(struct ibv_mr, rkey)", offset_of!(IbvMr, rkey)),
            ("sizeof(union ibv_gid)", size_of::<IbvGid>()),
            ("sizeof(struct ibv_device_attr)", size_of::<IbvDeviceAttr>()),
            ("offsetof(struct ibv_device_attr, max_qp_rd_atom)", offset_of!(IbvDeviceAttr, max_qp_rd_atom)),
            ("offsetof(struct ibv_device_attr, atomic_cap)", offset_of!(IbvDeviceAttr, atomic_cap)),
            ("offsetof(struct ibv_device_attr, phys_port_cnt)", offset_of!(IbvDeviceAttr, phys_port_cnt)),
            ("sizeof(struct ibv_port_attr)", size_of::<IbvPortAttr>()),
            ("offsetof(struct ibv_port_attr, gid_tbl_len)", offset_of!(IbvPortAttr, gid_tbl_len)),
            ("offsetof(struct ibv_port_attr, lid)", offset_of!(IbvPortAttr, lid)),
            ("offsetof(struct ibv_port_attr, link_layer)", offset_of!(IbvPortAttr, link_layer)),
            ("sizeof(struct ibv_qp_cap)", size_of::<IbvQpCap>()),
            ("sizeof(struct ibv_qp_init_attr)", size_of::<IbvQpInitAttr>()),
            ("offsetof(struct ibv_qp_init_attr, cap)", offset_of!(IbvQpInitAttr, cap)),
            ("offsetof(struct ibv_qp_init_attr, sq_sig_all)", offset_of!(IbvQpInitAttr, sq_sig_all)),
            ("sizeof(struct ibv_global_route)", size_of::<IbvGlobalRoute>()),
            ("sizeof(struct ibv_ah_attr)", size_of::<IbvAhAttr>()),
            ("offsetof(struct ibv_ah_attr, dlid)", offset_of!(IbvAhAttr, dlid)),
            ("offsetof(struct ibv_ah_attr, port_num)", offset_of!(IbvAhAttr, port_num)),
            ("sizeof(struct ibv_qp_attr)", size_of::<IbvQpAttr>()),
            ("offsetof(struct ibv_qp_attr, cap)", offset_of!(IbvQpAttr, cap)),
            ("offsetof(struct ibv_qp_attr, ah_attr)", offset_of!(IbvQpAttr, ah_attr)),
            ("offsetof(struct ibv_qp_attr, pkey_index)", offset_of!(IbvQpAttr, pkey_index)),
            ("offsetof(struct ibv_qp_attr, max_rd_atomic)", offset_of!(IbvQpAttr, max_rd_atomic)),
            ("offsetof(struct ibv_qp_attr, rnr_retry)", offset_of!(IbvQpAttr, rnr_retry)),
            ("offsetof(struct ibv_qp_attr, rate_limit)", offset_of!(IbvQpAttr, rate_limit)),
            ("sizeof(struct ibv_sge)", size_of::<IbvSge>()),
            ("sizeof(struct ibv_send_wr)", size_of::<IbvSendWr>()),
            ("offsetof(struct ibv_send_wr, opcode)", offset_of!(IbvSendWr, opcode)),
            ("offsetof(struct ibv_send_wr, imm_data)", offset_of!(IbvSendWr, imm_data)),
            ("offsetof(struct ibv_send_wr, wr.rdma.rkey)", offset_of!(IbvSendWr, wr) + offset_of!(IbvRdmaWr, rkey)),
            ("offsetof(struct ibv_send_wr, wr.atomic.swap)", offset_of!(IbvSendWr, wr) + offset_of!(IbvAtomicWr, swap)),
            ("offsetof(struct ibv_send_wr, wr.atomic.rkey)", offset_of!(IbvSendWr, wr) + offset_of!(IbvAtomicWr, rkey)),
            ("offsetof(struct ibv_send_wr, qp_type)", offset_of!(IbvSendWr, qp_type)),
            ("sizeof(struct ibv_recv_wr)", size_of::<IbvRecvWr>()),
            ("sizeof(struct ibv_wc)", size_of::<IbvWc>()),
            ("offsetof(struct ibv_wc, imm_data)", offset_of!(IbvWc, imm_data)),
            ("offsetof(struct ibv_wc, wc_flags)", offset_of!(IbvWc, wc_flags)),
            ("offsetof(struct ibv_wc, dlid_path_bits)", offset_of!(IbvWc, dlid_path_bits)),
            // Enum values and flags.
            ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize),
            ("IBV_LINK_LAYER_UNSPECIFIED", usize::from(IBV_LINK_LAYER_UNSPECIFIED)),
            ("IBV_LINK_LAYER_INFINIBAND", usize::from(IBV_LINK_LAYER_INFINIBAND)),
            ("IBV_LINK_LAYER_ETHERNET", usize::from(IBV_LINK_LAYER_ETHERNET)),
            ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as usize),
            ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as usize),
            ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ as usize),
            ("IBV_ACCESS_REMOTE_ATOMIC", IBV_ACCESS_REMOTE_ATOMIC as usize),
            ("IBV_QPT_RC", IBV_QPT_RC as usize),
            ("IBV_QPS_RESET", IBV_QPS_RESET as usize),
            ("IBV_QPS_INIT", IBV_QPS_INIT as usize),
            ("IBV_QPS_RTR", IBV_QPS_RTR as usize),
            ("IBV_QPS_RTS", IBV_QPS_RTS as usize),
            ("IBV_QPS_SQD", IBV_QPS_SQD as usize),
            ("IBV_QPS_SQE", IBV_QPS_SQE as usize),
            ("IBV_QPS_ERR", IBV_QPS_ERR as usize),
            ("IBV_QP_STATE", IBV_QP_STATE as usize),
            ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as usize),
            ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as usize),
            ("IBV_QP_PORT", IBV_QP_PORT as usize),
            ("IBV_QP_AV", IBV_QP_AV as usize),
            ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as usize),
            ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as usize),
            ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as usize),
            ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as usize),
            ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as usize),
            ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as usize),
            ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as usize),
            ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as usize),
            ("IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC as usize),
            ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as usize),
            ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as usize),
            ("IBV_WR_RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM as usize),
            ("IBV_WR_SEND", IBV_WR_SEND as usize),
            ("IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM as usize),
            ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as usize),
            ("IBV_WR_ATOMIC_CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP as usize),
            ("IBV_WR_ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD as usize),
            ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize),
            ("IBV_WC_SEND", IBV_WC_SEND as usize),
            ("IBV_WC_RDMA_WRITE", IBV_WC_RDMA_WRITE as usize),
            ("IBV_WC_RDMA_READ", IBV_WC_RDMA_READ as usize),
            ("IBV_WC_COMP_SWAP", IBV_WC_COMP_SWAP as usize),
            ("IBV_WC_FETCH_ADD", IBV_WC_FETCH_ADD as usize),
            ("IBV_WC_RECV", IBV_WC_RECV as usize),
            ("IBV_WC_RECV_RDMA_WITH_IMM", IBV_WC_RECV_RDMA_WITH_IMM as usize),
            ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as usize),
            ("IBV_MTU_256", IBV_MTU_256 as usize),
            ("IBV_MTU_4096", IBV_MTU_4096 as usize),
            ("IBV_WC_SUCCESS", 0),
            ("IBV_WC_RETRY_EXC_ERR", 12),
            ("IBV_WC_TM_RNDV_INCOMPLETE", 23),
        ]
    }

    /// Every declaration above against the C compiler's view of `<infiniband/verbs.h>`.
    ///
    /// Runs wherever the header is installed (libibverbs-dev); elsewhere it says so and passes,
    /// unless `RAMPKV_VERBS_LAYOUT_CHECK=required` (the lab sets it, after installing the
    /// header), where a missing header or compiler fails.
    #[test]
    fn layouts_match_the_installed_headers() {
        let required = std::env::var("RAMPKV_VERBS_LAYOUT_CHECK").is_ok_and(|value| value == "required");
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            assert!(!required, "RAMPKV_VERBS_LAYOUT_CHECK=required but {} is missing", header.display());
            eprintln!("layout check skipped: {} is not installed (libibverbs-dev)", header.display());
            return;
        }
        let facts = layout_facts();
        let mut source =
            String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
        for (expression, _) in &facts {
            source.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expression}));\n"));
        }
        source.push_str("  return 0;\n}\n");
        let directory = std::env::temp_dir().join(format!("rampkv-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temporary directory");
        let source_path = directory.join("layout.c");
        let binary_path = directory.join("layout");
        std::fs::write(&source_path, source).expect("write layout.c");
        let compiled = Command::new("cc").arg("-o").arg(&binary_path).arg(&source_path).output();
        let compiled = match compiled {
            Ok(output) => output,
            Err(error) => {
                assert!(!required, "RAMPKV_VERBS_LAYOUT_CHECK=required but no C compiler: {error}");
                eprintln!("layout check skipped: no C compiler ({error})");
                return;
            }
        };
        assert!(compiled.status.success(), "cc failed: {}", String::from_utf8_lossy(&compiled.stderr));
        let output = Command::new(&binary_path).output().expect("run the layout probe");
        let _ = std::fs::remove_dir_all(&directory);
        let values: Vec<usize> =
            String::from_utf8_lossy(&output.stdout).lines().map(|line| line.parse().expect("a number")).collect();
        assert_eq!(values.len(), facts.len());
        let mismatches: Vec<String> = facts
            .iter()
            .zip(&values)
            .filter(|((_, rust), c)| rust != *c)
            .map(|((expression, rust), c)| format!("{expression}: Rust {rust}, C {c}"))
            .collect();
        assert!(mismatches.is_empty(), "layouts differ from verbs.h:\n{}", mismatches.join("\n"));
        eprintln!("layout check: {} sizes, offsets and constants match verbs.h", facts.len());
    }
}
