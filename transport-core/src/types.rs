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
    /// A backend that can tell its NICs by PCI function opens the one at this function,
    /// whatever its name (libfabric: the domain whose `fi_info->nic->bus_attr` it is); one
    /// that cannot uses [`NicDesc::device`].
    #[serde(default)]
    pub pci: Option<String>,
    /// The provider to run over, for backends whose library has several
    /// ([`crate::BackendInfo::provider`]; libfabric: `efa`, `shm`, `tcp`, and `None` is `efa`
    /// where present). Ignored by backends without providers.
    pub provider: Option<String>,
    /// Send queue depth wanted (default: the backend's choice, capped by the NIC).
    pub tx_depth: Option<usize>,
    /// Receive queue depth wanted.
    pub rx_depth: Option<usize>,
    /// Backend-specific options, `key=value` (for example `mr_mode=strict` on libfabric, `gid=3`
    /// on verbs): each backend lists the keys it takes ([`crate::BackendInfo::options`]) and
    /// refuses others.
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
    /// Option `key` of `library` (the backend's name in the error) as a number in `range`:
    /// `None` when unset, [`Error::InvalidArgument`] naming the option and the range when it
    /// is not such a number.
    pub fn number_option<T>(
        &self,
        library: &str,
        key: &str,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<Option<T>>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display,
    {
        let Some(v) = self.options.get(key) else {
            return Ok(None);
        };
        match v.parse::<T>() {
            Ok(x) if range.contains(&x) => Ok(Some(x)),
            _ => Err(Error::InvalidArgument(format!(
                "{library} option {key}={v}: expected a number in {}..={}",
                range.start(),
                range.end()
            ))),
        }
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

/// A registered region's remote key as bytes: what a peer needs, beside the address, to WRITE
/// into the region.
///
/// Opaque outside the backend that made it: libfabric (efa) keys are 8 bytes and verbs rkeys 4,
/// both little-endian integers; a UCX rkey is the blob `ucp_rkey_pack` makes. A peer reads it
/// once, with [`Transport::import`](crate::Transport::import), into what its posts carry.
///
/// Always 1 to [`KeyBytes::MAX_LEN`] bytes, however it is made: [`KeyBytes::new`] and
/// deserializing (a hex string) refuse anything else, so a key that arrives from a peer is
/// bounded before any backend reads it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyBytes(Box<[u8]>);

impl KeyBytes {
    /// The longest key accepted: 1 KiB.
    ///
    /// A UCX rkey packs a map of the memory domains that can reach the region and one entry per
    /// domain: 8 to 16 bytes for an InfiniBand or RoCE device (a domain per NIC), about 100 for
    /// `cuda_ipc` (a 64-byte `CUipcMemHandle` and its addresses), a few to tens for shared
    /// memory. Debian 12's UCX 1.13 packs 10 to 12 bytes on a host with shared memory and tcp
    /// only; a host with 8 NICs and CUDA packs a few hundred. 1 KiB holds that with room to
    /// spare, and keeps a session's hello (two regions per NIC, each key twice its length in
    /// hex) inside the control protocol's 1 MiB frame for 256 NICs even at the limit.
    pub const MAX_LEN: usize = 1024;

    /// A key of `bytes`; an error unless it holds 1 to [`KeyBytes::MAX_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let b = bytes.into();
        if b.is_empty() || b.len() > Self::MAX_LEN {
            return Err(Error::InvalidArgument(format!(
                "a remote key of {} bytes (allowed: 1..={})",
                b.len(),
                Self::MAX_LEN
            )));
        }
        Ok(Self(b.into_boxed_slice()))
    }

    /// An integer key as 8 little-endian bytes (libfabric's `fi_mr_key`).
    pub fn from_u64(key: u64) -> Self {
        Self(Box::new(key.to_le_bytes()))
    }

    /// An integer key as 4 little-endian bytes (a verbs rkey).
    pub fn from_u32(key: u32) -> Self {
        Self(Box::new(key.to_le_bytes()))
    }

    /// The key made by [`KeyBytes::from_u64`]; an error naming `backend` for a key of another
    /// length (a key of another backend).
    pub fn to_u64(&self, backend: &str) -> Result<u64> {
        self.fixed(backend).map(u64::from_le_bytes)
    }

    /// The key made by [`KeyBytes::from_u32`]; an error naming `backend` for a key of another
    /// length (a key of another backend).
    pub fn to_u32(&self, backend: &str) -> Result<u32> {
        self.fixed(backend).map(u32::from_le_bytes)
    }

    fn fixed<const N: usize>(&self, backend: &str) -> Result<[u8; N]> {
        <[u8; N]>::try_from(&*self.0).map_err(|_| {
            Error::InvalidArgument(format!(
                "a {}-byte remote key is not a {backend} key ({N} bytes): was the region \
                 registered by another backend?",
                self.0.len()
            ))
        })
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes (1 to [`KeyBytes::MAX_LEN`]).
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyBytes(")?;
        for b in self.0.iter() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// Serialized as a hex string (two characters a byte): compact in JSON, readable in logs.
impl Serialize for KeyBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(self.0.len() * 2);
        for b in self.0.iter() {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for KeyBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = KeyBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "a remote key as a hex string of 1 to {} bytes (a peer that sends a \
                     number is an older build: run the same version on both sides)",
                    KeyBytes::MAX_LEN
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<KeyBytes, E> {
                let s = v.as_bytes();
                if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 2 * KeyBytes::MAX_LEN {
                    return Err(E::custom(format_args!(
                        "a remote key of {} hex digits (allowed: an even number, 2..={})",
                        s.len(),
                        2 * KeyBytes::MAX_LEN
                    )));
                }
                let digit = |c: u8| match c {
                    b'0'..=b'9' => Ok(c - b'0'),
                    b'a'..=b'f' => Ok(c - b'a' + 10),
                    b'A'..=b'F' => Ok(c - b'A' + 10),
                    _ => Err(E::custom("a remote key with a character that is not hex")),
                };
                let bytes = s
                    .chunks_exact(2)
                    .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
                    .collect::<std::result::Result<Vec<u8>, E>>()?;
                Ok(KeyBytes(bytes.into_boxed_slice()))
            }
        }
        d.deserialize_str(Hex)
    }
}

/// What a peer needs to WRITE into a registered region; serializable, send it over any channel.
/// The peer turns it into a [`RemoteRegion`] with [`Transport::import`](crate::Transport::import).
///
/// `addr` is the address to use for offset 0: the virtual address where the provider
/// addresses remote memory by virtual address (`FI_MR_VIRT_ADDR`, verbs), else 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteMr {
    pub addr: u64,
    pub len: u64,
    pub key: KeyBytes,
}

/// A peer's region as one endpoint posts to it: its [`RemoteMr`] after
/// [`Transport::import`](crate::Transport::import), with the key in the backend's own form `K`
/// ([`Transport::RemoteKey`](crate::Transport::RemoteKey)). Only meaningful on the endpoint
/// that imported it, towards the peer it was imported for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion<K> {
    pub addr: u64,
    pub len: u64,
    pub key: K,
}

impl<K: Copy> RemoteRegion<K> {
    /// For backends' `import`: `mr`'s range with the key the backend read from `mr.key`; an
    /// error where the range wraps the address space.
    pub fn new(mr: &RemoteMr, key: K) -> Result<Self> {
        if mr.addr.checked_add(mr.len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "remote region {:#x}+{} wraps the address space",
                mr.addr, mr.len
            )));
        }
        Ok(Self {
            addr: mr.addr,
            len: mr.len,
            key,
        })
    }

    /// The sub-range `[offset, offset + len)`; an error where it does not fit.
    #[inline]
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteSlice<K>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteSlice {
                addr: self.addr.wrapping_add(offset),
                len,
                key: self.key,
            }),
            _ => Err(remote_out_of_range(offset, len, self.len)),
        }
    }

    /// The whole region.
    #[inline]
    pub fn all(&self) -> RemoteSlice<K> {
        RemoteSlice {
            addr: self.addr,
            len: self.len,
            key: self.key,
        }
    }
}

#[cold]
#[inline(never)]
fn remote_out_of_range(offset: u64, len: u64, region: u64) -> Error {
    Error::InvalidArgument(format!(
        "remote range {offset}+{len} does not fit the {region}-byte remote region"
    ))
}

/// A range of a peer's imported region: the target of a WRITE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteSlice<K> {
    pub addr: u64,
    pub len: u64,
    pub key: K,
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

/// One WRITE in a batch for [`crate::Transport::post_writes`]; `K` is the backend's
/// [`Transport::RemoteKey`](crate::Transport::RemoteKey).
pub struct WriteOp<'a, M, K> {
    pub peer: PeerId,
    pub local: LocalSlice<'a, M>,
    pub remote: RemoteSlice<K>,
    pub imm: Option<u32>,
    pub ctx: u64,
}

impl<M, K: Copy> Clone for WriteOp<'_, M, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M, K: Copy> Copy for WriteOp<'_, M, K> {}

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

    /// A number option: unset is `None`, a number in the range is taken, anything else is
    /// refused naming the option, its value and the range.
    #[test]
    fn number_options_are_checked_against_their_range() {
        let nic = NicDesc::default()
            .with_option("depth", "8")
            .with_option("zero", "0")
            .with_option("big", "65")
            .with_option("word", "x");
        assert_eq!(nic.number_option("lib", "unset", 1..=64u32).unwrap(), None);
        assert_eq!(
            nic.number_option("lib", "depth", 1..=64u32).unwrap(),
            Some(8)
        );
        for key in ["zero", "big", "word"] {
            match nic.number_option("lib", key, 1..=64u32) {
                Err(Error::InvalidArgument(m)) => {
                    assert!(
                        m.contains(&format!("lib option {key}=")) && m.contains("1..=64"),
                        "{m}"
                    )
                }
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn remote_slice_is_bounds_checked() {
        let mr = RemoteMr {
            addr: 0x1000,
            len: 100,
            key: KeyBytes::from_u32(7),
        };
        let r = RemoteRegion::new(&mr, 7u32).unwrap();
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
        let wraps = RemoteMr {
            addr: u64::MAX - 10,
            ..mr
        };
        let e = RemoteRegion::new(&wraps, 7u32).unwrap_err().to_string();
        assert!(e.contains("wraps"), "{e}");
    }

    #[test]
    fn remote_mr_and_address_round_trip_through_serde() {
        let r = RemoteMr {
            addr: u64::MAX - 1,
            len: 1 << 40,
            key: KeyBytes::from_u64(0xdead_beef_f00d),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""key":"0df0efbeadde0000""#), "{json}");
        assert_eq!(serde_json::from_str::<RemoteMr>(&json).unwrap(), r);
        let a = EndpointAddr(vec![0, 1, 254, 255]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<EndpointAddr>(&json).unwrap(), a);
        assert_eq!(format!("{a:?}"), "EndpointAddr(0001feff)");
    }

    #[test]
    fn key_bytes_are_bounded_however_they_are_made() {
        let max = KeyBytes::new(vec![0xab; KeyBytes::MAX_LEN]).unwrap();
        assert_eq!(max.len(), KeyBytes::MAX_LEN);
        let json = serde_json::to_string(&max).unwrap();
        assert_eq!(serde_json::from_str::<KeyBytes>(&json).unwrap(), max);
        assert!(KeyBytes::new(vec![0; KeyBytes::MAX_LEN + 1]).is_err());
        assert!(KeyBytes::new(Vec::new()).is_err());
        let de = |s: &str| serde_json::from_str::<KeyBytes>(s).map_err(|e| e.to_string());
        let long = format!("\"{}\"", "ab".repeat(KeyBytes::MAX_LEN + 1));
        for bad in [r#""""#, r#""abc""#, r#""zz""#, r#""0x12""#, long.as_str()] {
            assert!(de(bad).is_err(), "{bad} was accepted");
        }
        let e = de("7").unwrap_err();
        assert!(e.contains("hex string") && e.contains("older build"), "{e}");
        assert_eq!(de(r#""00FF""#).unwrap().as_bytes(), &[0, 255]);
        assert_eq!(
            format!("{:?}", KeyBytes::from_u32(0x0102_0304)),
            "KeyBytes(04030201)"
        );
    }

    #[test]
    fn fixed_size_keys_round_trip_and_name_a_foreign_key() {
        let k = KeyBytes::from_u64(0x1122_3344_5566_7788);
        assert_eq!(k.to_u64("efa").unwrap(), 0x1122_3344_5566_7788);
        let e = k.to_u32("verbs").unwrap_err().to_string();
        assert!(
            e.contains("8-byte") && e.contains("verbs key (4 bytes)"),
            "{e}"
        );
        assert_eq!(KeyBytes::from_u32(9).to_u32("verbs").unwrap(), 9);
        assert!(KeyBytes::from_u32(9).to_u64("efa").is_err());
        assert!(KeyBytes::new(vec![1; 300]).unwrap().to_u64("efa").is_err());
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
