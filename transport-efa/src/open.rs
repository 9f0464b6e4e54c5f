//! Opening an [`Endpoint`]: the fabric, domain, CQ, AV and libfabric endpoint(s) from the
//! entry `select.rs` chose, the endpoint options set before `fi_enable`, and the limits read
//! after it.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfabric_sys as fi;
use transport_core::{Caps, EndpointAddr, Error, Memory, NicDesc, Result, Transport};

use crate::domain::{Domain, Fabric, NEXT_DOMAIN_ID};
use crate::endpoint::{Endpoint, EndpointInfo};
use crate::error::{self, provider, runtime_version};
use crate::imm::{self, ImmRecvs};
use crate::mr::MrMode;
use crate::options::{CudaApi, Options, WriteCompletion};
use crate::select::{self, Selected};
use crate::slab::Slab;
use crate::MAX_TRANSFER;

/// Most operations kept in flight per direction, whatever depth the provider reports.
const MAX_DEPTH: usize = 16 * 1024;
/// Depth assumed where the provider reports none.
const DEFAULT_DEPTH: usize = 256;

/// Hint for failures while opening.
fn open_hint(v: &select::View) -> String {
    format!(
        "opening provider {} on domain {} (fabric {}, libfabric {}) failed; check the device \
         and its permissions, or choose another provider/device{}",
        v.prov_name,
        v.domain_name,
        v.fabric_name,
        runtime_version(),
        provider_hint(&v.prov_name)
    )
}

/// What a provider is known to need beyond that. rxm over verbs sizes the verbs CQ of its
/// endpoint by the universe size (256 peers unless FI_UNIVERSE_SIZE says otherwise); Soft-RoCE
/// (rxe) gives no CQ that large, so its fi_enable fails with -22 after "Unable to create verbs
/// CQ" in libfabric's warnings (2.6.0 in the VM of ci/vm; FI_UNIVERSE_SIZE=64 opens).
fn provider_hint(prov: &str) -> &'static str {
    if prov.starts_with("verbs") && prov.contains("ofi_rxm") {
        "; on a device with small CQs (Soft-RoCE), rxm's CQ sized for FI_UNIVERSE_SIZE peers \
         (256 by default) is refused: try FI_UNIVERSE_SIZE=64"
    } else {
        ""
    }
}

fn check(call: &'static str, ret: i32, v: &select::View) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(provider(call, ret.into(), open_hint(v)))
    }
}

impl Endpoint {
    /// `open`: choose the fi_info entry (`select.rs`), then open the fabric, domain, CQ, AV
    /// and libfabric endpoint(s) from it.
    pub(crate) fn open_inner(nic: &NicDesc) -> Result<Self> {
        let opts = Options::parse(&nic.options)?;
        let sel: Selected = select::select(nic, &opts)?;
        let v = sel.view().clone();
        let info = sel.info();

        let mut fabric_ptr: *mut fi::fid_fabric = ptr::null_mut();
        // SAFETY: info is a live entry of sel's list; fabric_ptr is a valid out pointer.
        let ret = unsafe { fi::rs_fi_fabric(info, &mut fabric_ptr) };
        check("fi_fabric", ret, &v)?;
        let fabric = Fabric(fabric_ptr);
        let mut dom: *mut fi::fid_domain = ptr::null_mut();
        // SAFETY: the fabric was just opened from this info; dom is a valid out pointer.
        let ret = unsafe { fi::rs_fi_domain(fabric.0, info, &mut dom) };
        check("fi_domain", ret, &v)?;
        let domain = Arc::new(Domain {
            ptr: dom,
            id: NEXT_DOMAIN_ID.fetch_add(1, Ordering::Relaxed),
            next_key: AtomicU64::new(1),
            _fabric: fabric,
        });

        let depth = |d: usize| {
            if d == 0 {
                DEFAULT_DEPTH
            } else {
                d.min(MAX_DEPTH)
            }
        };
        let (tx, rx) = (depth(v.tx_size), depth(v.rx_size));
        let max = v.max_msg_size.min(MAX_TRANSFER);
        let write_flags = match opts.write_completion {
            WriteCompletion::Delivery => fi::FI_DELIVERY_COMPLETE,
            WriteCompletion::Transmit => 0,
            // EFA reports a remote failure (bad key, bad range) to the initiator with the
            // device's acknowledgement. shm never reports one, whatever the flags (see
            // `remote_write_errors`), and FI_DELIVERY_COMPLETE only costs there: it moves
            // WRITEs of up to 4 KiB from the inject buffer to the segmented (SAR) protocol
            // (`smr_select_proto`). Elsewhere (tcp) the default completion only says the data
            // left the local buffer, and a remote failure would go unseen.
            WriteCompletion::Auto if matches!(v.core(), "efa" | "shm") => 0,
            WriteCompletion::Auto => fi::FI_DELIVERY_COMPLETE,
        };
        let caps = Caps {
            max_msg_size: max,
            max_write_size: max,
            tx_depth: tx,
            rx_depth: rx,
            inject_size: v.inject_size,
            cq_data_size: v.cq_data_size,
            gpu_memory: sel.gpu_reason.is_none() && v.caps & fi::FI_HMEM != 0,
            link_gbps: (v.link_speed > 0).then(|| v.link_speed as f64 / 1e9),
            remote_write_errors: remote_write_errors(v.core(), write_flags),
        };
        let mut requested_mr_mode = if opts.mr_strict {
            MrMode::STRICT
        } else {
            MrMode::SUPPORTED
        };
        if sel.gpu_reason.is_none() {
            requested_mr_mode.0 |= fi::FI_MR_HMEM;
        }
        let rx_cq_data = (v.mode | v.rx_mode) & fi::FI_RX_CQ_DATA != 0 || opts.rx_cq_data_forced;
        let mut ep = Endpoint {
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            slab: Slab::new(tx, rx),
            imm: None,
            imm_mr: None,
            domain,
            peers: Vec::new(),
            write_peers: Vec::new(),
            addr: EndpointAddr(Vec::new()),
            own_addr_len: 0,
            addr_format: v.addr_format,
            provider: v.prov_name.clone(),
            fabric: v.fabric_name.clone(),
            nic: v.domain_name.clone(),
            caps,
            mr_mode: MrMode(v.mr_mode),
            requested_mr_mode,
            write_flags,
            hmem_flags: if opts.gpu_ipc {
                fi::FI_HMEM_DEVICE_ONLY
            } else {
                0
            },
            gpu_reason: sel.gpu_reason.clone(),
            announce_peers: v.core() == "shm" && error::runtime_major() >= 2,
            grave: Arc::default(),
            info: EndpointInfo {
                api_version: select::version_string(if v.api_version > 0 {
                    v.api_version
                } else {
                    select::api_version()
                }),
                threading: select::threading_name(v.threading),
                shm_permitted: None,
                cuda_api_permitted: None,
                emulated_write: None,
                rx_cq_data,
                pci: v.pci,
                provider_version: select::version_string(v.prov_version),
                firmware: Some(v.firmware.clone()).filter(|f| !f.is_empty()),
            },
        };
        if v.cq_data_size < select::CQ_DATA_SIZE {
            return Err(Error::Unsupported(format!(
                "provider {} carries only {} bytes of remote CQ data; 4 are needed for \
                 immediates",
                v.prov_name, v.cq_data_size
            )));
        }

        // Remote writes with immediates land in the CQ too, beyond the posted operations:
        // leave room for them.
        let cq_size = ((tx + rx) * 2).max(1024);
        let dom = ep.domain.ptr;
        // SAFETY: dom is the live domain; the out pointers are fields of ep, which closes
        // them on drop if a later step fails.
        unsafe {
            check(
                "fi_cq_open",
                fi::rs_fi_cq_open_data(dom, cq_size, &mut ep.cq),
                &v,
            )?;
            check(
                "fi_av_open",
                fi::rs_fi_av_open_table(dom, 64, &mut ep.av),
                &v,
            )?;
        }
        ep.ep = ep.open_ep(info, &v, &opts)?;
        if rx_cq_data {
            let data = ep.open_ep(info, &v, &opts)?;
            // Owned from here on, so Drop closes it whatever fails next.
            ep.imm = Some(ImmRecvs::new(data, 1, ptr::null_mut(), ptr::null_mut()));
            let mr = ep.register(Memory::Host(transport_core::HostBuffer::new(imm::BUF_LEN)))?;
            let (buf, desc) = mr.raw_buf();
            ep.imm_mr = Some(mr);
            let mut recvs = ImmRecvs::new(data, rx.min(imm::MAX_IMM_RECVS), buf, desc);
            let posted = recvs.post_all();
            ep.imm = Some(recvs);
            if let Err(ret) = posted {
                return Err(provider(
                    "fi_recv",
                    ret as i64,
                    "posting the receives for immediates (FI_RX_CQ_DATA) on the data endpoint \
                     failed; check the provider's receive queue size (`fi_info -v`: rx_attr \
                     size)",
                ));
            }
        }

        let mut addr = ep.name(ep.ep, &v)?;
        ep.own_addr_len = addr.len();
        if let Some(data) = ep.imm.as_ref().map(|i| i.ep) {
            addr.extend_from_slice(&ep.name(data, &v)?);
        }
        ep.addr = EndpointAddr(addr);
        ep.read_limits();
        Ok(ep)
    }

    /// Open, configure, bind and enable one libfabric endpoint on this endpoint's domain, CQ
    /// and AV (the message endpoint, and the data endpoint where immediates need receives).
    fn open_ep(
        &mut self,
        info: *mut fi::fi_info,
        v: &select::View,
        opts: &Options,
    ) -> Result<*mut fi::fid_ep> {
        let mut raw: *mut fi::fid_ep = ptr::null_mut();
        // SAFETY: the domain is live and info is the entry it was opened from.
        let ret = unsafe { fi::rs_fi_endpoint(self.domain.ptr, info, &mut raw) };
        check("fi_endpoint", ret, v)?;
        // Closes the endpoint if a step below fails.
        struct Guard(*mut fi::fid_ep);
        impl Drop for Guard {
            fn drop(&mut self) {
                if !self.0.is_null() {
                    // SAFETY: an endpoint opened above and not handed out, closed once.
                    unsafe { fi::rs_fi_close(fi::rs_fi_ep_fid(self.0)) };
                }
            }
        }
        let mut guard = Guard(raw);
        // SAFETY: raw is the endpoint just opened; cq and av are open on the same domain.
        unsafe {
            check(
                "fi_ep_bind(cq)",
                fi::rs_fi_ep_bind(
                    raw,
                    fi::rs_fi_cq_fid(self.cq),
                    fi::FI_TRANSMIT | fi::FI_RECV,
                ),
                v,
            )?;
            check(
                "fi_ep_bind(av)",
                fi::rs_fi_ep_bind(raw, fi::rs_fi_av_fid(self.av), 0),
                v,
            )?;
        }
        self.set_options(raw, v, opts)?;
        // SAFETY: raw is bound to its CQ and AV.
        let mut ret = unsafe { fi::rs_fi_enable(raw) };
        // shm names its region after the process id and an endpoint counter, and treats an
        // existing file of that name as busy when its recorded pid is alive or its layout
        // version differs. A region left by a killed process whose pid this process now has
        // (or by another libfabric release) therefore fails fi_enable with -FI_EBUSY on
        // 1.x-2.5; the provider unlinks that stale file in the same failing call, so a second
        // fi_enable creates the region afresh. 2.6 retries under a random name by itself. A
        // live endpoint cannot own the name: it carries this process's pid and a counter this
        // process never reuses.
        if ret == -fi::FI_EBUSY && v.core() == "shm" {
            // SAFETY: as above.
            ret = unsafe { fi::rs_fi_enable(raw) };
        }
        check("fi_enable", ret, v)?;
        guard.0 = ptr::null_mut();
        Ok(raw)
    }

    /// Endpoint options, set before `fi_enable` (efa reads them there).
    ///
    /// - `FI_OPT_SHARED_MEMORY_PERMITTED` off on efa (unless `shm=on`): the efa provider hands
    ///   peers on the same host to its shm sub-provider, so a "same host" efa run would
    ///   measure memory copies, not the NIC. aws-ofi-nccl and pplx-garden turn it off too.
    /// - `FI_OPT_CUDA_API_PERMITTED` off on efa where GPU memory may be registered (as
    ///   aws-ofi-nccl and pplx-garden): every GPU byte then moves by GPUDirect RDMA, never by
    ///   the provider's CUDA copies through the host. Where the device has no peer-to-peer
    ///   path the provider refuses (`-FI_EOPNOTSUPP`), and GPU memory is refused on this
    ///   endpoint with that reason (`cuda_api=on` permits the copies). shm's GPU support is
    ///   CUDA calls, so shm keeps the default unless `cuda_api=off`.
    fn set_options(
        &mut self,
        raw: *mut fi::fid_ep,
        v: &select::View,
        opts: &Options,
    ) -> Result<()> {
        // The option unknown to this provider or library: nothing to set.
        let unknown = |r: i32| r == -fi::FI_ENOPROTOOPT || r == -fi::FI_ENOSYS;
        let gpu = self.gpu_reason.is_none();
        for (opt, want) in endpoint_options(v.core(), gpu, opts) {
            // SAFETY: raw is an open endpoint, not yet enabled.
            let r = unsafe { fi::rs_fi_ep_setopt_bool(raw, opt.optname(), want as i32) };
            match opt {
                EpOpt::SharedMemoryPermitted => {
                    if r == 0 {
                        self.info.shm_permitted = Some(want);
                    } else if !(unknown(r) || want && r == -fi::FI_EINVAL) {
                        return Err(provider(
                            "fi_setopt(FI_OPT_SHARED_MEMORY_PERMITTED)",
                            r.into(),
                            "the efa provider refused the shared-memory setting; report this \
                             with `fi_info -p efa -v`",
                        ));
                    }
                }
                EpOpt::CudaApiPermitted => {
                    if r == 0 {
                        self.info.cuda_api_permitted = Some(want);
                    } else if r == -fi::FI_EOPNOTSUPP && !want {
                        // efa: no peer-to-peer path to the GPU; shm: GPU memory is CUDA calls.
                        self.gpu_reason = Some(format!(
                            "provider {} cannot move GPU memory without calling CUDA itself \
                             (FI_OPT_CUDA_API_PERMITTED=false refused: no GPUDirect RDMA \
                             peer-to-peer path); load nvidia-peermem or use a dmabuf-capable \
                             driver, or allow the provider's CUDA copies with the option \
                             cuda_api=on",
                            v.prov_name
                        ));
                        self.caps.gpu_memory = false;
                    } else if !unknown(r) && r != -fi::FI_EINVAL {
                        return Err(provider(
                            "fi_setopt(FI_OPT_CUDA_API_PERMITTED)",
                            r.into(),
                            format!("provider {} refused the CUDA API setting", v.prov_name),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The address of one of this endpoint's libfabric endpoints.
    fn name(&self, raw: *mut fi::fid_ep, v: &select::View) -> Result<Vec<u8>> {
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: the endpoint is enabled; name has `len` writable bytes.
        let mut ret =
            unsafe { fi::rs_fi_getname(fi::rs_fi_ep_fid(raw), name.as_mut_ptr().cast(), &mut len) };
        if ret == -(fi::FI_ETOOSMALL as i32) && len > name.len() {
            name.resize(len, 0);
            // SAFETY: as above, with the length the provider asked for.
            ret = unsafe {
                fi::rs_fi_getname(fi::rs_fi_ep_fid(raw), name.as_mut_ptr().cast(), &mut len)
            };
        }
        check("fi_getname", ret, v)?;
        name.truncate(len);
        Ok(name)
    }

    /// The provider's own message and WRITE size limits, where it reports them per endpoint
    /// (`FI_OPT_MAX_MSG_SIZE`, `FI_OPT_MAX_RMA_SIZE`, libfabric >= 1.20), and whether efa
    /// emulates WRITEs. `ep_attr->max_msg_size` is the larger of the two limits: on efa-direct
    /// a SEND is capped at the device's MTU (about 8 KiB) while a WRITE may be 1 GiB.
    fn read_limits(&mut self) {
        let get = |opt: i32| {
            let mut n: usize = 0;
            // SAFETY: ep is enabled; n is a valid out pointer for a size_t.
            let r = unsafe { fi::rs_fi_ep_getopt_size(self.ep, opt, &mut n) };
            (r == 0 && n > 0).then_some(n)
        };
        let (msg, rma) = limits(
            self.caps.max_msg_size,
            get(fi::RS_FI_OPT_MAX_MSG_SIZE),
            get(fi::RS_FI_OPT_MAX_RMA_SIZE),
        );
        (self.caps.max_msg_size, self.caps.max_write_size) = (msg, rma);
        if self.provider.split(';').next() == Some("efa") {
            let mut b: i32 = 0;
            // SAFETY: ep is enabled; b is a valid out pointer.
            let r = unsafe {
                fi::rs_fi_ep_getopt_bool(self.ep, fi::RS_FI_OPT_EFA_EMULATED_WRITE, &mut b)
            };
            if r == 0 {
                self.info.emulated_write = Some(b != 0);
            }
        }
    }
}

/// An endpoint option this backend sets (`fi_setopt`, level `FI_OPT_ENDPOINT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EpOpt {
    /// `FI_OPT_SHARED_MEMORY_PERMITTED`.
    SharedMemoryPermitted,
    /// `FI_OPT_CUDA_API_PERMITTED`.
    CudaApiPermitted,
}

impl EpOpt {
    fn optname(self) -> i32 {
        match self {
            EpOpt::SharedMemoryPermitted => fi::RS_FI_OPT_SHARED_MEMORY_PERMITTED,
            EpOpt::CudaApiPermitted => fi::RS_FI_OPT_CUDA_API_PERMITTED,
        }
    }
}

/// The options set on an endpoint of `core` provider, and their values (see
/// [`Endpoint::set_options`]): on efa, shared memory off unless `shm=on`, and the provider's
/// CUDA calls off where GPU memory may be registered; elsewhere only what `cuda_api` asks.
fn endpoint_options(core: &str, gpu: bool, opts: &Options) -> Vec<(EpOpt, bool)> {
    let efa = core == "efa";
    let mut out = Vec::new();
    if efa {
        out.push((EpOpt::SharedMemoryPermitted, opts.shm_permitted));
    }
    let cuda = match opts.cuda_api {
        CudaApi::Auto if efa => Some(false),
        CudaApi::Auto => None,
        CudaApi::On => Some(true),
        CudaApi::Off => Some(false),
    };
    if let Some(want) = cuda.filter(|_| gpu) {
        out.push((EpOpt::CudaApiPermitted, want));
    }
    out
}

/// Message and WRITE size limits from `ep_attr->max_msg_size` and, where the provider
/// answers them (libfabric >= 1.20), `FI_OPT_MAX_MSG_SIZE` and `FI_OPT_MAX_RMA_SIZE`, capped at
/// [`MAX_TRANSFER`]. On efa-direct `ep_attr->max_msg_size` is the larger of the device's
/// MTU and its RDMA limit (`efa_prov_info.c`), so only the options say that a SEND is capped
/// at the MTU (about 8 KiB) while a WRITE may be 1 GiB.
fn limits(info_max: usize, opt_msg: Option<usize>, opt_rma: Option<usize>) -> (usize, usize) {
    let base = info_max.min(MAX_TRANSFER);
    let pick = |o: Option<usize>| o.filter(|&n| n > 0).map_or(base, |n| n.min(MAX_TRANSFER));
    (pick(opt_msg), pick(opt_rma))
}

/// Whether a WRITE the target refuses comes back to the initiator as an error completion
/// ([`Caps::remote_write_errors`]).
///
/// - `efa`: the device's acknowledgement carries the target's verdict.
/// - Others with `FI_DELIVERY_COMPLETE` (`tcp`): the initiator's completion waits for the
///   target, which answers with an error; without it (`write_completion=transmit`) the
///   completion only says the data left.
/// - `shm`, whatever the flags: the target checks the key and range (`ofi_mr_map_verify` in
///   `smr_progress_cmd_rma`) and drops a bad WRITE, but answers nothing on 1.17 and 2.1 and
///   hands the command back as a success on 2.6 (read in 1.17.1, 2.1.0 and 2.6.0's sources,
///   and run on each; no `mr_mode` bit changes that path). The target memory is safe; the
///   initiator is not told.
fn remote_write_errors(core: &str, write_flags: u64) -> bool {
    match core {
        "shm" => false,
        "efa" => true,
        _ => write_flags & fi::FI_DELIVERY_COMPLETE != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// efa gets shared memory off (a same-host run measures the NIC, not shm's copies) and,
    /// with GPU memory, the provider's CUDA calls off (GPUDirect RDMA or nothing), as
    /// aws-ofi-nccl and pplx-garden set them; no other provider gets either unless asked.
    /// The backend set neither.
    #[test]
    fn endpoint_options_follow_the_provider() {
        let o = |kv: &[(&str, &str)]| {
            let m = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Options::parse(&m).unwrap()
        };
        use EpOpt::*;
        assert_eq!(
            endpoint_options("efa", true, &o(&[])),
            [(SharedMemoryPermitted, false), (CudaApiPermitted, false)]
        );
        assert_eq!(
            endpoint_options("efa", false, &o(&[])),
            [(SharedMemoryPermitted, false)]
        );
        assert_eq!(
            endpoint_options("efa", true, &o(&[("shm", "on"), ("cuda_api", "on")])),
            [(SharedMemoryPermitted, true), (CudaApiPermitted, true)]
        );
        assert_eq!(endpoint_options("shm", true, &o(&[])), []);
        assert_eq!(
            endpoint_options("tcp", false, &o(&[("cuda_api", "off")])),
            []
        );
        assert_eq!(
            endpoint_options("shm", true, &o(&[("cuda_api", "off")])),
            [(CudaApiPermitted, false)]
        );
    }

    /// Only rxm over verbs gets the universe-size hint (its CQ, too large for rxe).
    #[test]
    fn rxm_over_verbs_is_told_about_the_universe_size() {
        assert!(provider_hint("verbs;ofi_rxm").contains("FI_UNIVERSE_SIZE=64"));
        for p in ["tcp;ofi_rxm", "tcp", "shm", "efa", "verbs;ofi_rxd"] {
            assert_eq!(provider_hint(p), "", "{p}");
        }
    }

    /// efa-direct reports `max_msg_size` 1 GiB (the larger of MTU and RDMA limit) while a
    /// SEND is capped at the MTU: the per-endpoint options give each its own limit. The
    /// backend reported 1 GiB for both, so a large SEND failed at the provider.
    #[test]
    fn send_and_write_limits_are_the_providers_own() {
        let gib = 1 << 30;
        assert_eq!(limits(gib, Some(8928), Some(gib)), (8928, gib));
        assert_eq!(limits(usize::MAX, Some(usize::MAX), None), (gib, gib));
        assert_eq!(limits(65536, None, None), (65536, 65536));
        assert_eq!(limits(gib, Some(0), Some(4096)), (gib, 4096));
    }
}
