//! Memory regions: host memory with `ibv_reg_mr`, GPU memory through a CUDA dmabuf
//! (`ibv_reg_dmabuf_mr`) or, failing that, `ibv_reg_mr` on the device pointer (peer memory).

use std::sync::Arc;

use ibverbs_sys as sys;
use transport_core::{Error, KeyBytes, Memory, MemoryMut, MemoryRegion, NicDesc, RemoteMr, Result};

use crate::device::Domain;
use crate::util::{errno, provider_err, MEMLOCK_HINT};

/// Access granted to every region: local writes (receives) and remote WRITE/READ.
pub(crate) const BASE_ACCESS: u32 =
    sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;

/// `IBV_ACCESS_RELAXED_ORDERING`: the first bit of rdma-core's optional range
/// (`IBV_ACCESS_OPTIONAL_RANGE`), which a kernel or driver without the feature drops instead of
/// refusing the registration.
pub const ACCESS_RELAXED_ORDERING: u32 = sys::IBV_ACCESS_RELAXED_ORDERING;

/// The access flags every region of an endpoint opened with `nic` is registered with:
/// [`BASE_ACCESS`], plus relaxed ordering unless `relaxed_ordering=off`.
pub(crate) fn region_access(nic: &NicDesc) -> Result<u32> {
    match nic.options.get("relaxed_ordering").map(String::as_str) {
        None | Some("on") => Ok(BASE_ACCESS | ACCESS_RELAXED_ORDERING),
        Some("off") => Ok(BASE_ACCESS),
        Some(v) => Err(Error::InvalidArgument(format!(
            "verbs option relaxed_ordering={v}: expected on (the default) or off"
        ))),
    }
}

/// A registered region of one endpoint's protection domain.
///
/// Holds an `Arc` to the domain, so the PD outlives the registration even when the endpoint
/// is dropped first. Dropping the region deregisters it, then frees the memory.
pub struct VerbsMr {
    // Declared before `mem` on purpose; `Drop` deregisters before any field is dropped.
    pub(crate) domain: Arc<Domain>,
    mr: *mut sys::ibv_mr,
    pub(crate) lkey: u32,
    rkey: u32,
    /// Address the NIC uses for offset 0 (virtual address, or the dmabuf IOVA).
    pub(crate) iova: u64,
    /// Host address for offset 0, where the CPU can read the bytes (inline sends); 0 for GPU.
    pub(crate) host_addr: u64,
    /// The region's length in bytes, for the posts' range checks.
    pub(crate) len: usize,
    /// The dmabuf fd behind the registration, closed after deregistration; -1 for none.
    dmabuf_fd: i32,
    /// The access flags asked for (`ibv_access_flags`).
    access: u32,
    mem: Option<Memory>,
}

// SAFETY: the `ibv_mr` is only read (keys) or freed once, in `Drop`/`deregister`; libibverbs
// allows deregistration from any thread. `Memory` is `Send`.
unsafe impl Send for VerbsMr {}

impl std::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsMr")
            .field("device", &self.domain.name)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("dmabuf", &(self.dmabuf_fd >= 0))
            .field("access", &format_args!("{:#x}", self.access))
            .field("relaxed_ordering", &self.relaxed_ordering())
            .finish()
    }
}

impl VerbsMr {
    /// Register `mem` in `domain`'s protection domain with `access` (see [`region_access`]).
    pub(crate) fn register(domain: &Arc<Domain>, mut mem: Memory, access: u32) -> Result<Self> {
        if mem.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let len = mem.len();
        let (mr, iova, host_addr, dmabuf_fd) = match &mut mem {
            Memory::Host(h) => {
                let ptr = h.as_mut_ptr();
                // SAFETY: `ptr..ptr+len` is a live allocation owned by `mem`, which the region
                // keeps (and never moves the heap bytes of) until after deregistration. The
                // access bits are ibv_access_flags values, which fit an int.
                let mr = unsafe { sys::ibvs_reg_mr(domain.pd, ptr.cast(), h.len(), access as i32) };
                if mr.is_null() {
                    return Err(provider_err(
                        "ibv_reg_mr",
                        errno(),
                        format!(
                            "registering {} bytes of host memory: {MEMLOCK_HINT}",
                            h.len()
                        ),
                    ));
                }
                (mr, ptr as u64, ptr as u64, -1)
            }
            Memory::Gpu(g) => {
                let (mr, fd) = crate::gpu::register(domain, g, access)?;
                (mr, g.device_ptr(), 0, fd)
            }
        };
        // SAFETY: `mr` is a valid registration returned just above.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Self {
            domain: domain.clone(),
            mr,
            lkey,
            rkey,
            iova,
            host_addr,
            len,
            dmabuf_fd,
            access,
            mem: Some(mem),
        })
    }

    fn dereg(&mut self) -> Result<()> {
        if self.mr.is_null() {
            return Ok(());
        }
        // SAFETY: `mr` is a live registration, deregistered exactly once (nulled below).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            return Err(provider_err(
                "ibv_dereg_mr",
                rc,
                "the region may still be bound to a memory window; the memory is leaked to stay safe",
            ));
        }
        self.mr = std::ptr::null_mut();
        if self.dmabuf_fd >= 0 {
            // SAFETY: the fd came from cuMemGetHandleForAddressRange, is owned by this region
            // and closed once.
            unsafe { libc::close(self.dmabuf_fd) };
            self.dmabuf_fd = -1;
        }
        Ok(())
    }

    /// Deregister and hand back the memory.
    pub(crate) fn into_memory(mut self) -> Result<Memory> {
        self.dereg()?;
        Ok(self
            .mem
            .take()
            .expect("a region owns its memory until deregistered"))
    }

    /// The local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// The remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The access flags the region was registered with (`ibv_access_flags` bits; see
    /// [`ACCESS_RELAXED_ORDERING`]). Optional bits are asked for: a kernel or device without
    /// the feature drops them, and verbs does not say whether it did.
    pub fn access(&self) -> u32 {
        self.access
    }
    /// Whether the region was registered with relaxed ordering (NIC option
    /// `relaxed_ordering`, on by default).
    pub fn relaxed_ordering(&self) -> bool {
        self.access & ACCESS_RELAXED_ORDERING != 0
    }

    /// The address the NIC uses for offset 0 (an SGE's `addr`; see
    /// [`raw`](crate::raw)).
    #[doc(hidden)]
    #[inline]
    pub fn raw_addr(&self) -> u64 {
        self.iova
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        if let Err(e) = self.dereg() {
            eprintln!("transport-verbs: {e}");
            // The NIC may still DMA into the memory: leak it rather than free it.
            std::mem::forget(self.mem.take());
        }
    }
}

impl MemoryRegion for VerbsMr {
    #[inline]
    fn memory(&self) -> &Memory {
        self.mem
            .as_ref()
            .expect("a region owns its memory until deregistered")
    }
    #[inline]
    fn memory_mut(&mut self) -> MemoryMut<'_> {
        MemoryMut::new(
            self.mem
                .as_mut()
                .expect("a region owns its memory until deregistered"),
        )
    }
    #[inline]
    fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.iova,
            len: self.len() as u64,
            key: KeyBytes::from_u32(self.rkey),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relaxed ordering is asked for by default, `relaxed_ordering=off` drops only it, and any
    /// other value is refused. Before the fix every region was registered with plain
    /// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ. On a ConnectX-7 without the bit, GPU memory
    /// written by the NIC is ordered PCIe traffic and WRITE bandwidth into GPU memory stays far
    /// below 400 Gbit/s (pplx-garden measured under 200); with it the NIC may reorder the writes,
    /// and a completion still means every byte is visible. Soft-RoCE ignores the bit.
    #[test]
    fn relaxed_ordering_is_asked_for_by_default() {
        let on = region_access(&NicDesc::default()).unwrap();
        assert_eq!(on, BASE_ACCESS | sys::IBV_ACCESS_RELAXED_ORDERING);
        // It is the optional range's bit, which rdma-core lets a kernel without it drop.
        assert_ne!(on & sys::IB_UVERBS_ACCESS_OPTIONAL_RANGE, 0);
        assert_eq!(
            region_access(&NicDesc::default().with_option("relaxed_ordering", "on")).unwrap(),
            on
        );
        let off =
            region_access(&NicDesc::default().with_option("relaxed_ordering", "off")).unwrap();
        assert_eq!(off, BASE_ACCESS);
        assert_eq!(off & sys::IB_UVERBS_ACCESS_OPTIONAL_RANGE, 0);
        for bad in ["", "yes", "1", "ON", "maybe"] {
            match region_access(&NicDesc::default().with_option("relaxed_ordering", bad)) {
                Err(Error::InvalidArgument(m)) => {
                    assert!(m.contains("relaxed_ordering") && m.contains("off"), "{m}")
                }
                other => panic!("relaxed_ordering={bad:?} gave {other:?}"),
            }
        }
    }
}
