//! A fabric in one process for the proxy's tests: it delivers WRITEs out of order, may
//! complete a WRITE locally before its bytes land (transmit completion), fills its queue, fails
//! WRITEs to unknown keys, and can hold a landing region's bytes back until
//! `make_gpu_visible` (as GPUDirect RDMA writes are, to a kernel, until the flush).
//! Test code: it locks and allocates freely.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use transport_core::{
    BackendInfo, Caps, Completion, CompletionError, CompletionKind, EndpointAddr, Error, KeyBytes,
    LocalSlice, Memory, MemoryMut, MemoryRegion, NicDesc, Op, PeerId, Post, RemoteMr, RemoteRegion,
    RemoteSlice, Result, Runtime, Transport,
};

/// How the mock fabric behaves.
#[derive(Clone, Copy, Debug)]
pub struct Behaviour {
    /// Deliver pending WRITEs in a random order.
    pub reorder: bool,
    /// Complete WRITEs locally before delivery sometimes (false: delivery complete).
    pub early_local: bool,
    /// WRITEs in flight per endpoint before `Post::QueueFull`.
    pub depth: usize,
    /// Landing regions hold their bytes until `make_gpu_visible`.
    pub staged_landing: bool,
    /// Nothing moves: no WRITE lands or completes (a peer that stopped polling).
    pub stalled: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            reorder: true,
            early_local: true,
            depth: 16,
            staged_landing: false,
            stalled: false,
        }
    }
}

struct Region {
    owner: usize,
    ptr: usize,
    len: usize,
    alive: bool,
    /// Bytes landed but not yet visible: (offset, bytes, whether the owner has polled the
    /// completion that announced them). A flush makes visible what was polled before it.
    staged: Vec<(usize, Vec<u8>, bool)>,
}

struct Delivery {
    src: usize,
    key: u64,
    addr: u64,
    data: Vec<u8>,
    imm: Option<u32>,
    ctx: u64,
    local_done: bool,
}

struct Inner {
    b: Behaviour,
    rng: u64,
    regions: Vec<Region>,
    cqs: Vec<VecDeque<Completion>>,
    in_flight: Vec<usize>,
    pending: Vec<Delivery>,
    gpu_visible_calls: u64,
    /// For each WRITE with immediate: how many WRITEs of its endpoint were in flight when it
    /// was posted.
    in_flight_at_imm: Vec<usize>,
}

/// The fabric: make endpoints with [`Fabric::endpoint`].
#[derive(Clone)]
pub struct Fabric(Arc<Mutex<Inner>>);

impl Fabric {
    pub fn new(b: Behaviour, seed: u64) -> Self {
        Fabric(Arc::new(Mutex::new(Inner {
            b,
            rng: seed | 1,
            regions: Vec::new(),
            cqs: Vec::new(),
            in_flight: Vec::new(),
            pending: Vec::new(),
            gpu_visible_calls: 0,
            in_flight_at_imm: Vec::new(),
        })))
    }

    pub fn endpoint(&self) -> MockEp {
        let mut f = self.0.lock().unwrap();
        f.cqs.push(VecDeque::new());
        f.in_flight.push(0);
        MockEp {
            fabric: self.clone(),
            me: f.cqs.len() - 1,
            peers: Vec::new(),
            caps: Caps {
                max_msg_size: 1 << 30,
                max_write_size: 1 << 30,
                tx_depth: f.b.depth,
                rx_depth: f.b.depth,
                cq_data_size: 4,
                remote_write_errors: true,
                ..Caps::default()
            },
        }
    }

    /// For each WRITE with immediate, the WRITEs of its endpoint in flight when it was posted.
    pub fn in_flight_at_imm(&self) -> Vec<usize> {
        self.0.lock().unwrap().in_flight_at_imm.clone()
    }

    pub fn gpu_visible_calls(&self) -> u64 {
        self.0.lock().unwrap().gpu_visible_calls
    }
}

impl Inner {
    fn rand(&mut self) -> u64 {
        // xorshift64
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn local_done(&mut self, src: usize, ctx: u64) {
        self.in_flight[src] -= 1;
        self.cqs[src].push_back(Completion {
            ctx,
            kind: CompletionKind::Write,
        });
    }

    /// Move some pending WRITEs along: deliver some (in a random order where asked), complete
    /// some locally early.
    fn progress(&mut self) {
        if self.b.stalled {
            return;
        }
        let mut i = 0;
        while i < self.pending.len() {
            let r = self.rand();
            if self.b.early_local && !self.pending[i].local_done && r.is_multiple_of(4) {
                self.pending[i].local_done = true;
                let (src, ctx) = (self.pending[i].src, self.pending[i].ctx);
                self.local_done(src, ctx);
            }
            let deliver = !self.b.reorder || (r >> 8).is_multiple_of(2);
            if !deliver {
                i += 1;
                continue;
            }
            let d = if self.b.reorder {
                self.pending.swap_remove(i)
            } else {
                self.pending.remove(i)
            };
            self.deliver(d);
        }
    }

    fn deliver(&mut self, d: Delivery) {
        let staged = self.b.staged_landing;
        let region = self.regions.get_mut(d.key as usize).filter(|r| r.alive);
        let target = region.and_then(|r| {
            let off = d.addr.checked_sub(r.ptr as u64)? as usize;
            (off.checked_add(d.data.len())? <= r.len).then_some((r, off))
        });
        let Some((r, off)) = target else {
            if !d.local_done {
                self.in_flight[d.src] -= 1;
            }
            self.cqs[d.src].push_back(Completion {
                ctx: d.ctx,
                kind: CompletionKind::Error(Box::new(CompletionError {
                    op: Op::Write,
                    ctx: d.ctx,
                    code: 13,
                    prov_errno: 0,
                    msg: "mock: no such region or range at the target".into(),
                    hint: "check the key and the slice",
                })),
            });
            return;
        };
        let owner = r.owner;
        if staged {
            r.staged.push((off, d.data, false));
        } else {
            // SAFETY: the region is alive (its MockMr owns the buffer and marks it dead on
            // drop, under this lock), and [off, off+len) lies inside it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    d.data.as_ptr(),
                    (r.ptr as *mut u8).add(off),
                    d.data.len(),
                )
            };
        }
        if !d.local_done {
            self.local_done(d.src, d.ctx);
        }
        if let Some(imm) = d.imm {
            self.cqs[owner].push_back(Completion {
                ctx: 0,
                kind: CompletionKind::RemoteWrite { imm },
            });
        }
    }
}

pub struct MockEp {
    fabric: Fabric,
    me: usize,
    peers: Vec<usize>,
    caps: Caps,
}

pub struct MockMr {
    fabric: Fabric,
    key: u64,
    mem: Memory,
}

impl MemoryRegion for MockMr {
    fn memory(&self) -> &Memory {
        &self.mem
    }
    fn memory_mut(&mut self) -> MemoryMut<'_> {
        MemoryMut::new(&mut self.mem)
    }
    fn remote(&self) -> RemoteMr {
        let addr = self.mem.host().map_or(0, |h| h.as_ptr() as u64);
        RemoteMr {
            addr,
            len: self.mem.len() as u64,
            key: KeyBytes::new(self.key.to_le_bytes()).expect("8 bytes"),
        }
    }
}

impl Drop for MockMr {
    fn drop(&mut self) {
        if let Ok(mut f) = self.fabric.0.lock() {
            f.regions[self.key as usize].alive = false;
        }
    }
}

static INFO: BackendInfo = BackendInfo {
    name: "mock",
    aliases: &[],
    help: "the proxy tests' in-process fabric",
    library: "none",
    provider: None,
    devices: "none",
    nic_driver: |_| None,
    options: &[],
    options_env: None,
    same_process_gpu: &[],
    probe: None,
    exit_abandoning: None,
};

impl Transport for MockEp {
    type Mr = MockMr;
    const INFO: &'static BackendInfo = &INFO;
    type RemoteKey = u64;

    fn open(_nic: &NicDesc) -> Result<Self> {
        Err(Error::Unsupported(
            "mock endpoints come from Fabric::endpoint".into(),
        ))
    }
    fn provider(&self) -> &str {
        "mock"
    }
    fn nic_name(&self) -> &str {
        "mock"
    }
    fn address(&self) -> EndpointAddr {
        EndpointAddr(self.me.to_le_bytes().to_vec())
    }
    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let b: [u8; 8] = addr.0[..]
            .try_into()
            .map_err(|_| Error::BadAddress("mock: 8 bytes".into()))?;
        self.peers.push(usize::from_le_bytes(b));
        Ok(PeerId(self.peers.len() as u32 - 1))
    }
    fn register(&mut self, mem: Memory) -> Result<MockMr> {
        let h = mem
            .host()
            .ok_or_else(|| Error::Unsupported("mock: host memory only".into()))?;
        let mut f = self.fabric.0.lock().unwrap();
        f.regions.push(Region {
            owner: self.me,
            ptr: h.as_ptr() as usize,
            len: h.len(),
            alive: true,
            staged: Vec::new(),
        });
        let key = f.regions.len() as u64 - 1;
        drop(f);
        Ok(MockMr {
            fabric: self.fabric.clone(),
            key,
            mem,
        })
    }
    fn deregister(&mut self, mr: MockMr) -> Result<Memory> {
        let mut mr = std::mem::ManuallyDrop::new(mr);
        self.fabric.0.lock().unwrap().regions[mr.key as usize].alive = false;
        // SAFETY: `mr` is never used or dropped again; its fabric handle is dropped here.
        unsafe { std::ptr::drop_in_place(&mut mr.fabric) };
        // SAFETY: as above: the memory is moved out once.
        Ok(unsafe { std::ptr::read(&mr.mem) })
    }
    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<u64>> {
        if peer.0 as usize >= self.peers.len() {
            return Err(Error::InvalidArgument("mock: unknown peer".into()));
        }
        let b: [u8; 8] = mr
            .key
            .as_bytes()
            .try_into()
            .map_err(|_| Error::InvalidArgument("mock: 8-byte keys".into()))?;
        RemoteRegion::new(mr, u64::from_le_bytes(b))
    }
    fn post_send(&mut self, _: PeerId, _: LocalSlice<'_, MockMr>, _: u64) -> Result<Post> {
        Err(Error::Unsupported("mock: WRITEs only".into()))
    }
    fn post_recv(&mut self, _: LocalSlice<'_, MockMr>, _: u64) -> Result<Post> {
        Err(Error::Unsupported("mock: WRITEs only".into()))
    }
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, MockMr>,
        remote: RemoteSlice<u64>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        let _dst = self
            .peers
            .get(peer.0 as usize)
            .ok_or_else(|| Error::InvalidArgument("mock: unknown peer".into()))?;
        let mut f = self.fabric.0.lock().unwrap();
        if f.in_flight[self.me] >= f.b.depth {
            return Ok(Post::QueueFull);
        }
        let mut data = vec![0u8; buf.len];
        buf.mr
            .memory()
            .read_at(buf.offset, &mut data)
            .expect("a slice inside its region");
        if imm.is_some() {
            let n = f.in_flight[self.me];
            f.in_flight_at_imm.push(n);
        }
        f.in_flight[self.me] += 1;
        f.pending.push(Delivery {
            src: self.me,
            key: remote.key,
            addr: remote.addr,
            data,
            imm,
            ctx,
            local_done: false,
        });
        Ok(Post::Posted)
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let mut f = self.fabric.0.lock().unwrap();
        f.progress();
        let mut n = 0;
        let mut announced = 0;
        while n < out.len() {
            let Some(c) = f.cqs[self.me].pop_front() else {
                break;
            };
            announced += matches!(c.kind, CompletionKind::RemoteWrite { .. }) as usize;
            out[n] = c;
            n += 1;
        }
        // Staged bytes are announced in delivery order, as their completions are queued.
        let me = self.me;
        for r in f.regions.iter_mut().filter(|r| r.owner == me) {
            for st in r.staged.iter_mut().filter(|st| !st.2) {
                if announced == 0 {
                    break;
                }
                st.2 = true;
                announced -= 1;
            }
        }
        Ok(n)
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
    fn make_gpu_visible(&mut self, mr: &MockMr) -> Result<()> {
        if self.fabric.0.lock().unwrap().b.staged_landing {
            // A flush is a blocking driver call: long enough for a waiter told too early to
            // read the bytes it has not yet made visible.
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut f = self.fabric.0.lock().unwrap();
        f.gpu_visible_calls += 1;
        let r = &mut f.regions[mr.key as usize];
        let (polled, later): (Vec<_>, Vec<_>) = std::mem::take(&mut r.staged)
            .into_iter()
            .partition(|st| st.2);
        r.staged = later;
        for (off, data, _) in polled {
            // SAFETY: `mr` is alive (borrowed here) and the range was checked at delivery.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    (r.ptr as *mut u8).add(off),
                    data.len(),
                )
            };
        }
        Ok(())
    }
    fn runtime(&self) -> Runtime {
        Runtime::default()
    }
}
