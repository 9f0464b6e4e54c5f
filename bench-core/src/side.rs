//! One side of a session: its endpoints (one per NIC, `nics_per_gpu` per GPU), its registered
//! regions, and the peer's NICs once the handshake is done.

use std::time::Duration;

use transport_core::{
    Caps, Completion, EndpointAddr, HostBuffer, Memory, MemoryRegion, NicDesc, PeerId,
    RemoteRegion, Transport,
};

use crate::buffers;

/// Smallest GPU data region registered. Measured on an H100 with libfabric 2.6.0's `shm`
/// (CUDA build): between two endpoints of one process, each with a 64-byte CUDA region (an
/// 8-byte `lat`), the 8-byte WRITEs with immediate were checked against the wrong region
/// (`ofi_mr_map_verify`: target range outside the registered one) and dropped, so the
/// ping-pong timed out. Every region up to 2 KiB failed so, 4 KiB and up worked, and so did
/// separate processes; with this floor, 8-byte `lat` runs (p50 18.7 us one-way). Regions of
/// at least this size cost nothing that matters and keep small-message runs working.
pub const GPU_MIN_REGION: usize = 64 * 1024;
use crate::config::MemKind;
use crate::error::{Error, Result, TransportContext};
use crate::proto::{NicWire, CTRL_LEN, MAX_NAME, MAX_NICS, MRS_PER_NIC};
use crate::record::Facts;
use crate::teardown::AtTeardown;
use crate::topo_glue::Hints;

/// With host memory and no GPU on the machine, GPU indexes name logical NIC groups below this.
pub const LOGICAL_GPUS: usize = 16;

/// How one side opens its NICs. The backend is the type a session runs with
/// (`Side::<T>::open`); this says which of its NICs, and how.
#[derive(Clone, Debug)]
pub struct SideCfg {
    /// The backend's provider, for backends with providers (`NicDesc::provider`).
    pub provider: Option<String>,
    pub devices: Vec<String>,
    /// Backend options for every NIC, in order: a later one wins over an earlier one of the
    /// same key (`rdma-bench` puts the backend's options variable first, `--nic-opt` after).
    pub options: Vec<(String, String)>,
    /// Whether the endpoints go over this machine's RDMA NICs (the backend names a NIC driver
    /// for the provider, `transport_core::BackendInfo::nic_driver`), not a provider that
    /// copies memory (shm, tcp): only then is each GPU's NIC taken from its NIC group.
    pub real_nics: bool,
    pub gpus: Vec<usize>,
    pub nics_per_gpu: usize,
    pub mem: MemKind,
    /// Bytes into a page where each data region starts (`--buf-offset`, host or GPU memory;
    /// the server takes the client's from its hello).
    pub buf_offset: u32,
    pub verbose: u8,
    pub idle: Duration,
    pub hints: Option<Hints>,
    /// What this side tells its peer about itself, and its run record starts from (the
    /// session adds the backend's runtime facts).
    pub facts: Facts,
    /// Where both sides run in this process (loopback): the gate both wait at before either
    /// closes its endpoints ([`crate::teardown`]).
    pub teardown: Option<std::sync::Arc<crate::teardown::TeardownGate>>,
}

impl Default for SideCfg {
    /// What `rdma-bench`'s flags default to: the backend's default provider, one endpoint on
    /// GPU (or logical NIC group) 0, host memory, a 10 s idle timeout, and no topology (set
    /// `hints` from [`crate::topo_glue::hints`] to place NICs and threads).
    fn default() -> Self {
        SideCfg {
            provider: None,
            devices: Vec::new(),
            options: Vec::new(),
            real_nics: true,
            gpus: vec![0],
            nics_per_gpu: 1,
            mem: MemKind::Host,
            buf_offset: 0,
            verbose: 0,
            idle: Duration::from_secs(10),
            hints: None,
            facts: Facts::default(),
            teardown: None,
        }
    }
}

impl SideCfg {
    /// Check the GPU list and NIC counts against this machine; a usage error says what is
    /// wrong.
    pub fn check(&self) -> Result<()> {
        if self.nics_per_gpu == 0 || self.nics_per_gpu > 64 {
            return Err(Error::Usage(format!(
                "--nics-per-gpu {}: allowed 1..=64",
                self.nics_per_gpu
            )));
        }
        if self.gpus.len() * self.nics_per_gpu > MAX_NICS {
            return Err(Error::Usage(format!("more than {MAX_NICS} NICs in total")));
        }
        buffers::check_page_offset(self.buf_offset)?;
        let (n, here) = self.gpus_here()?;
        if let Some(&g) = self.gpus.iter().find(|&&g| g >= n) {
            return Err(Error::Usage(format!(
                "GPU {g} is out of range: {here} (0..{n})"
            )));
        }
        Ok(())
    }

    /// How many GPU indexes this machine offers with `self.mem`, and what they are, in words
    /// (`CUDA sees 1 device(s)`): CUDA's devices with GPU memory; with host memory the GPUs
    /// topo knows, else the logical NIC groups (`LOGICAL_GPUS`). An error where GPU memory is
    /// asked for and there is none.
    pub fn gpus_here(&self) -> Result<(usize, String)> {
        match self.mem {
            MemKind::Cuda => {
                if !buffers::cuda_driver() {
                    return Err(Error::Unavailable(if cfg!(feature = "cuda") {
                        "--mem cuda: no CUDA driver (libcuda.so) on this machine; use --mem host"
                            .into()
                    } else {
                        "--mem cuda: this rdma-bench was built without the `cuda` feature".into()
                    }));
                }
                let n = buffers::cuda_devices()?;
                Ok((n, format!("CUDA sees {n} device(s)")))
            }
            MemKind::Host => {
                let known = self.hints.as_ref().map_or(0, |h| h.gpus);
                Ok(if known > 0 {
                    (known, format!("this machine has {known} GPU(s)"))
                } else {
                    (
                        LOGICAL_GPUS,
                        "no GPU here, so with host memory GPU indexes name logical NIC groups"
                            .into(),
                    )
                })
            }
        }
    }

    /// How NIC `j` of the `g`-th GPU is opened.
    pub fn desc(&self, g: usize, j: usize) -> NicDesc {
        let i = g * self.nics_per_gpu + j;
        let (device, pci) = if !self.devices.is_empty() {
            (Some(self.devices[i % self.devices.len()].clone()), None)
        } else {
            // The GPU's NIC group from topo, round-robin, where the provider has real NICs:
            // the name (verbs opens it) and the PCI function (efa matches its domain by it).
            let nic = self
                .hints
                .as_ref()
                .filter(|_| self.real_nics)
                .and_then(|h| h.nic_groups.get(self.gpus[g]))
                .filter(|grp| !grp.is_empty())
                .map(|grp| grp[j % grp.len()].clone());
            match nic {
                Some(n) => (Some(n.name), n.pci),
                None => (None, None),
            }
        };
        NicDesc {
            device,
            pci,
            provider: self.provider.clone(),
            // A later option of the same key wins.
            options: self.options.iter().cloned().collect(),
            // Host memory only: the backend need not pay for GPU support (libfabric's shm
            // keeps its single-copy path only for endpoints without FI_HMEM).
            gpu_memory: Some(self.mem == MemKind::Cuda),
            ..NicDesc::default()
        }
    }

    fn describe(&self, d: &NicDesc) -> String {
        let mut s = String::new();
        if let Some(p) = &d.provider {
            s.push_str(&format!("provider {p}"));
        }
        if let Some(dev) = &d.device {
            if !s.is_empty() {
                s.push_str(", ");
            }
            s.push_str(&format!("device {dev}"));
        }
        if let Some(pci) = &d.pci {
            s.push_str(&format!(" at PCI {pci}"));
        }
        if s.is_empty() {
            s.push_str("the default NIC");
        }
        s
    }
}

/// One side's endpoints and regions.
///
/// Endpoints are declared (and so dropped) first: closing them ends whatever a run that was
/// cut short (a peer gone mid-transfer) left in flight, before the regions it used are
/// deregistered and freed. Both backends keep their domain alive for the regions.
pub struct Side<T: Transport> {
    /// Dropped first: in a loopback, waits for the other side before the endpoints close.
    /// Only its drop is used.
    _at_teardown: AtTeardown,
    pub eps: Vec<T>,
    pub data: Vec<T::Mr>,
    pub ctrl: Vec<T::Mr>,
    pub peers: Vec<PeerId>,
    /// The peer's NICs, in the same order.
    pub remote: Vec<NicWire>,
    /// The peer's regions on each NIC, `[data, control]`, as this side's endpoint imported
    /// them: the targets of its WRITEs.
    pub imported: Vec<[RemoteRegion<T::RemoteKey>; MRS_PER_NIC]>,
    pub gpus: Vec<usize>,
    pub npg: usize,
}

impl<T: Transport> Side<T> {
    /// Open one endpoint per NIC.
    pub fn open(cfg: &SideCfg) -> Result<Self> {
        let mut eps = Vec::with_capacity(cfg.gpus.len() * cfg.nics_per_gpu);
        for (g, &ordinal) in cfg.gpus.iter().enumerate() {
            for j in 0..cfg.nics_per_gpu {
                let d = cfg.desc(g, j);
                let i = eps.len();
                let ep = T::open(&d).ctx(|| {
                    format!(
                        "opening NIC {i} (GPU {ordinal}, {}) on the {} backend",
                        cfg.describe(&d),
                        T::BACKEND
                    )
                })?;
                if cfg.verbose > 0 {
                    let c = ep.caps();
                    let more = ep.details();
                    eprintln!(
                        "rdma-bench: NIC {i} (GPU {ordinal}): {}, max write {}, tx depth {}, rx depth {}, link {}{}{more}",
                        crate::units::provider_nic(ep.provider(), ep.nic_name()),
                        crate::units::human_bytes(c.max_write_size as u64),
                        c.tx_depth,
                        c.rx_depth,
                        c.link_gbps.map_or("unknown".into(), |g| format!("{g} Gbit/s")),
                        if more.is_empty() { "" } else { ", " },
                    );
                }
                eps.push(ep);
            }
        }
        Ok(Side {
            // The other side ends within its idle timeout once this one stopped (it is told
            // so, or its data path goes quiet).
            _at_teardown: AtTeardown::join(
                cfg.teardown.as_ref(),
                cfg.idle + Duration::from_secs(5),
            ),
            eps,
            data: Vec::new(),
            ctrl: Vec::new(),
            peers: Vec::new(),
            remote: Vec::new(),
            imported: Vec::new(),
            gpus: cfg.gpus.clone(),
            npg: cfg.nics_per_gpu,
        })
    }

    /// Caps of NIC `i`.
    pub fn caps(&self, i: usize) -> &Caps {
        self.eps[i].caps()
    }

    /// GPU ordinal of NIC `i`.
    pub fn gpu_of(&self, i: usize) -> usize {
        self.gpus[i / self.npg]
    }

    /// Register a `data_len`-byte data region (on the NIC's GPU for `--mem cuda`; host ones
    /// `page_offset` bytes into their first page) and a small host control region on every
    /// NIC.
    pub fn register(&mut self, mem: MemKind, data_len: usize, page_offset: u32) -> Result<()> {
        if mem == MemKind::Cuda {
            if let Some((i, ep)) = self
                .eps
                .iter()
                .enumerate()
                .find(|(_, e)| !e.caps().gpu_memory)
            {
                return Err(Error::Unavailable(format!(
                    "--mem cuda: NIC {i} ({} {}) cannot register GPU memory (libfabric without FI_HMEM, or no peer-memory support); use --mem host",
                    ep.provider(),
                    ep.nic_name()
                )));
            }
        }
        // GPU regions are never smaller than GPU_MIN_REGION (see there).
        let data_len = match mem {
            MemKind::Cuda => data_len.max(GPU_MIN_REGION),
            MemKind::Host => data_len,
        };
        for i in 0..self.eps.len() {
            let gpu = self.gpu_of(i);
            let m = buffers::alloc(mem, gpu, data_len, page_offset)?;
            let mr = self.eps[i].register(m).ctx(|| {
                format!("registering {data_len} bytes of {mem} memory on NIC {i} (GPU {gpu})")
            })?;
            self.data.push(mr);
            let c = self.eps[i]
                .register(Memory::Host(HostBuffer::new(CTRL_LEN)))
                .ctx(|| format!("registering the control region on NIC {i}"))?;
            self.ctrl.push(c);
        }
        Ok(())
    }

    /// How many bytes into its page the first NIC's data region starts (`--buf-offset`; 0
    /// before [`Side::register`]).
    pub fn data_page_offset(&self) -> usize {
        self.data
            .first()
            .map_or(0, |mr| buffers::page_offset(mr.memory()))
    }

    /// What the peer needs: one entry per NIC, with a fresh address for this peer.
    pub fn wire(&self) -> Vec<NicWire> {
        self.eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let c = ep.caps();
                NicWire {
                    gpu: (i / self.npg) as u32,
                    name: ep.nic_name().to_string(),
                    addr: ep.address().0,
                    mrs: vec![self.data[i].remote(), self.ctrl[i].remote()],
                    max_write_size: c.max_write_size as u64,
                    max_msg_size: c.max_msg_size as u64,
                    rx_depth: c.rx_depth as u64,
                    link_gbps: c.link_gbps,
                }
            })
            .collect()
    }

    /// Add the peer's NICs, pairwise, and import their regions.
    pub fn connect(&mut self, remote: Vec<NicWire>) -> Result<()> {
        if remote.len() != self.eps.len() {
            return Err(Error::Protocol(format!(
                "the peer has {} NICs, this side {}",
                remote.len(),
                self.eps.len()
            )));
        }
        self.peers.clear();
        self.imported.clear();
        for (i, (ep, r)) in self.eps.iter_mut().zip(&remote).enumerate() {
            let p = ep
                .add_peer(&EndpointAddr(r.addr.clone()))
                .ctx(|| format!("adding the peer's NIC {i} ({})", r.name))?;
            self.peers.push(p);
            let [data, ctrl] = &r.mrs[..] else {
                return Err(Error::Protocol(format!(
                    "the peer's NIC {i} announces {} regions, expected {MRS_PER_NIC}",
                    r.mrs.len()
                )));
            };
            let mut import = |mr, what: &str| {
                ep.import(p, mr)
                    .ctx(|| format!("importing the peer's {what} region on NIC {i} ({})", r.name))
            };
            let regions = [import(data, "data")?, import(ctrl, "control")?];
            self.imported.push(regions);
        }
        self.remote = remote;
        Ok(())
    }

    /// Poll every endpoint once, expecting nothing, after the peer's side has added this
    /// side's endpoints and before either side posts work.
    ///
    /// Each backend endpoint may announce itself to a new peer from `add_peer` (libfabric
    /// 2.x's `shm` sends a connection request; see `transport_efa::Endpoint`'s crate docs).
    /// Polling once processes the peer's announcement before any operation of the peer
    /// depends on it: 2.x `shm` lets a side that processed the other's request post at
    /// once, with addresses its peer only records when it processes that side's own
    /// request, so between endpoints of one process (`loopback`) a large first SEND or a
    /// delivery-complete WRITE could reach a peer that had not, and crash it. Elsewhere it
    /// is one empty poll.
    pub fn settle(&mut self) -> Result<()> {
        let mut buf: [Completion; 4] = Default::default();
        for (i, ep) in self.eps.iter_mut().enumerate() {
            let n = ep
                .poll(&mut buf)
                .ctx(|| format!("polling NIC {i} before the first run"))?;
            if let Some(c) = buf[..n].first() {
                return Err(Error::Protocol(format!(
                    "NIC {i}: a completion before any work was posted: {c:?}"
                )));
            }
        }
        Ok(())
    }

    /// What the backend runs on, over all NICs (`None` without NICs):
    /// [`crate::record::endpoints_runtime`].
    pub fn runtime(&self) -> Option<transport_core::Runtime> {
        crate::record::endpoints_runtime(self.eps.iter().map(Transport::runtime), MAX_NAME)
    }

    /// The provider actually opened (first NIC).
    pub fn provider(&self) -> String {
        self.eps
            .first()
            .map(|e| e.provider().to_string())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    /// `--mem host` opens every NIC for host memory only, so libfabric asks for no FI_HMEM
    /// and shm keeps its single-copy path; `--mem cuda` says GPU memory will come.
    #[test]
    fn nic_descs_say_which_memory_comes() {
        use super::{MemKind, SideCfg};
        let mut cfg = SideCfg::default();
        assert_eq!(cfg.desc(0, 0).gpu_memory, Some(false));
        cfg.mem = MemKind::Cuda;
        assert_eq!(cfg.desc(0, 0).gpu_memory, Some(true));
    }
}
