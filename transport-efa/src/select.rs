//! Choosing the fi_info entry to open: provider, fabric and domain, from `NicDesc`.
//!
//! The API version and threading model asked, the hints, `fi_getinfo` and the choice among
//! its entries. The options it reads are parsed in `options.rs`, the NIC is matched in
//! `nic.rs`.

use std::ptr;

use libfabric_sys as fi;
use transport_core::{Error, NicDesc, Result};

use crate::error::{cstr, provider, runtime_version};
use crate::mr::MrMode;
use crate::nic::{dedup, match_nic, DomainInfo, Pci};
use crate::options::{Hmem, Options};

/// The oldest libfabric this backend runs on (Debian 12's).
pub(crate) const MIN_API_VERSION: u32 = fi::fi_version_of(1, 17);

/// The API version asked of `fi_getinfo`: the highest that both the library loaded at run
/// time (`fi_version()`) and the headers this crate was built against know.
///
/// The version asked changes what providers do, not only what they offer. The efa provider
/// below 1.18 turns device RDMA off on the first two EFA generations (p4d, p5: vendor part
/// ids 0xefa0 and 0xefa1), so WRITEs are emulated over SENDs and `FI_HMEM` needs GPUDirect
/// where 1.18 may use CUDA calls (`efa_rdm_get_use_device_rdma`, `efa_user_info.c`); below
/// 1.20 it refuses `FI_MR_DMABUF` registrations (`efa_mr_regattr_validate`). aws-ofi-nccl
/// asks for 1.18, or 1.20 where it registers dmabufs. Asking for more than the headers know
/// would let a provider assume struct fields this build does not have.
pub(crate) fn api_version() -> u32 {
    // SAFETY: fi_version takes no arguments and only returns a number.
    let runtime = unsafe { fi::fi_version() };
    negotiate_api(runtime, header_api_version())
}

/// `FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)` of the headers this crate was built with.
pub(crate) fn header_api_version() -> u32 {
    let (major, minor) = fi::HEADER_VERSION;
    fi::fi_version_of(major, minor)
}

/// The version to ask for, given the library's and the headers': the lower of the two, and
/// never below [`MIN_API_VERSION`] (an older library then answers with a clear error).
pub(crate) fn negotiate_api(runtime: u32, headers: u32) -> u32 {
    runtime.min(headers).max(MIN_API_VERSION)
}

/// `major.minor` of an API version.
pub(crate) fn version_string(v: u32) -> String {
    format!("{}.{}", fi::fi_major(v), fi::fi_minor(v))
}

/// The threading model asked for: `FI_THREAD_DOMAIN`. The application (this backend)
/// serializes every call on a domain's endpoint, CQ and AV: an [`crate::Endpoint`] owns its
/// own fabric, domain, endpoint, CQ and AV, and each of its calls takes `&mut self`. A
/// region may still be closed on another thread (it is `Send`); every provider this backend
/// runs on guards its registration map with the domain's own lock whatever the model
/// (`util_domain.lock`, a mutex or spinlock set at `ofi_domain_init`, taken by
/// `ofi_mr_map_verify`'s callers in efa 2.x and shm), so that stays safe.
///
/// `FI_THREAD_SAFE` costs a lock per operation: the efa provider (2.x) takes its
/// `srx_lock` on every post and poll unless the model is `FI_THREAD_DOMAIN`
/// (`efa_domain_open`: `use_lock` for models up to `FI_THREAD_COMPLETION`). pplx-garden asks
/// for `FI_THREAD_DOMAIN`, aws-ofi-nccl for `FI_THREAD_COMPLETION`.
pub(crate) const THREADING: fi::fi_threading = fi::FI_THREAD_DOMAIN;

/// The name of a threading model.
pub(crate) fn threading_name(t: i32) -> &'static str {
    match t as fi::fi_threading {
        fi::FI_THREAD_UNSPEC => "FI_THREAD_UNSPEC",
        fi::FI_THREAD_SAFE => "FI_THREAD_SAFE",
        fi::FI_THREAD_FID => "FI_THREAD_FID",
        fi::FI_THREAD_DOMAIN => "FI_THREAD_DOMAIN",
        fi::FI_THREAD_COMPLETION => "FI_THREAD_COMPLETION",
        fi::FI_THREAD_ENDPOINT => "FI_THREAD_ENDPOINT",
        _ => "FI_THREAD_?",
    }
}

/// Capabilities every endpoint asks for. `FI_REMOTE_CQ_DATA` is not a capability: remote CQ
/// data is asked for through `domain_attr->cq_data_size`.
pub(crate) const BASE_CAPS: u64 =
    fi::FI_MSG | fi::FI_RMA | fi::FI_SEND | fi::FI_RECV | fi::FI_WRITE | fi::FI_REMOTE_WRITE;

/// Bytes of remote CQ data asked for (the 32-bit immediate).
pub(crate) const CQ_DATA_SIZE: usize = 4;

/// One fi_info entry, copied out of libfabric's list through the version-independent view.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    pub prov_name: String,
    pub fabric_name: String,
    pub domain_name: String,
    pub caps: u64,
    pub mr_mode: u64,
    pub addr_format: u32,
    pub max_msg_size: usize,
    pub tx_size: usize,
    pub rx_size: usize,
    pub inject_size: usize,
    pub cq_data_size: usize,
    pub link_speed: u64,
    pub mode: u64,
    pub rx_mode: u64,
    pub threading: i32,
    pub api_version: u32,
    /// The NIC's PCI function, where the provider reports it (`fi_info->nic->bus_attr`).
    pub pci: Option<Pci>,
    /// `fi_info->nic->device_attr->name` (`rdmap79s0` for the domain `rdmap79s0-rdm`).
    pub nic_name: String,
    /// `fi_info->nic->device_attr->firmware`, where the provider reports it.
    pub firmware: String,
    /// `fi_info->fabric_attr->prov_version`.
    pub prov_version: u32,
}

impl View {
    /// The parts of this entry a NIC is matched against.
    pub fn domain_info(&self) -> DomainInfo {
        DomainInfo {
            provider: self.prov_name.clone(),
            fabric: self.fabric_name.clone(),
            domain: self.domain_name.clone(),
            nic_name: self.nic_name.clone(),
            pci: self.pci,
        }
    }
    /// The core provider: `tcp` of `tcp;ofi_rxm`.
    pub fn core(&self) -> &str {
        self.prov_name.split(';').next().unwrap_or("")
    }
    /// Whether a utility provider is layered over the core one (`tcp;ofi_rxm`).
    pub fn layered(&self) -> bool {
        self.prov_name.contains(';')
    }
}

/// A list returned by `fi_getinfo`, freed on drop.
pub(crate) struct InfoList {
    head: *mut fi::fi_info,
    entries: Vec<(*mut fi::fi_info, View)>,
}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: head came from fi_getinfo and is freed once, here.
            unsafe { fi::fi_freeinfo(self.head) };
        }
    }
}

impl InfoList {
    pub fn entries(&self) -> &[(*mut fi::fi_info, View)] {
        &self.entries
    }
}

/// `fi_getinfo` with `hints`; an empty list where nothing matches (`-FI_ENODATA`).
fn getinfo(hints: *const fi::fi_info) -> Result<InfoList> {
    let mut head: *mut fi::fi_info = ptr::null_mut();
    // SAFETY: hints is NULL or a valid fi_info from fi_allocinfo; head is a valid out pointer.
    let ret =
        unsafe { fi::fi_getinfo(api_version(), ptr::null(), ptr::null(), 0, hints, &mut head) };
    if ret == -fi::FI_ENODATA {
        return Ok(InfoList {
            head: ptr::null_mut(),
            entries: Vec::new(),
        });
    }
    if ret != 0 {
        return Err(provider(
            "fi_getinfo",
            ret.into(),
            format!(
                "libfabric {} could not be queried; this backend needs libfabric >= 1.17",
                runtime_version()
            ),
        ));
    }
    let mut entries = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        entries.push((cur, view(cur)));
        // SAFETY: cur is an entry of the list fi_getinfo returned, alive until freeinfo.
        cur = unsafe { fi::rs_fi_info_next(cur) };
    }
    Ok(InfoList { head, entries })
}

fn view(info: *const fi::fi_info) -> View {
    let mut v = fi::rs_fi_info_view::default();
    // SAFETY: info is a live fi_info entry; the view is plain data written by the helper.
    unsafe { fi::rs_fi_info_view(info, &mut v) };
    View {
        // SAFETY: the strings belong to the live fi_info entry and are copied here.
        prov_name: unsafe { cstr(v.prov_name) },
        // SAFETY: as above.
        fabric_name: unsafe { cstr(v.fabric_name) },
        // SAFETY: as above.
        domain_name: unsafe { cstr(v.domain_name) },
        caps: v.caps,
        mr_mode: v.mr_mode,
        addr_format: v.addr_format,
        max_msg_size: v.max_msg_size,
        tx_size: v.tx_size,
        rx_size: v.rx_size,
        inject_size: v.inject_size,
        cq_data_size: v.cq_data_size,
        link_speed: v.link_speed,
        mode: v.mode,
        rx_mode: v.rx_mode,
        threading: v.threading,
        api_version: v.api_version,
        pci: (v.has_pci != 0).then_some(Pci {
            domain: v.pci_domain,
            bus: v.pci_bus,
            device: v.pci_device,
            function: v.pci_function,
        }),
        // SAFETY: as above.
        nic_name: unsafe { cstr(v.nic_name) },
        // SAFETY: as above.
        firmware: unsafe { cstr(v.nic_firmware) },
        prov_version: v.prov_version,
    }
}

/// Hints for our RDM endpoint, freed on drop.
struct Hints(*mut fi::fi_info);

impl Drop for Hints {
    fn drop(&mut self) {
        // SAFETY: allocated by rs_fi_rdm_hints (fi_allocinfo), freed once.
        unsafe { fi::fi_freeinfo(self.0) };
    }
}

fn rdm_hints(caps: u64, mr_mode: u64, tx: usize, rx: usize, rx_cq_data: bool) -> Result<Hints> {
    // FI_CONTEXT / FI_CONTEXT2: every operation's context points at a slab slot of
    // struct fi_context2, so providers that need them get them. FI_RX_CQ_DATA is offered
    // only on a second query (see `select`): efa-direct takes an offered FI_RX_CQ_DATA even
    // where the device could deliver immediates without a posted receive.
    let mut mode = fi::FI_CONTEXT | fi::FI_CONTEXT2;
    if rx_cq_data {
        mode |= fi::FI_RX_CQ_DATA;
    }
    // SAFETY: plain values in; a freshly allocated fi_info (or NULL) out.
    let h =
        unsafe { fi::rs_fi_rdm_hints(caps, mode, mr_mode, CQ_DATA_SIZE, tx, rx, THREADING as i32) };
    if h.is_null() {
        return Err(Error::Provider {
            call: "fi_allocinfo",
            code: -12,
            msg: "out of memory".into(),
            hint: "the process is out of memory".into(),
        });
    }
    Ok(Hints(h))
}

/// Every provider name libfabric offers here (any endpoint type), for error messages.
pub(crate) fn available_providers() -> Vec<String> {
    let mut names: Vec<String> = match getinfo(ptr::null()) {
        Ok(list) => list
            .entries()
            .iter()
            .map(|(_, v)| v.core().to_string())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names.dedup();
    names.retain(|n| !n.is_empty());
    names
}

/// The RDM domains offered with this backend's capabilities, of one provider or all.
pub(crate) fn offered(provider: Option<&str>) -> Result<Vec<DomainInfo>> {
    let mut out = Vec::new();
    for rx_cq_data in [false, true] {
        let list = getinfo(rdm_hints(BASE_CAPS, MrMode::SUPPORTED.0, 0, 0, rx_cq_data)?.0)?;
        for (_, v) in list.entries() {
            let d = v.domain_info();
            if provider.is_none_or(|p| v.core() == p || v.prov_name == p) && !out.contains(&d) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// What `open` decided: the list (kept alive while the endpoint is created) and the entry.
pub(crate) struct Selected {
    pub list: InfoList,
    pub index: usize,
    /// Why GPU memory cannot be registered, or `None` where it can.
    pub gpu_reason: Option<String>,
}

impl Selected {
    pub fn info(&self) -> *mut fi::fi_info {
        self.list.entries()[self.index].0
    }
    pub fn view(&self) -> &View {
        &self.list.entries()[self.index].1
    }
}

/// Whether a CUDA device is there to register memory of.
fn cuda_device_present() -> std::result::Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        if !transport_core::cuda_driver_present() {
            return Err(
                "no CUDA driver (libcuda.so) was found when the endpoint was opened".into(),
            );
        }
        match transport_core::cuda_device_count() {
            Ok(n) if n > 0 => Ok(()),
            Ok(_) => Err("CUDA sees no device".into()),
            Err(e) => Err(format!("CUDA: {e}")),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("transport-efa was built without its `cuda` feature".into())
    }
}

/// Whether to ask for `FI_HMEM`, or why not: `hmem=on|off` decide; under `hmem=auto` an
/// endpoint that will register no GPU memory ([`NicDesc::gpu_memory`] `Some(false)`) asks for
/// none, and otherwise one asks where a CUDA device is present.
///
/// Asking costs host memory on `shm`: libfabric (1.17 to 2.6) turns its single-copy CMA path
/// off for any endpoint whose capabilities include `FI_HMEM` (`smr_ep_ctrl`, `FI_ENABLE`:
/// `if (ep->util_ep.caps & FI_HMEM || smr_env.disable_cma)`), so every host message above the
/// inject size then goes twice through the segmented (SAR) bounce buffers. fabtests ask for
/// `FI_HMEM` only with `-D`; on a host with a GPU, `rdma-bench --mem host` asked for it anyway
/// and ran at 0.28x to 0.56x of fabtests at 64 KiB.
fn want_hmem(
    hmem: Hmem,
    gpu_memory: Option<bool>,
    cuda_device: impl FnOnce() -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    match (hmem, gpu_memory) {
        (Hmem::Off, _) => Err("the endpoint was opened with hmem=off".to_string()),
        (Hmem::On, _) => Ok(()),
        (Hmem::Auto, Some(false)) => Err(
            "the endpoint was opened for host memory only (NicDesc::gpu_memory is Some(false); \
             rdma-bench --mem host), so it did not ask for FI_HMEM"
                .to_string(),
        ),
        (Hmem::Auto, _) => cuda_device(),
    }
}

/// Pick the fi_info entry for `nic`.
pub(crate) fn select(nic: &NicDesc, opts: &Options) -> Result<Selected> {
    let mr_mode = if opts.mr_strict {
        MrMode::STRICT.0
    } else {
        MrMode::SUPPORTED.0
    };
    let tx = nic.tx_depth.unwrap_or(0);
    let rx = nic.rx_depth.unwrap_or(0);

    let want_hmem = want_hmem(opts.hmem, nic.gpu_memory, cuda_device_present);
    if want_hmem.is_ok() {
        match query(
            BASE_CAPS | fi::FI_HMEM,
            mr_mode | fi::FI_MR_HMEM,
            tx,
            rx,
            nic,
            opts,
        ) {
            Ok((list, index)) => {
                return Ok(Selected {
                    list,
                    index,
                    gpu_reason: None,
                })
            }
            Err(_) => {
                if opts.hmem == Hmem::On {
                    // Is it the provider or FI_HMEM that is missing?
                    let (plain, index) = query(BASE_CAPS, mr_mode, tx, rx, nic, opts)?;
                    return Err(no_hmem(&plain.entries()[index].1));
                }
            }
        }
    }
    let (list, index) = query(BASE_CAPS, mr_mode, tx, rx, nic, opts)?;
    let gpu_reason = match want_hmem {
        Err(why) => Some(why),
        Ok(()) => Some(format!(
            "provider {} on libfabric {} has no FI_HMEM support",
            list.entries()[index].1.prov_name,
            runtime_version()
        )),
    };
    Ok(Selected {
        list,
        index,
        gpu_reason,
    })
}

/// `fi_getinfo` and [`choose`]: first without offering `FI_RX_CQ_DATA`, then, where nothing
/// matched, offering it. efa-direct (libfabric >= 2.1) offers `FI_RMA` without that mode only
/// on devices that deliver a WRITE's immediate without a posted receive ("unsolicited write
/// receive"); elsewhere it returns its entries only to an application that posts receives for
/// immediates (`efa_user_info.c`). Asking without it first keeps the unsolicited path where
/// the device has it: efa-direct takes an offered `FI_RX_CQ_DATA` and then turns that path off
/// (`efa_base_ep_create_qp`).
fn query(
    caps: u64,
    mr_mode: u64,
    tx: usize,
    rx: usize,
    nic: &NicDesc,
    opts: &Options,
) -> Result<(InfoList, usize)> {
    let first = getinfo(rdm_hints(caps, mr_mode, tx, rx, opts.rx_cq_data_forced)?.0)?;
    let err = match choose(&first, nic, opts) {
        Ok(i) => return Ok((first, i)),
        Err(e) => e,
    };
    if opts.rx_cq_data_forced {
        return Err(err);
    }
    let second = getinfo(rdm_hints(caps, mr_mode, tx, rx, true)?.0)?;
    match choose(&second, nic, opts) {
        Ok(i) => Ok((second, i)),
        Err(_) => Err(err),
    }
}

fn no_hmem(v: &View) -> Error {
    Error::Unsupported(format!(
        "provider {} (domain {}) on libfabric {} has no FI_HMEM support, so GPU memory cannot \
         be registered (hmem=on). Use host memory (hmem=auto or off), or a libfabric built \
         with CUDA support (the EFA installer's under /opt/amazon/efa)",
        v.prov_name,
        v.domain_name,
        runtime_version()
    ))
}

/// The index of the entry to open, or why there is none.
fn choose(list: &InfoList, nic: &NicDesc, opts: &Options) -> Result<usize> {
    let want = nic.provider.as_deref().unwrap_or("efa");
    let entries = list.entries();

    // Exact provider string (`tcp;ofi_rxm`), else the core provider, unlayered first: a
    // utility provider wrap is taken only where the core provider has no RDM endpoint of its
    // own (tcp on libfabric 1.17 is `tcp;ofi_rxm`).
    let exact: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].1.prov_name == want)
        .collect();
    let mut cands = if !exact.is_empty() {
        exact
    } else {
        let core: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].1.core() == want)
            .collect();
        let plain: Vec<usize> = core
            .iter()
            .copied()
            .filter(|&i| !entries[i].1.layered())
            .collect();
        if plain.is_empty() {
            core
        } else {
            plain
        }
    };
    if cands.is_empty() {
        let avail = available_providers();
        return Err(if avail.iter().any(|p| p == want) {
            Error::Unsupported(format!(
                "libfabric provider `{want}` (libfabric {}) offers no FI_EP_RDM endpoint with \
                 FI_MSG | FI_RMA and {CQ_DATA_SIZE} bytes of remote CQ data; providers here: {}; \
                 choose another provider",
                runtime_version(),
                avail.join(", ")
            ))
        } else {
            Error::NoDevice(format!(
                "no libfabric provider `{want}` (libfabric {}): available providers are {}; \
                 set the provider (--provider shm, --provider tcp, ...)",
                runtime_version(),
                if avail.is_empty() {
                    "none".to_string()
                } else {
                    avail.join(", ")
                }
            ))
        });
    }

    if let Some(fabric) = &opts.fabric {
        let names: Vec<String> = cands
            .iter()
            .map(|&i| entries[i].1.fabric_name.clone())
            .collect();
        cands.retain(|&i| &entries[i].1.fabric_name == fabric);
        if cands.is_empty() {
            return Err(Error::NoDevice(format!(
                "provider `{want}` has no fabric `{fabric}`: its fabrics are {}",
                dedup(names).join(", ")
            )));
        }
    }

    let domains: Vec<DomainInfo> = cands.iter().map(|&i| entries[i].1.domain_info()).collect();
    let mut cands: Vec<usize> = match_nic(&domains, nic)?
        .into_iter()
        .map(|k| cands[k])
        .collect();

    // Prefer the fabric named like the provider: on EFA 2.x that is `efa` (the full RDM
    // protocol) over `efa-direct` (device limits: MTU-sized messages, no ordering), which is
    // chosen with fabric=efa-direct.
    cands.sort_by_key(|&i| entries[i].1.fabric_name != entries[i].1.core());
    Ok(cands[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host-memory endpoint asks for no FI_HMEM even where a CUDA device is present (on
    /// shm that keeps the single-copy CMA path); the explicit option still wins. The backend
    /// asked for FI_HMEM wherever a CUDA device was present, whatever memory followed.
    #[test]
    fn fi_hmem_is_asked_only_where_gpu_memory_may_come() {
        let cuda = || Ok(());
        let no_cuda = || Err("CUDA sees no device".to_string());
        assert!(want_hmem(Hmem::Auto, None, cuda).is_ok());
        assert!(want_hmem(Hmem::Auto, Some(true), cuda).is_ok());
        let e = want_hmem(Hmem::Auto, Some(false), cuda).unwrap_err();
        assert!(e.contains("host memory only"), "{e}");
        assert!(want_hmem(Hmem::Auto, None, no_cuda).is_err());
        assert!(want_hmem(Hmem::Auto, Some(true), no_cuda).is_err());
        assert!(want_hmem(Hmem::On, Some(false), no_cuda).is_ok());
        assert!(want_hmem(Hmem::Off, Some(true), cuda).is_err());
    }

    /// The API version asked is the highest both the library and the headers know: on a 2.x
    /// library (the EFA installer's) that is 2.x, which keeps the efa provider's device RDMA
    /// on (p4d, p5: below 1.18 it is off by default) and its dmabuf registration available
    /// (1.20). This backend asked for 1.17 everywhere.
    #[test]
    fn the_api_version_is_the_highest_both_know() {
        let v = fi::fi_version_of;
        assert_eq!(negotiate_api(v(2, 6), v(2, 6)), v(2, 6));
        assert_eq!(negotiate_api(v(2, 6), v(1, 17)), v(1, 17));
        assert_eq!(negotiate_api(v(1, 17), v(2, 6)), v(1, 17));
        assert_eq!(negotiate_api(v(1, 16), v(1, 16)), v(1, 17));
        // This build: never above its headers, at least 1.18 wherever both are 2.x.
        let asked = api_version();
        assert!(asked <= header_api_version());
        if fi::HEADER_VERSION.0 >= 2 && crate::error::runtime_major() >= 2 {
            assert!(asked >= v(1, 20), "{}", version_string(asked));
        }
    }
}
