//! Choosing the fi_info entry to open: provider, fabric and domain, from `NicDesc`.

use std::collections::BTreeMap;
use std::ptr;

use libfabric_sys as fi;
use transport_core::{Error, NicDesc, Result};

use crate::error::{cstr, provider, runtime_version};
use crate::MrMode;

/// The API version asked of `fi_getinfo`: 1.17 works on Debian's 1.17 and on 2.x.
pub(crate) const API_VERSION: u32 = fi::fi_version_of(1, 17);

/// Capabilities every endpoint asks for. `FI_REMOTE_CQ_DATA` is not a capability: remote CQ
/// data is asked for through `domain_attr->cq_data_size`.
pub(crate) const BASE_CAPS: u64 =
    fi::FI_MSG | fi::FI_RMA | fi::FI_SEND | fi::FI_RECV | fi::FI_WRITE | fi::FI_REMOTE_WRITE;

/// Bytes of remote CQ data asked for (the 32-bit immediate).
pub(crate) const CQ_DATA_SIZE: usize = 4;

/// Backend options from `NicDesc::options`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// `mr_mode=strict`: ask for exactly EFA's set (LOCAL | VIRT_ADDR | ALLOCATED | PROV_KEY).
    pub mr_strict: bool,
    /// `hmem=auto|on|off`.
    pub hmem: Hmem,
    /// `fabric=NAME`: only entries of that fabric (e.g. `efa-direct`, `127.0.0.1/32`).
    pub fabric: Option<String>,
    /// `write_completion=auto|delivery|transmit`.
    pub write_completion: WriteCompletion,
}

/// Completion semantics of WRITEs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum WriteCompletion {
    /// `transmit` on efa and shm, `delivery` elsewhere.
    #[default]
    Auto,
    /// `FI_DELIVERY_COMPLETE`.
    Delivery,
    /// The provider's default (`FI_TRANSMIT_COMPLETE` or weaker).
    Transmit,
}

/// Whether to ask for `FI_HMEM` (GPU memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Hmem {
    /// Where a CUDA device is present, falling back to host memory only.
    #[default]
    Auto,
    /// Always; opening fails where the provider has no `FI_HMEM`.
    On,
    /// Never.
    Off,
}

/// The option keys this backend knows, for error messages.
pub(crate) const OPTION_KEYS: &str = "mr_mode=strict|default, hmem=auto|on|off, \
     write_completion=auto|delivery|transmit, fabric=NAME";

impl Options {
    pub(crate) fn parse(options: &BTreeMap<String, String>) -> Result<Self> {
        let mut o = Options::default();
        for (k, v) in options {
            match (k.as_str(), v.as_str()) {
                ("mr_mode", "strict") => o.mr_strict = true,
                ("mr_mode", "default") => o.mr_strict = false,
                ("hmem", "auto") => o.hmem = Hmem::Auto,
                ("hmem", "on") => o.hmem = Hmem::On,
                ("hmem", "off") => o.hmem = Hmem::Off,
                ("write_completion", "auto") => o.write_completion = WriteCompletion::Auto,
                ("write_completion", "delivery") => o.write_completion = WriteCompletion::Delivery,
                ("write_completion", "transmit") => o.write_completion = WriteCompletion::Transmit,
                ("fabric", name) if !name.is_empty() => o.fabric = Some(name.to_string()),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown libfabric option `{k}={v}`; known options: {OPTION_KEYS}"
                    )))
                }
            }
        }
        Ok(o)
    }
}

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
}

impl View {
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
    let ret = unsafe { fi::fi_getinfo(API_VERSION, ptr::null(), ptr::null(), 0, hints, &mut head) };
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

fn rdm_hints(caps: u64, mr_mode: u64, tx: usize, rx: usize) -> Result<Hints> {
    // FI_CONTEXT / FI_CONTEXT2: every operation's context points at a slab slot of
    // struct fi_context2, so providers that need them get them.
    let mode = fi::FI_CONTEXT | fi::FI_CONTEXT2;
    // SAFETY: plain values in; a freshly allocated fi_info (or NULL) out.
    let h = unsafe { fi::rs_fi_rdm_hints(caps, mode, mr_mode, CQ_DATA_SIZE, tx, rx) };
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

/// Pick the fi_info entry for `nic`.
pub(crate) fn select(nic: &NicDesc, opts: &Options) -> Result<Selected> {
    let mr_mode = if opts.mr_strict {
        MrMode::STRICT.0
    } else {
        MrMode::SUPPORTED.0
    };
    let tx = nic.tx_depth.unwrap_or(0);
    let rx = nic.rx_depth.unwrap_or(0);

    let want_hmem = match opts.hmem {
        Hmem::Off => Err("the endpoint was opened with hmem=off".to_string()),
        Hmem::On => Ok(()),
        Hmem::Auto => cuda_device_present(),
    };
    if want_hmem.is_ok() {
        let list =
            getinfo(rdm_hints(BASE_CAPS | fi::FI_HMEM, mr_mode | fi::FI_MR_HMEM, tx, rx)?.0)?;
        match choose(&list, nic, opts) {
            Ok(index) => {
                return Ok(Selected {
                    list,
                    index,
                    gpu_reason: None,
                })
            }
            Err(_) => {
                if opts.hmem == Hmem::On {
                    // Is it the provider or FI_HMEM that is missing?
                    let plain = getinfo(rdm_hints(BASE_CAPS, mr_mode, tx, rx)?.0)?;
                    let index = choose(&plain, nic, opts)?;
                    return Err(no_hmem(&plain.entries()[index].1));
                }
            }
        }
    }
    let list = getinfo(rdm_hints(BASE_CAPS, mr_mode, tx, rx)?.0)?;
    let index = choose(&list, nic, opts)?;
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

    if let Some(dev) = &nic.device {
        let names: Vec<String> = cands
            .iter()
            .map(|&i| entries[i].1.domain_name.clone())
            .collect();
        cands.retain(|&i| &entries[i].1.domain_name == dev);
        if cands.is_empty() {
            return Err(Error::NoDevice(format!(
                "provider `{want}` has no domain (NIC) `{dev}`: its domains are {}; \
                 set the device to one of them",
                dedup(names).join(", ")
            )));
        }
    }

    // Prefer the fabric named like the provider: on EFA 2.x that is `efa` (the full RDM
    // protocol) over `efa-direct` (device limits: MTU-sized messages, no ordering), which is
    // chosen with fabric=efa-direct.
    cands.sort_by_key(|&i| entries[i].1.fabric_name != entries[i].1.core());
    Ok(cands[0])
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    v.retain(|s| seen.insert(s.clone()));
    v
}
