//! Memory registration: the [`MrMode`] a provider grants, what registering does under it
//! (`MrPolicy`), and [`Mr`], a registered region that owns its memory and deregisters on
//! drop.

use std::ffi::c_void;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use libfabric_sys as fi;
use transport_core::{Error, KeyBytes, Memory, MemoryMut, MemoryRegion, RemoteMr, Result};

use crate::domain::Domain;
use crate::error::{provider, runtime_version};
use crate::gpu;
use crate::grave::Grave;

/// Access every region is registered with.
const ACCESS: u64 = fi::FI_SEND | fi::FI_RECV | fi::FI_WRITE | fi::FI_REMOTE_WRITE;

/// Memory registration mode bits (`FI_MR_*`) as a provider returned them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MrMode(
    /// The `FI_MR_*` bits.
    pub u64,
);

impl MrMode {
    /// `FI_MR_LOCAL`: local buffers need descriptors.
    pub const LOCAL: MrMode = MrMode(fi::FI_MR_LOCAL);
    /// `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, not offsets.
    pub const VIRT_ADDR: MrMode = MrMode(fi::FI_MR_VIRT_ADDR);
    /// `FI_MR_ALLOCATED`: only allocated (backed) memory may be registered.
    pub const ALLOCATED: MrMode = MrMode(fi::FI_MR_ALLOCATED);
    /// `FI_MR_PROV_KEY`: the provider chooses keys.
    pub const PROV_KEY: MrMode = MrMode(fi::FI_MR_PROV_KEY);
    /// `FI_MR_ENDPOINT`: regions are bound to an endpoint and enabled.
    pub const ENDPOINT: MrMode = MrMode(fi::FI_MR_ENDPOINT);
    /// `FI_MR_HMEM`: device memory must be registered (always true here).
    pub const HMEM: MrMode = MrMode(fi::FI_MR_HMEM);
    /// EFA's set: `LOCAL | VIRT_ADDR | ALLOCATED | PROV_KEY` (what `mr_mode=strict` asks).
    pub const STRICT: MrMode =
        MrMode(fi::FI_MR_LOCAL | fi::FI_MR_VIRT_ADDR | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY);
    /// Every bit this backend honours (what it offers `fi_getinfo` by default).
    pub const SUPPORTED: MrMode = MrMode(Self::STRICT.0 | fi::FI_MR_ENDPOINT);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: MrMode) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Debug for MrMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MrMode({self})")
    }
}

impl fmt::Display for MrMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(u64, &str); 10] = [
            (fi::FI_MR_LOCAL, "FI_MR_LOCAL"),
            (fi::FI_MR_RAW, "FI_MR_RAW"),
            (fi::FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"),
            (fi::FI_MR_ALLOCATED, "FI_MR_ALLOCATED"),
            (fi::FI_MR_PROV_KEY, "FI_MR_PROV_KEY"),
            (fi::FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"),
            (fi::FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"),
            (fi::FI_MR_ENDPOINT, "FI_MR_ENDPOINT"),
            (fi::FI_MR_HMEM, "FI_MR_HMEM"),
            (fi::FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"),
        ];
        let mut rest = self.0;
        let mut first = true;
        for (bit, name) in NAMES {
            if rest & bit == bit && bit != 0 {
                write!(f, "{}{name}", if first { "" } else { " | " })?;
                rest &= !bit;
                first = false;
            }
        }
        if rest != 0 {
            write!(f, "{}{rest:#x}", if first { "" } else { " | " })?;
        } else if first {
            write!(f, "0")?;
        }
        Ok(())
    }
}

/// What registration does under a memory registration mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MrPolicy {
    /// Key to ask for: 0 where the provider picks keys (`FI_MR_PROV_KEY`), else one of ours,
    /// unique in the domain.
    requested_key: u64,
    /// Address a peer uses for byte 0: the virtual address under `FI_MR_VIRT_ADDR`, else 0
    /// (offsets).
    remote_base: u64,
}

impl MrPolicy {
    fn new(mode: MrMode, base: u64, next_key: impl FnOnce() -> u64) -> Self {
        MrPolicy {
            requested_key: if mode.contains(MrMode::PROV_KEY) {
                0
            } else {
                next_key()
            },
            remote_base: if mode.contains(MrMode::VIRT_ADDR) {
                base
            } else {
                0
            },
        }
    }
}

/// Start address and length of memory to register.
fn mem_range(mem: &Memory) -> (u64, usize) {
    match mem {
        Memory::Host(h) => (h.as_ptr() as u64, h.len()),
        Memory::Gpu(g) => (g.device_ptr(), g.len()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MrState {
    /// Registered; memory owned.
    Live,
    /// Deregistered; memory still owned.
    Closed,
    /// Deregistration failed: the provider may still use the memory, so it is leaked.
    Leaked,
    /// Memory handed back by `deregister`.
    Taken,
}

/// A registered memory region of an [`Endpoint`](crate::Endpoint). Owns its memory; dropping it deregisters.
pub struct Mr {
    mem: ManuallyDrop<Memory>,
    fid: *mut fi::fid_mr,
    pub(crate) desc: *mut c_void,
    /// Address of byte 0 as registered (host pointer or CUDA device pointer).
    pub(crate) base: u64,
    pub(crate) len: usize,
    remote: RemoteMr,
    /// Keeps the domain (and fabric) open while the region lives.
    _domain: Arc<Domain>,
    pub(crate) domain_id: u64,
    state: MrState,
    /// The registering endpoint's graveyard, where a drop leaves the region while the
    /// endpoint lives (`grave.rs`); empty for a region the grave holds.
    grave: Weak<Grave<Mr>>,
}

// SAFETY: the region owns its memory. Its libfabric object is closed once: by `deregister`
// (on the endpoint's thread: it takes `&mut Endpoint`), by the endpoint from its graveyard
// (its own thread) when the region is dropped while the endpoint lives, or by a drop after
// the endpoint closed, when nothing of it runs any more. `desc` is an opaque value only read
// by the owning endpoint's posts.
unsafe impl Send for Mr {}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("len", &self.len)
            .field("remote", &self.remote)
            .finish()
    }
}

impl Mr {
    fn close(&mut self) -> Result<()> {
        if self.state != MrState::Live {
            return Ok(());
        }
        // SAFETY: fid is the live region, closed once (state moves off Live).
        let ret = unsafe { fi::rs_fi_close(fi::rs_fi_mr_fid(self.fid)) };
        if ret == 0 {
            self.state = MrState::Closed;
            Ok(())
        } else {
            self.state = MrState::Leaked;
            Err(provider(
                "fi_close(mr)",
                ret.into(),
                "deregistration failed; the memory is leaked rather than freed while the \
                 provider may still use it",
            ))
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if self.state == MrState::Live {
            if let Some(grave) = self.grave.upgrade() {
                // Its endpoint is open and may still use the memory: the endpoint closes it.
                grave.bury(self.take_live());
                return;
            }
        }
        let _ = self.close();
        if self.state == MrState::Closed {
            // SAFETY: the region is deregistered, so nothing uses the memory; dropped once.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        }
        // Leaked: memory deliberately not freed. Taken: handed back by deregister. The
        // domain Arc drops after this, closing the domain if this was its last user.
    }
}

impl MemoryRegion for Mr {
    #[inline]
    fn memory(&self) -> &Memory {
        &self.mem
    }
    fn memory_mut(&mut self) -> MemoryMut<'_> {
        MemoryMut::new(&mut self.mem)
    }
    #[inline]
    fn remote(&self) -> RemoteMr {
        self.remote.clone()
    }
    #[inline]
    fn len(&self) -> usize {
        self.len
    }
}

impl Mr {
    /// Start address and descriptor of the region (see [`raw`](crate::raw)).
    #[doc(hidden)]
    pub fn raw_buf(&self) -> (*mut c_void, *mut c_void) {
        (self.base as usize as *mut c_void, self.desc)
    }
}

/// What [`Mr::register`] needs of the endpoint that registers.
pub(crate) struct RegisterOn<'a> {
    /// The endpoint's domain, which the region keeps open.
    pub domain: &'a Arc<Domain>,
    /// The memory registration mode the provider granted.
    pub mr_mode: MrMode,
    /// The provider's name, for messages.
    pub provider: &'a str,
    /// Why GPU memory cannot be registered, or `None` where it can.
    pub gpu_reason: Option<&'a str>,
    /// Flags of GPU memory registrations (`FI_HMEM_DEVICE_ONLY` unless `gpu_ipc=off`).
    pub hmem_flags: u64,
    /// The message endpoint, which a region is bound to under `FI_MR_ENDPOINT`.
    pub ep: *mut fi::fid_ep,
    /// The data endpoint where peers' WRITEs land (`FI_RX_CQ_DATA`), where there is one.
    pub data_ep: Option<*mut fi::fid_ep>,
    /// The endpoint's graveyard, where its regions go when dropped while it lives.
    pub grave: Option<&'a Arc<Grave<Mr>>>,
}

impl Mr {
    /// Register `mem` on the endpoint that `on` describes
    /// ([`Transport::register`](transport_core::Transport::register)).
    pub(crate) fn register(on: RegisterOn<'_>, mem: Memory) -> Result<Mr> {
        if mem.is_empty() {
            return Err(Error::InvalidArgument("cannot register 0 bytes".into()));
        }
        let (base, len) = mem_range(&mem);
        let policy = MrPolicy::new(on.mr_mode, base, || {
            on.domain.next_key.fetch_add(1, Ordering::Relaxed)
        });
        let requested_key = policy.requested_key;
        let mut fid: *mut fi::fid_mr = ptr::null_mut();
        match &mem {
            Memory::Host(h) => {
                // SAFETY: the domain is open; [ptr, ptr+len) is the host buffer, owned by the
                // region from here on and never moved (a HostBuffer never moves its allocation).
                let ret = unsafe {
                    fi::rs_fi_mr_reg(
                        on.domain.ptr,
                        h.as_ptr().cast(),
                        len,
                        ACCESS,
                        requested_key,
                        0,
                        &mut fid,
                    )
                };
                if ret != 0 {
                    return Err(provider(
                        "fi_mr_reg",
                        ret.into(),
                        format!(
                            "registering {len} bytes of host memory on provider {} failed; \
                             check the locked-memory limit (ulimit -l)",
                            on.provider
                        ),
                    ));
                }
            }
            Memory::Gpu(g) => {
                gpu_support(on.provider, on.gpu_reason)?;
                fid = gpu::register(
                    on.domain.ptr,
                    on.provider,
                    g,
                    ACCESS,
                    requested_key,
                    on.hmem_flags,
                )?;
            }
        }
        let mut mr = Mr {
            mem: ManuallyDrop::new(mem),
            fid,
            desc: ptr::null_mut(),
            base,
            len,
            remote: RemoteMr {
                addr: 0,
                len: len as u64,
                key: KeyBytes::from_u64(0),
            },
            _domain: Arc::clone(on.domain),
            domain_id: on.domain.id,
            state: MrState::Live,
            grave: on.grave.map(Arc::downgrade).unwrap_or_default(),
        };
        if on.mr_mode.contains(MrMode::ENDPOINT) {
            // Bound to the message endpoint, and to the data endpoint where peers' WRITEs land
            // (FI_RX_CQ_DATA).
            for ep in std::iter::once(on.ep).chain(on.data_ep) {
                // SAFETY: fid is the region just registered, ep an enabled endpoint of ours.
                let ret = unsafe { fi::rs_fi_mr_bind(fid, fi::rs_fi_ep_fid(ep), 0) };
                if ret != 0 {
                    return Err(provider(
                        "fi_mr_bind",
                        ret.into(),
                        "binding the region to the endpoint (FI_MR_ENDPOINT) failed; register it again, and \
                         check the provider takes this memory (`fi_info -v`)",
                    ));
                }
            }
            // SAFETY: as above; the region is bound.
            let ret = unsafe { fi::rs_fi_mr_enable(fid) };
            if ret != 0 {
                return Err(provider(
                    "fi_mr_enable",
                    ret.into(),
                    "enabling the region (FI_MR_ENDPOINT) failed; register it again, and check the \
                     provider takes this memory (`fi_info -v`)",
                ));
            }
        }
        // SAFETY: fid is a registered (and, where needed, enabled) region.
        let (desc, key) = unsafe { (fi::rs_fi_mr_desc(fid), fi::rs_fi_mr_key(fid)) };
        if key == fi::FI_KEY_NOTAVAIL_ {
            return Err(Error::Unsupported(format!(
                "provider {} gave no key for the region (raw keys, FI_MR_RAW, are not supported)",
                on.provider
            )));
        }
        mr.desc = desc;
        mr.remote.key = KeyBytes::from_u64(key);
        mr.remote.addr = policy.remote_base;
        Ok(mr)
    }

    /// Whether a drop of this region goes to `grave` (it was registered on its endpoint).
    pub(crate) fn buried_in(&self, grave: &Arc<Grave<Mr>>) -> bool {
        std::ptr::eq(self.grave.as_ptr(), Arc::as_ptr(grave))
    }

    /// The live region moved out into one the grave can hold (no grave of its own); `self`
    /// is left `Taken`.
    fn take_live(&mut self) -> Mr {
        // SAFETY: the memory is taken exactly once: state Taken tells Drop not to drop it.
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        self.state = MrState::Taken;
        Mr {
            mem: ManuallyDrop::new(mem),
            fid: self.fid,
            desc: self.desc,
            base: self.base,
            len: self.len,
            remote: self.remote.clone(),
            _domain: Arc::clone(&self._domain),
            domain_id: self.domain_id,
            state: MrState::Live,
            grave: Weak::new(),
        }
    }

    /// Deregister and hand the memory back
    /// ([`Transport::deregister`](transport_core::Transport::deregister)).
    pub(crate) fn into_memory(mut self) -> Result<Memory> {
        self.close()?;
        // SAFETY: the region is closed and its memory is taken exactly once; state Taken
        // tells Drop not to drop it again.
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        self.state = MrState::Taken;
        Ok(mem)
    }
}

/// `Ok` where GPU memory can be registered, else [`Error::Unsupported`] saying why
/// (`gpu_reason`): what [`Endpoint::gpu_support`](crate::Endpoint::gpu_support) answers.
pub(crate) fn gpu_support(provider: &str, gpu_reason: Option<&str>) -> Result<()> {
    match gpu_reason {
        None => Ok(()),
        Some(why) => Err(Error::Unsupported(format!(
            "GPU memory cannot be registered on provider {} (libfabric {}): {why}; use \
             host memory, or a provider and libfabric built with FI_HMEM (CUDA) support",
            provider,
            runtime_version()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mr_mode_display() {
        assert_eq!(MrMode(0).to_string(), "0");
        assert_eq!(
            MrMode::STRICT.to_string(),
            "FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY"
        );
        assert!(MrMode::SUPPORTED.contains(MrMode::STRICT));
        assert!(!MrMode::LOCAL.contains(MrMode::STRICT));
    }

    #[test]
    fn mr_policy_follows_the_mode() {
        let strict = MrPolicy::new(MrMode::STRICT, 0x7000, || panic!("no key of ours"));
        assert_eq!(
            strict,
            MrPolicy {
                requested_key: 0,
                remote_base: 0x7000
            }
        );
        let scalable = MrPolicy::new(MrMode(0), 0x7000, || 5);
        assert_eq!(
            scalable,
            MrPolicy {
                requested_key: 5,
                remote_base: 0
            }
        );
        let shm = MrPolicy::new(MrMode::VIRT_ADDR, 0x7000, || 6);
        assert_eq!(
            shm,
            MrPolicy {
                requested_key: 6,
                remote_base: 0x7000
            }
        );
    }
}
