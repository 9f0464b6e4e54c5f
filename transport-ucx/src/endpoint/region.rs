//! Registered memory: the UCP context regions map into, a region (`UcxMr`) and its
//! `ucp_mem_map` handle, the keys a peer's regions are imported as, and the regions a WRITE
//! carried as an active message may land in.

use std::ptr;
use std::sync::{Arc, Mutex, Weak};

use transport_core::{Memory, MemoryMut, MemoryRegion, RemoteMr};
use ucx_sys as sys;

/// The first byte of a region's key: host memory, or GPU memory (its token follows).
pub(super) const KEY_HOST: u8 = 1;
pub(super) const KEY_GPU: u8 = 2;

/// The UCP context; shared by the endpoint and its regions so that a region outliving its
/// endpoint still unmaps into a live context.
pub(super) struct Context {
    pub(super) ctx: sys::ucp_context_h,
    pub(super) cuda: bool,
}

// SAFETY: the context is created with `mt_workers_shared`, which makes its calls
// (ucp_mem_map, ucp_mem_unmap, ucp_rkey_pack, ucp_cleanup) safe from any thread; the handle
// itself is an opaque pointer that UCX owns.
unsafe impl Send for Context {}
// SAFETY: as above; every call taking `&Context` is thread-safe on such a context.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from ucp_init_version and is cleaned up once, here, after every
        // worker (the endpoint's, destroyed in its Drop) and every mapping (each region holds
        // an Arc of this) is gone.
        unsafe { sys::ucp_cleanup(self.ctx) };
    }
}

/// Regions dropped while their endpoint lives, mapping and memory: a peer's put over tcp or
/// cma writes at the address it was given without the target checking any registration, a
/// receive or a landing may still be under way into the memory, and operations still queued
/// name the mapping (`memh`). The endpoint unmaps and frees them once its worker is destroyed
/// (nothing runs or arrives any more); each pair drops mapping first, then memory.
pub(super) type Graveyard = Mutex<Vec<(Mapping, Memory)>>;

/// A registered region.
pub struct UcxMr {
    /// `None` only while the region is being taken apart (deregister, drop).
    pub(super) mem: Option<Memory>,
    pub(super) len: usize,
    pub(super) grave: Weak<Graveyard>,
    pub(super) map: Mapping,
    /// The endpoint that registered it.
    pub(super) owner: u32,
    /// Start address of the memory (host or device pointer).
    pub(super) base: usize,
    /// What `ucp_mem_map` was told the memory is: sends and receives name it (with the
    /// mapping) so that UCX does not detect it per call.
    pub(super) mtype: sys::ucs_memory_type_t,
    pub(super) remote: RemoteMr,
}

/// A `ucp_mem_map` handle and the context it belongs to; unmapped when dropped.
pub(super) struct Mapping {
    pub(super) memh: sys::ucp_mem_h,
    pub(super) ctx: Arc<Context>,
}

// SAFETY: the memh is only used in ucp_mem_unmap on its (thread-safe, see Context) context.
unsafe impl Send for Mapping {}

impl Mapping {
    pub(super) fn unmap(&mut self) -> sys::ucs_status_t {
        if self.memh.is_null() {
            return sys::UCS_OK;
        }
        // SAFETY: memh was returned by ucp_mem_map on ctx, which is alive (we hold an Arc),
        // and is unmapped once: it is nulled right after.
        let st = unsafe { sys::ucp_mem_unmap(self.ctx.ctx, self.memh) };
        self.memh = ptr::null_mut();
        st
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = self.unmap();
    }
}

impl Drop for UcxMr {
    fn drop(&mut self) {
        let Some(mem) = self.mem.take() else {
            // Handed back by deregister, which unmapped it.
            return;
        };
        let Some(grave) = self.grave.upgrade() else {
            // The endpoint is gone, its worker with it: nothing uses the region any more.
            let _ = self.map.unmap();
            return;
        };
        let map = Mapping {
            memh: std::mem::replace(&mut self.map.memh, ptr::null_mut()),
            ctx: self.map.ctx.clone(),
        };
        let dead = (map, mem);
        let left = match grave.lock() {
            Ok(mut g) => {
                g.push(dead);
                None
            }
            Err(_) => Some(dead),
        };
        // A thread panicked holding the lock: leak both rather than unmap or free what UCX
        // may still use.
        std::mem::forget(left);
    }
}

pub(super) const TAKEN: &str = "a region's memory is only taken when the region is consumed";

impl MemoryRegion for UcxMr {
    fn memory(&self) -> &Memory {
        self.mem.as_ref().expect(TAKEN)
    }
    fn memory_mut(&mut self) -> MemoryMut<'_> {
        MemoryMut::new(self.mem.as_mut().expect(TAKEN))
    }
    fn remote(&self) -> RemoteMr {
        self.remote.clone()
    }
}

/// A key imported with `import`: a token into the endpoint's table of unpacked rkeys, checked
/// by every post (a key of another endpoint or another peer is a refused post).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UcxKey {
    pub(super) endpoint: u32,
    pub(super) index: u32,
}

pub(super) struct Imported {
    pub(super) peer: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) rkey: sys::ucp_rkey_h,
    /// The region's token, which a WRITE carried as an active message must name.
    pub(super) token: u64,
    /// The peer registered the region as host memory (else GPU memory, into which an active
    /// message's bytes land only through a rendezvous: `AM_WRITE`).
    pub(super) host: bool,
}

/// A region this endpoint registered, as an `AM_WRITE` or `AM_WRITE_IMM` may write into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Landable {
    pub(super) base: usize,
    pub(super) len: usize,
    /// Travels in the region's key; a WRITE carried as an active message must name it. UCX
    /// checks a put's rkey; the handler, which writes by address, checks this instead, so a
    /// stale or foreign key does not write here (a guard against mistakes, not an attacker).
    pub(super) token: u64,
    /// What `ucp_mem_map` was told the memory is: the handler copies into host memory itself,
    /// and has UCX receive a rendezvous into any memory (`ucp_am_recv_data_nbx`).
    pub(super) mtype: sys::ucs_memory_type_t,
}

/// A token for a region: unpredictable across regions and processes (`RandomState` draws its
/// keys from the OS once per thread and steps them per call).
pub(super) fn region_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(0x7563_785f);
    h.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use transport_core::wait::wait_pair;
    use transport_core::{
        CompletionKind, Error, HostBuffer, LocalSlice, Memory, NicDesc, Post, Transport,
    };

    use super::super::Endpoint;

    /// A region dropped with a receive posted into it keeps its mapping and its memory until
    /// the endpoint goes (the receive still lands in it); deregister refuses while an
    /// operation is in flight and hands the memory back once none is.
    #[test]
    fn a_region_dropped_in_use_keeps_its_mapping_and_memory() {
        let nic = NicDesc::provider("sm").with_option("peer_errors", "off");
        let (mut a, mut b) = (Endpoint::open(&nic).unwrap(), Endpoint::open(&nic).unwrap());
        let to_b = a.add_peer(&b.address()).unwrap();
        b.add_peer(&a.address()).unwrap();
        let len = 64 << 10;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let src = a
            .register(Memory::Host(HostBuffer::from_slice(&data)))
            .unwrap();
        let dst = b.register(Memory::Host(HostBuffer::new(len))).unwrap();
        assert_eq!(b.post_recv(LocalSlice::all(&dst), 7).unwrap(), Post::Posted);
        drop(dst);
        {
            let g = b.grave.lock().unwrap();
            assert_eq!(g.len(), 1);
            assert!(
                !g[0].0.memh.is_null(),
                "a region dropped in use was unmapped"
            );
        }
        let spare = b.register(Memory::Host(HostBuffer::new(4096))).unwrap();
        match b.deregister(spare) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("in flight"), "{m}"),
            other => panic!("deregister with a receive posted: {other:?}"),
        }
        assert_eq!(
            b.grave.lock().unwrap().len(),
            2,
            "the refused region waits too"
        );
        assert_eq!(
            a.post_send(to_b, LocalSlice::all(&src), 9).unwrap(),
            Post::Posted
        );
        let (mut sent, mut got) = (false, false);
        wait_pair(
            &mut a,
            &mut b,
            "the SEND",
            Duration::from_secs(20),
            |side, c| {
                match (side, &c.kind) {
                    (0, CompletionKind::Send) => sent = true,
                    (1, CompletionKind::Recv { len: n, .. }) => {
                        assert_eq!(*n, len);
                        got = true;
                    }
                    _ => {}
                }
                Ok(sent && got)
            },
        )
        .unwrap();
        let r = b.register(Memory::Host(HostBuffer::new(4096))).unwrap();
        assert_eq!(b.deregister(r).unwrap().len(), 4096, "deregister when idle");
    }
}
