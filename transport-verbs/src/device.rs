//! Opening a device: the device list, the protection domain, the port and the GID.

use std::ffi::CStr;

use ibverbs_sys as sys;
use transport_core::{Error, Result};

use crate::addr::{LINK_ETH, LINK_IB};
use crate::util::{errno, errno_text, provider_err};

/// An open device context and its protection domain: what memory regions and queue pairs hang
/// off. Shared (through an `Arc`) by the endpoint and every region it registered, so the PD is
/// deallocated, and the device closed, only after the last of them is gone.
pub(crate) struct Domain {
    pub(crate) ctx: *mut sys::ibv_context,
    pub(crate) pd: *mut sys::ibv_pd,
    pub(crate) name: String,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core documents the verbs API as
// thread-safe); `Domain` only hands the pointers to verbs calls and frees them once, in `Drop`.
unsafe impl Send for Domain {}
// SAFETY: as above; shared references only read the two pointers.
unsafe impl Sync for Domain {}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: `pd` and `ctx` came from ibv_alloc_pd / ibv_open_device and are freed only here.
        // Every queue pair, SRQ, CQ and MR on them is gone: endpoints destroy theirs before
        // dropping their `Arc<Domain>`, and regions deregister before dropping theirs.
        unsafe {
            let rc = sys::ibv_dealloc_pd(self.pd);
            if rc != 0 {
                eprintln!(
                    "transport-verbs: ibv_dealloc_pd on {} failed: {}",
                    self.name,
                    errno_text(rc)
                );
            }
            sys::ibv_close_device(self.ctx);
        }
    }
}

/// Names of the RDMA devices present; `NoDevice` where the kernel has no RDMA stack.
pub fn device_names() -> Result<Vec<String>> {
    let list = DeviceList::get()?;
    Ok(list.iter().map(|(n, _)| n).collect())
}

/// The list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    ptr: *mut *mut sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; a non-null result is freed in `Drop`.
        let ptr = unsafe { sys::ibvs_get_device_list(&mut n) };
        if ptr.is_null() {
            let e = errno();
            let why = if e == libc::ENOSYS {
                "the kernel has no RDMA stack (ibv_get_device_list: ENOSYS). Load ib_uverbs and a \
                 device driver (mlx5_ib, efa, or rdma_rxe for Soft-RoCE: `rdma link add rxe0 type \
                 rxe netdev eth0`)"
                    .to_string()
            } else {
                format!("ibv_get_device_list failed: {}", errno_text(e))
            };
            return Err(Error::NoDevice(why));
        }
        let list = Self {
            ptr,
            len: n.max(0) as usize,
        };
        if list.len == 0 {
            return Err(Error::NoDevice(
                "no RDMA devices (ibv_get_device_list is empty): check `ibv_devices`, that the \
                 NIC's driver is loaded and that /dev/infiniband/uverbs* exist"
                    .into(),
            ));
        }
        Ok(list)
    }

    fn iter(&self) -> impl Iterator<Item = (String, *mut sys::ibv_device)> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: the list holds `len` valid device pointers while `self` lives.
            let dev = unsafe { *self.ptr.add(i) };
            // SAFETY: `dev` is a valid device; the name is a NUL-terminated string it owns.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
            (name.to_string_lossy().into_owned(), dev)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ibv_get_device_list and is freed once; opened contexts stay
        // valid after the list is freed (rdma-core keeps the devices referenced).
        unsafe { sys::ibv_free_device_list(self.ptr) }
    }
}

/// Open `name` (or the first device) and allocate its protection domain.
pub(crate) fn open_domain(name: Option<&str>) -> Result<Domain> {
    let list = DeviceList::get()?;
    let mut found = None;
    let mut names = Vec::new();
    for (n, dev) in list.iter() {
        if found.is_none() && name.is_none_or_eq(&n) {
            found = Some((n.clone(), dev));
        }
        names.push(n);
    }
    let Some((dev_name, dev)) = found else {
        return Err(Error::NoDevice(format!(
            "no RDMA device named {:?}; present: {}",
            name.unwrap_or_default(),
            names.join(", ")
        )));
    };
    // SAFETY: `dev` is a valid device from the list, which is still alive.
    let ctx = unsafe { sys::ibv_open_device(dev) };
    if ctx.is_null() {
        return Err(provider_err(
            "ibv_open_device",
            errno(),
            format!("check read/write access to /dev/infiniband/uverbs* for {dev_name}"),
        ));
    }
    // SAFETY: `ctx` is a freshly opened context.
    let pd = unsafe { sys::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        let e = errno();
        // SAFETY: `ctx` is open and has nothing allocated on it.
        unsafe { sys::ibv_close_device(ctx) };
        return Err(provider_err(
            "ibv_alloc_pd",
            e,
            format!("the device {dev_name} refused a protection domain"),
        ));
    }
    Ok(Domain {
        ctx,
        pd,
        name: dev_name,
    })
}

trait OptEq {
    fn is_none_or_eq(&self, s: &str) -> bool;
}
impl OptEq for Option<&str> {
    fn is_none_or_eq(&self, s: &str) -> bool {
        self.map_or(true, |n| n == s)
    }
}

/// What the endpoint needs to know about its port.
pub(crate) struct PortInfo {
    pub(crate) link_layer: u8,
    pub(crate) lid: u16,
    pub(crate) active_mtu: u8,
    pub(crate) max_msg_sz: u32,
    pub(crate) gbps: Option<f64>,
    pub(crate) gid_tbl_len: u32,
}

pub(crate) fn query_port(d: &Domain, port: u8) -> Result<PortInfo> {
    let mut pa = sys::ibv_port_attr::default();
    // SAFETY: `ctx` is open; `pa` is a valid out-pointer of the extended port attribute size.
    let rc = unsafe { sys::ibvs_query_port(d.ctx, port, &mut pa) };
    if rc != 0 {
        return Err(provider_err(
            "ibv_query_port",
            rc,
            format!(
                "port {port} of {} cannot be queried: does it exist? (see `ibv_devinfo -d {}`)",
                d.name, d.name
            ),
        ));
    }
    if pa.state != sys::IBV_PORT_ACTIVE {
        return Err(Error::NoDevice(format!(
            "port {port} of {} is not ACTIVE (state {}): check the cable/link, and on \
             InfiniBand that a subnet manager runs",
            d.name, pa.state
        )));
    }
    let link_layer = match pa.link_layer {
        l if l == sys::IBV_LINK_LAYER_ETHERNET as u8 => LINK_ETH,
        _ => LINK_IB,
    };
    Ok(PortInfo {
        link_layer,
        lid: pa.lid,
        active_mtu: pa.active_mtu as u8,
        max_msg_sz: pa.max_msg_sz,
        gbps: link_gbps(pa.active_width, pa.active_speed),
        gid_tbl_len: pa.gid_tbl_len.max(0) as u32,
    })
}

/// Link speed from the port's width and speed codes (`ibv_devinfo`'s table).
fn link_gbps(width: u8, speed: u8) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let per_lane = match speed {
        1 => 2.5,
        2 => 5.0,
        4 | 8 => 10.0,
        16 => 14.0625,
        32 => 25.78125,
        64 => 53.125,
        128 => 106.25,
        _ => return None,
    };
    Some(lanes * per_lane)
}

/// The kind of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

/// One GID table entry, or `None` where the slot is empty.
pub(crate) fn query_gid(d: &Domain, port: u8, index: u32) -> Option<([u8; 16], GidType)> {
    let mut e = sys::ibv_gid_entry::default();
    // SAFETY: `ctx` is open; `e` is a valid out-pointer of the size the call expects.
    let rc = unsafe { sys::ibvs_query_gid_ex(d.ctx, u32::from(port), index, &mut e, 0) };
    if rc == 0 {
        // SAFETY: `raw` is the plain-bytes view of the GID union.
        let gid = unsafe { e.gid.raw };
        let ty = match e.gid_type {
            t if t == sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            t if t == sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            _ => GidType::Ib,
        };
        return (gid != [0; 16]).then_some((gid, ty));
    }
    if rc == libc::ENODATA || rc == libc::EINVAL {
        return None;
    }
    // Old kernels: ibv_query_gid plus the type from sysfs.
    let mut g = sys::ibv_gid::default();
    // SAFETY: `ctx` is open; `g` is a valid out-pointer.
    if unsafe { sys::ibv_query_gid(d.ctx, port, index as i32, &mut g) } != 0 {
        return None;
    }
    // SAFETY: `raw` is the plain-bytes view of the GID union.
    let gid = unsafe { g.raw };
    let path = format!(
        "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
        d.name
    );
    let ty = match std::fs::read_to_string(path) {
        Ok(s) if s.trim().eq_ignore_ascii_case("RoCE v2") => GidType::RoceV2,
        Ok(s) if s.trim().starts_with("IB/RoCE") => GidType::RoceV1,
        _ => GidType::Ib,
    };
    (gid != [0; 16]).then_some((gid, ty))
}

fn is_v4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff
}

/// Pick the GID index: on Ethernet the RoCEv2 IPv4-mapped GID first, then another RoCEv2
/// GID (global before link-local), then any GID; on InfiniBand index 0. An explicit index is
/// checked to exist.
pub(crate) fn choose_gid(
    d: &Domain,
    port: u8,
    p: &PortInfo,
    wanted: Option<u8>,
) -> Result<(u8, [u8; 16])> {
    if let Some(i) = wanted {
        return match query_gid(d, port, u32::from(i)) {
            Some((g, _)) => Ok((i, g)),
            None => Err(Error::InvalidArgument(format!(
                "GID index {i} of {} port {port} is empty: see \
                 /sys/class/infiniband/{}/ports/{port}/gids/ (`show_gids`)",
                d.name, d.name
            ))),
        };
    }
    let mut best: Option<(u32, u8, [u8; 16])> = None; // (rank, index, gid); lower rank wins
    for i in 0..p.gid_tbl_len.min(256) {
        let Some((g, ty)) = query_gid(d, port, i) else {
            continue;
        };
        let link_local = g[0] == 0xfe && g[1] & 0xc0 == 0x80;
        let rank = match (p.link_layer, ty) {
            (LINK_IB, _) => i,
            (_, GidType::RoceV2) if is_v4_mapped(&g) => 0,
            (_, GidType::RoceV2) if !link_local => 1000,
            (_, GidType::RoceV2) => 2000,
            _ => 3000 + i,
        };
        if best.map_or(true, |b| rank < b.0) {
            best = Some((rank, i as u8, g));
        }
        if rank == 0 || p.link_layer == LINK_IB {
            break;
        }
    }
    match best {
        Some((_, i, g)) => Ok((i, g)),
        None if p.link_layer == LINK_IB => Ok((0, [0; 16])),
        None => Err(Error::NoDevice(format!(
            "{} port {port} has no GID: give its network interface an IP address \
             (RoCE GIDs come from the netdev's addresses)",
            d.name
        ))),
    }
}
