//! Opening a device: the device list, the protection domain, the port and its GID table.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr;

use ibverbs_sys as sys;
use transport_core::{Error, Result};

use crate::addr::{LINK_ETH, LINK_IB};
use crate::gid::{is_v4_mapped, GidEntry, GidKind, WireGid};
use crate::netdev::{ifindex_name, Interfaces};
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

/// PCI vendor id of Amazon: EFA devices.
const VENDOR_AMAZON: u32 = 0x1d0f;

/// Whether the device can carry this backend's reliable-connected queue pairs and shared
/// receive queues. An EFA device cannot: it offers SRD datagrams only, and libibverbs refuses
/// an RC queue pair there (the efa provider answers `EOPNOTSUPP`). That is a device this
/// backend does not have, said as such (`NoDevice`), with the library's own answer to the RC
/// queue pair the endpoint would create.
pub(crate) fn require_rc_and_srq(
    d: &Domain,
    da: &sys::ibv_device_attr,
    srq_wrs: usize,
) -> Result<()> {
    if da.vendor_id == VENDOR_AMAZON {
        let refusal = rc_qp_refusal(d);
        if let Some(why) = refusal {
            return Err(Error::NoDevice(format!(
                "{} is an AWS EFA device (vendor {:#06x}, part {:#06x}): it has no reliable-connected \
                 queue pairs, which the verbs backend is built on ({why}); EFA carries SRD datagrams \
                 through libfabric: use --backend efa --provider efa",
                d.name, da.vendor_id, da.vendor_part_id
            )));
        }
    }
    if da.max_srq <= 0 || (da.max_srq_wr.max(0) as usize) < srq_wrs {
        return Err(Error::NoDevice(format!(
            "{} has no shared receive queue of {srq_wrs} entries (max_srq {}, max_srq_wr {}), which \
             the verbs backend needs for its receives",
            d.name, da.max_srq, da.max_srq_wr
        )));
    }
    Ok(())
}

/// `None` where the device creates an RC queue pair (destroyed at once), else what the
/// library said.
fn rc_qp_refusal(d: &Domain) -> Option<String> {
    // SAFETY: `ctx` is open; no channel, no context pointer.
    let cq = unsafe { sys::ibv_create_cq(d.ctx, 1, ptr::null_mut(), ptr::null_mut(), 0) };
    if cq.is_null() {
        return Some(format!("ibv_create_cq: {}", errno_text(errno())));
    }
    let mut init = sys::ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        cap: sys::ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: sys::IBV_QPT_RC,
        ..Default::default()
    };
    // SAFETY: `pd` and `cq` are live; `init` is a valid init attribute.
    let qp = unsafe { sys::ibv_create_qp(d.pd, &mut init) };
    let e = errno();
    // SAFETY: `qp` (if any) and `cq` were created just above and are destroyed once, the QP
    // first.
    unsafe {
        if !qp.is_null() {
            sys::ibv_destroy_qp(qp);
        }
        sys::ibv_destroy_cq(cq);
    }
    qp.is_null()
        .then(|| format!("ibv_create_qp(IBV_QPT_RC): {}", errno_text(e)))
}

trait OptEq {
    fn is_none_or_eq(&self, s: &str) -> bool;
}
impl OptEq for Option<&str> {
    fn is_none_or_eq(&self, s: &str) -> bool {
        self.is_none_or(|n| n == s)
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

/// One GID table entry: the GID, its type and its netdev's ifindex (0 where unknown), or
/// `None` where the slot is empty. On an Ethernet port, type IB is RoCE v1 (sysfs says
/// `IB/RoCE v1`).
fn query_gid(d: &Domain, port: u8, index: u32, roce: bool) -> Option<([u8; 16], GidKind, u32)> {
    let kind = |ib: bool, v2: bool| match (v2, ib, roce) {
        (true, _, _) => GidKind::RoceV2,
        (false, false, _) | (false, true, true) => GidKind::RoceV1,
        (false, true, false) => GidKind::Ib,
    };
    let mut e = sys::ibv_gid_entry::default();
    // SAFETY: `ctx` is open; `e` is a valid out-pointer of the size the call expects.
    let rc = unsafe { sys::ibvs_query_gid_ex(d.ctx, u32::from(port), index, &mut e, 0) };
    if rc == 0 {
        // SAFETY: `raw` is the plain-bytes view of the GID union.
        let gid = unsafe { e.gid.raw };
        let ty = kind(
            e.gid_type == sys::IBV_GID_TYPE_IB,
            e.gid_type == sys::IBV_GID_TYPE_ROCE_V2,
        );
        return (gid != [0; 16]).then_some((gid, ty, e.ndev_ifindex));
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
    // "RoCE v2", else "IB/RoCE v1" (or unreadable: the IB type, RoCE v1 on Ethernet).
    let v2 =
        matches!(std::fs::read_to_string(path), Ok(s) if s.trim().eq_ignore_ascii_case("RoCE v2"));
    let ty = kind(!v2, v2);
    (gid != [0; 16]).then_some((gid, ty, 0))
}

/// The port's GID table (indexes 0..=255, which is what `sgid_index` can name), each entry with
/// its netdev, VLAN and the prefix length of its IP address, as far as the host tells.
pub(crate) fn read_gid_table(d: &Domain, port: u8, p: &PortInfo) -> Vec<GidEntry> {
    let roce = p.link_layer == LINK_ETH;
    let ifs = if roce {
        Interfaces::read()
    } else {
        Interfaces::default()
    };
    let mut t = Vec::new();
    for i in 0..p.gid_tbl_len.min(256) {
        let Some((gid, kind, ifindex)) = query_gid(d, port, i, roce) else {
            continue;
        };
        // The kernel's name for the entry's netdev first (an ifindex names another device in
        // another network namespace), then the ifindex from ibv_query_gid_ex.
        let path = format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/ndevs/{i}",
            d.name
        );
        let netdev = std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .or_else(|| ifindex_name(ifindex));
        let vlan_id = netdev.as_deref().and_then(|n| ifs.vlan_of(n));
        let ip = if is_v4_mapped(&gid) {
            IpAddr::V4(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
        } else {
            IpAddr::V6(Ipv6Addr::from(gid))
        };
        let prefix_len = if roce {
            ifs.prefix_of(netdev.as_deref(), ip)
                .or_else(|| ifs.prefix_of(None, ip))
                .unwrap_or(0)
        } else {
            0
        };
        t.push(GidEntry {
            index: i as u8,
            wire: WireGid {
                gid,
                kind,
                prefix_len,
                vlan: vlan_id.is_some(),
            },
            netdev,
            vlan_id,
        });
    }
    t
}
