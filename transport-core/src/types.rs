use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{CompletionError, Error, Result};
use crate::MemoryRegion;

/// Which NIC to open, and how. Fields a backend has no use for are ignored by it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicDesc {
    /// NIC name: the ibverbs device (`rdmap79s0`, `mlx5_0`, `rxe0`) or a libfabric domain
    /// (`rdmap79s0-rdm`, `lo`). `None`: the first one the provider offers. libfabric's efa
    /// domains carry a suffix (`rdmap79s0-rdm`); the efa backend matches the bare device name
    /// to them, but [`NicDesc::pci`] is what it matches first.
    pub device: Option<String>,
    /// PCI function of the NIC, `dddd:bb:dd.f` (as `topo` reports it, e.g. `0000:4f:00.0`).
    /// Where set, the libfabric backend opens the domain whose `fi_info->nic->bus_attr` is this
    /// function, whatever its name; the verbs backend ignores it.
    #[serde(default)]
    pub pci: Option<String>,
    /// libfabric provider (`efa`, `shm`, `tcp`). `None`: `efa` where present. Ignored by verbs.
    pub provider: Option<String>,
    /// Verbs port number (default 1).
    pub port: Option<u8>,
    /// Verbs GID index (default: chosen per peer, the GID on the subnet that reaches it).
    pub gid_index: Option<u8>,
    /// Send queue depth wanted (default: the backend's choice, capped by the NIC).
    pub tx_depth: Option<usize>,
    /// Receive queue depth wanted.
    pub rx_depth: Option<usize>,
    /// Backend-specific options, `key=value` (for example `mr_mode=strict` on libfabric).
    pub options: BTreeMap<String, String>,
    /// Whether GPU memory will be registered on this endpoint: `Some(true)` yes,
    /// `Some(false)` never (host memory only), `None` the backend's choice.
    ///
    /// Backends that pay for GPU support when they open use it: libfabric asks for `FI_HMEM`
    /// only where GPU memory may come (`None`: where a CUDA device is present), because its
    /// `shm` provider turns its single-copy path (CMA, `process_vm_readv`) off for every
    /// endpoint that asked for `FI_HMEM`, so host memory then moves twice through bounce
    /// buffers. With `Some(false)`, registering GPU memory is refused, saying why.
    #[serde(default)]
    pub gpu_memory: Option<bool>,
}

impl NicDesc {
    /// A description naming only a device.
    pub fn device(name: impl Into<String>) -> Self {
        Self {
            device: Some(name.into()),
            ..Self::default()
        }
    }
    /// A description naming only a libfabric provider.
    pub fn provider(name: impl Into<String>) -> Self {
        Self {
            provider: Some(name.into()),
            ..Self::default()
        }
    }
    /// Builder: say whether GPU memory will be registered ([`NicDesc::gpu_memory`]).
    pub fn with_gpu_memory(mut self, gpu: bool) -> Self {
        self.gpu_memory = Some(gpu);
        self
    }
    /// Builder: set a backend-specific option.
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }
}

/// An endpoint's address as opaque bytes; only its own backend can read it.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EndpointAddr(pub Vec<u8>);

impl fmt::Debug for EndpointAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointAddr(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A peer added with [`crate::Transport::add_peer`]; only meaningful on that endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId(pub u32);

/// What a peer needs to WRITE into a registered region.
///
/// `addr` is the address to use for offset 0: the virtual address where the provider
/// addresses remote memory by virtual address (`FI_MR_VIRT_ADDR`, verbs), else 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteMr {
    pub addr: u64,
    pub len: u64,
    pub key: u64,
}

impl RemoteMr {
    /// The sub-range `[offset, offset + len)`; an error where it does not fit.
    #[inline]
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteSlice> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteSlice {
                addr: self.addr + offset,
                len,
                key: self.key,
            }),
            _ => Err(self.out_of_range(offset, len)),
        }
    }
    #[cold]
    #[inline(never)]
    fn out_of_range(&self, offset: u64, len: u64) -> Error {
        Error::InvalidArgument(format!(
            "remote range {offset}+{len} does not fit the {}-byte remote region",
            self.len
        ))
    }
    /// The whole region.
    #[inline]
    pub fn all(&self) -> RemoteSlice {
        RemoteSlice {
            addr: self.addr,
            len: self.len,
            key: self.key,
        }
    }
}

/// A range of a peer's registered region: the target of a WRITE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteSlice {
    pub addr: u64,
    pub len: u64,
    pub key: u64,
}

/// A bounds-checked range of a local registered region: the source or sink of an operation.
pub struct LocalSlice<'a, M> {
    pub mr: &'a M,
    pub offset: usize,
    pub len: usize,
}

impl<M> Clone for LocalSlice<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for LocalSlice<'_, M> {}

impl<M> fmt::Debug for LocalSlice<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSlice")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, M: MemoryRegion> LocalSlice<'a, M> {
    /// `[offset, offset + len)` of `mr`; an error where it does not fit.
    #[inline]
    pub fn new(mr: &'a M, offset: usize, len: usize) -> Result<Self> {
        match offset.checked_add(len) {
            Some(end) if end <= mr.len() => Ok(Self { mr, offset, len }),
            _ => Err(local_out_of_range(offset, len, mr.len())),
        }
    }
    /// The whole region.
    #[inline]
    pub fn all(mr: &'a M) -> Self {
        Self {
            mr,
            offset: 0,
            len: mr.len(),
        }
    }
}

#[cold]
#[inline(never)]
fn local_out_of_range(offset: usize, len: usize, region: usize) -> Error {
    Error::InvalidArgument(format!(
        "local range {offset}+{len} does not fit the {region}-byte region"
    ))
}

/// One WRITE in a batch for [`crate::Transport::post_writes`].
pub struct WriteOp<'a, M> {
    pub peer: PeerId,
    pub local: LocalSlice<'a, M>,
    pub remote: RemoteSlice,
    pub imm: Option<u32>,
    pub ctx: u64,
}

impl<M> Clone for WriteOp<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for WriteOp<'_, M> {}

/// Outcome of a post that did not fail.
#[must_use = "a full queue means the operation was not posted"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Post {
    /// Queued on the NIC.
    Posted,
    /// The queue is full (EAGAIN, ENOMEM): nothing was posted. Poll, then post again.
    QueueFull,
}

/// One completion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    /// The context given when the operation was posted (0 for [`CompletionKind::RemoteWrite`]).
    pub ctx: u64,
    pub kind: CompletionKind,
}

/// What completed.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum CompletionKind {
    /// A SEND finished; its buffer may be reused.
    #[default]
    Send,
    /// A receive buffer was filled with `len` bytes.
    Recv { len: usize, imm: Option<u32> },
    /// A WRITE finished; its local buffer may be reused.
    Write,
    /// A peer's WRITE with immediate landed here; its bytes are visible.
    RemoteWrite { imm: u32 },
    /// The operation failed.
    Error(Box<CompletionError>),
}

impl Completion {
    /// `Err` for an error completion, so `?` can stop a workload on the first failure.
    pub fn check(&self) -> Result<&Self> {
        match &self.kind {
            CompletionKind::Error(e) => Err(Error::Completion(e.clone())),
            _ => Ok(self),
        }
    }
}

/// What an endpoint can do, as its NIC and provider report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    /// Largest SEND.
    pub max_msg_size: usize,
    /// Largest single WRITE.
    pub max_write_size: usize,
    /// Send queue depth: operations in flight before [`Post::QueueFull`].
    pub tx_depth: usize,
    /// Receive queue depth.
    pub rx_depth: usize,
    /// Largest payload sent inline.
    pub inject_size: usize,
    /// Bytes of immediate data carried (at least 4).
    pub cq_data_size: usize,
    /// Whether GPU memory can be registered.
    pub gpu_memory: bool,
    /// Link speed in Gbit/s, where the NIC reports it.
    pub link_gbps: Option<f64>,
    /// Whether a WRITE the target refuses (a wrong remote key, a range past the region)
    /// comes back to the initiator as an error completion.
    ///
    /// Where `false` the target still refuses it, so its memory is never written, but the
    /// initiator is not told: libfabric's `shm` answers nothing (1.17, 2.1) or reports
    /// success (2.6), and a provider asked for transmit completions only reports the local
    /// send.
    /// Code that must learn of a bad key there needs its own acknowledgement.
    pub remote_write_errors: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_slice_is_bounds_checked() {
        let r = RemoteMr {
            addr: 0x1000,
            len: 100,
            key: 7,
        };
        assert_eq!(
            r.slice(10, 90).unwrap(),
            RemoteSlice {
                addr: 0x100a,
                len: 90,
                key: 7
            }
        );
        assert!(r.slice(10, 91).is_err());
        assert!(r.slice(u64::MAX, 2).is_err(), "overflow must not wrap");
        assert_eq!(r.all().len, 100);
    }

    #[test]
    fn remote_mr_and_address_round_trip_through_serde() {
        let r = RemoteMr {
            addr: u64::MAX - 1,
            len: 1 << 40,
            key: 0xdead_beef_f00d,
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RemoteMr>(&json).unwrap(), r);
        let a = EndpointAddr(vec![0, 1, 254, 255]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<EndpointAddr>(&json).unwrap(), a);
        assert_eq!(format!("{a:?}"), "EndpointAddr(0001feff)");
    }

    #[test]
    fn nic_desc_builders() {
        let n = NicDesc::provider("tcp").with_option("mr_mode", "strict");
        assert_eq!(n.provider.as_deref(), Some("tcp"));
        assert_eq!(n.options.get("mr_mode").map(String::as_str), Some("strict"));
        assert_eq!(NicDesc::device("rxe0").device.as_deref(), Some("rxe0"));
        assert_eq!(NicDesc::default().gpu_memory, None);
        assert_eq!(
            NicDesc::provider("shm").with_gpu_memory(false).gpu_memory,
            Some(false)
        );
    }

    /// A description serialized before `gpu_memory` existed still reads (as `None`).
    #[test]
    fn nic_desc_without_gpu_memory_deserializes() {
        let json = r#"{"device":null,"provider":"shm","port":null,"gid_index":null,
            "tx_depth":null,"rx_depth":null,"options":{}}"#;
        let d: NicDesc = serde_json::from_str(json).unwrap();
        assert_eq!(d.gpu_memory, None);
        assert_eq!(d.provider.as_deref(), Some("shm"));
    }
}
