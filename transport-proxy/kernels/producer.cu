// The GPU producer of the proxy ring. Compiled at run time by NVRTC (src/cuda.rs) with
// ring/layout.rs's CUDA_HEADER in front of it: the ring's offsets, ops and `struct proxy_cmd` come
// from there (checked against the Rust constants by ring/mod.rs's tests), and the capacity and
// arrival-slot count are read from the block's header at run time, so one compile serves
// every ring. No header file is included (NVRTC has none without the toolkit's include
// directory, and none is needed).
//
// Memory: the ring block is cuMemHostAlloc(DEVICEMAP | PORTABLE) host memory, reached here
// through its cuMemHostGetDevicePointer alias; every access to it crosses PCIe (or C2C).
// Payload buffers may be GPU or host memory.
//
// Ordering (ring/mod.rs's protocol, producer side, for the command at position pos):
//   1. claim:  the warp's leader adds the number of active lanes to the claim counter with
//              atomicAdd_system (relaxed: the claim orders nothing; it only hands out each
//              position once). The counter is the ring's head, or a u64 in GPU memory
//              (ring/mod.rs allows any counter the producers share; the proxy never reads head).
//   2. room:   spin while pos - tail >= capacity, reading tail with ld.acquire.sys. The proxy
//              stores tail with Release after it has read the slot's previous command, so
//              once this load sees the room, the proxy's reads happened before, and the
//              stores below cannot be seen by them. Each spin also reads the error word
//              (volatile): a proxy that stopped or failed ends the wait.
//   3-5. store: proxy_store (proxy_ring.cuh) writes the command as four 64-bit words, each
//              carrying the position's lap (st.relaxed.sys.u64: single-copy atomic), so the
//              proxy takes it once all four are this lap's, whatever order they land in.
//              Ordered (a producer that filled the payload, the default of proxy_push): word
//              0 goes last with st.release.sys, a release at system scope that orders this
//              thread's earlier stores, the payload above all, before the command, for every
//              observer in the system, the CPU proxy and the NIC included; the proxy's
//              Acquire fence after it saw the words pairs with it. Unordered (payload in
//              place before the launch: proxy_issue, proxy_produce without fill, the latency
//              kernel by default): no fence. (Version 1 of the ring had one ready word,
//              st.release.sys after plain field stores, so every command paid the release:
//              0.56 us of the floor's round trip, figures_latency_sync; until 2026-11-28 it
//              was __threadfence_system() then st.relaxed.sys, the same order.)
// Counters: the proxy stores done / arrivals[i] with Release after the events they count;
// the kernels here load them with ld.acquire.sys, so a kernel that sees count >= N also sees
// what the proxy (and, for arrivals into GPU memory, make_gpu_visible) made visible before.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

static_assert(sizeof(proxy_cmd) == 32, "ring/layout.rs's command is 32 bytes");

static __device__ __forceinline__ u64 ld_acquire_sys_u64(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ u64 ld_relaxed_sys_u64(const u64 *p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// How the latency kernels (proxy_pingpong, proxy_flag_pingpong) order their one thread's
// publish and poll (Kernels::set_sync; 0 is the protocol above, ordered, and the counters),
// for figures_latency_sync:
//   SYNC_SC_FENCE       the command after __threadfence_system() (fence.sc.sys) with
//                       st.relaxed.sys, in place of st.release.sys (the protocol until
//                       2026-11-28);
//   SYNC_RELAXED_POLL   the counter is polled with ld.relaxed.sys and, once it passed,
//                       fence.acq_rel.sys (a relaxed load that observed the proxy's Release
//                       store, then an acquire fence: the acquire pattern of the PTX model),
//                       in place of ld.acquire.sys on every poll;
//   SYNC_NO_FENCE       the floor's flag only: st.relaxed.sys, no fence (a flag that carries no
//                       data needs none: the fence's own share of the floor);
//   SYNC_UNFENCED       the command's words with no fence at all (its payload was in place
//                       before the launch; the latency kernels' default); the floor's flag
//                       as SYNC_NO_FENCE;
//   bits 8-11           the floor only: that many extra warps poll the echo (staggered over a
//                       microsecond, a PCIe read's time) and tell the publishing thread
//                       through shared memory; 0: the publisher polls.
#define SYNC_SC_FENCE 1u
#define SYNC_RELAXED_POLL 2u
#define SYNC_NO_FENCE 4u
#define SYNC_UNFENCED 8u

static __device__ __forceinline__ u64 poll_sys_u64(const u64 *p, u32 sync) {
    return (sync & SYNC_RELAXED_POLL) ? ld_relaxed_sys_u64(p) : ld_acquire_sys_u64(p);
}

// After a poll that saw the count: the acquire fence SYNC_RELAXED_POLL owes.
static __device__ __forceinline__ void polled(u32 sync) {
    if (sync & SYNC_RELAXED_POLL) asm volatile("fence.acq_rel.sys;" ::: "memory");
}

static __device__ __forceinline__ u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The SM's cycle counter: a register read, where %globaltimer may tick only once a
// microsecond (its resolution is the driver's choice), too coarse for one round trip.
static __device__ __forceinline__ u64 cycles() {
    u64 c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return c;
}

static __device__ __forceinline__ u32 ring_error(const u8 *ring) {
    return *(const volatile u32 *)(ring + PROXY_OFF_ERROR);
}

// The slot of position pos.
static __device__ __forceinline__ proxy_cmd *ring_slot(u8 *ring, u32 cap, u32 slots, u64 pos) {
    return (proxy_cmd *)(ring + PROXY_OFF_ARRIVALS + (u64)PROXY_LINE * slots) + (pos & (cap - 1));
}

// Steps 3-5 for a position whose slot is free (proxy_store, ordered or not).
static __device__ __forceinline__ void publish(proxy_cmd *slot, u64 pos, u32 cap, u32 op, u32 peer,
                                               u32 len, u32 imm, u64 local, u64 remote,
                                               bool ordered) {
    proxy_cmd c;
    c.seq = 0;
    c.len = len;
    c.imm = imm;
    c.op = (u8)op;
    c.flags = 0;
    c.peer = (u16)peer;
    c.local = local;
    c.remote = remote;
    proxy_store(slot, pos, cap, &c, ordered);
}

// publish for the latency kernel, as `sync` says: 0 ordered (st.release.sys of word 0);
// SYNC_SC_FENCE __threadfence_system() (fence.sc.sys) then the words relaxed (the protocol
// until 2026-11-28); SYNC_UNFENCED no fence (its payload was in place before the launch).
static __device__ __forceinline__ void publish_sync(proxy_cmd *slot, u64 pos, u32 cap, u32 op,
                                                    u32 peer, u32 len, u32 imm, u64 local,
                                                    u64 remote, u32 sync) {
    if (sync & SYNC_SC_FENCE) __threadfence_system();
    publish(slot, pos, cap, op, peer, len, imm, local, remote,
            !(sync & (SYNC_SC_FENCE | SYNC_UNFENCED)));
}

// Step 2. Returns 0 when there is room, else 1 on timeout or 0x100 | the error word.
// backoff: pause between polls (bulk producers); 0 for the latency kernel.
static __device__ __forceinline__ u32 wait_room(const u8 *ring, u32 cap, u64 pos, u64 *cached_tail,
                                                u64 timeout_ns, bool backoff) {
    if (pos - *cached_tail < cap) return 0;
    const u64 *tail = (const u64 *)(ring + PROXY_OFF_TAIL);
    const u64 t0 = globaltimer_ns();
    for (u32 spin = 1;; ++spin) {
        *cached_tail = ld_acquire_sys_u64(tail);
        if (pos - *cached_tail < cap) return 0;
        // Each read here crosses PCIe (~1 us) and thousands of threads may wait at once:
        // the error word and the clock only every 32nd poll, and past 8 polls a pause, so
        // the waiters do not crowd out the proxy's and the copies' own PCIe traffic.
        if ((spin & 31u) == 0) {
            const u32 e = ring_error(ring);
            if (e) return 0x100u | e;
            if (timeout_ns && globaltimer_ns() - t0 > timeout_ns) return 1;
        }
        if (backoff && spin > 8) asm volatile("nanosleep.u32 256;" ::: "memory"); // sm_70+
    }
}

// Step 2 for the lanes of mask (a warp's claim: consecutive positions, the highest on the
// highest lane), asked by that lane alone: its room is every lane's. Bulk producers park
// whole warps at a full ring, and one poll per lane was 32 PCIe reads where one does: reads
// that crowd the proxy's own traffic and the copies of GPU memory it starts. The verdict
// and the tail seen go to every lane; the Acquire of the poller's load orders the other
// lanes' stores too, through the shuffle's warp-synchronous exchange (the lanes' stores are
// after __shfl_sync in program order, and the proxy's Release store of tail happened before
// the load that saw it).
static __device__ __forceinline__ u32 wait_room_warp(const u8 *ring, u32 cap, u64 pos,
                                                     u64 *cached_tail, u64 timeout_ns, u32 mask,
                                                     u32 lane) {
    const u32 hi = 31u - __clz(mask);
    const u64 last = __shfl_sync(mask, pos, hi);
    u32 failed = 0;
    if (lane == hi) failed = wait_room(ring, cap, last, cached_tail, timeout_ns, true);
    *cached_tail = __shfl_sync(mask, *cached_tail, hi);
    return __shfl_sync(mask, failed, hi);
}

// The byte the payload of command i holds at offset j (cuda.rs's payload_byte is the same).
static __device__ __forceinline__ u8 payload_byte(u64 i, u64 j, u32 salt) {
    return (u8)((i * 131u + j * 7u + (j >> 8) + salt) & 0xff);
}

// Publishes commands first .. first + count (grid-stride: thread t takes t, t + threads, ...).
// Command i WRITEs len bytes from local_off + (i % pages) * stride of local region
// local_region to remote_off + (i % pages) * stride of the peer's region remote_region; with
// op PROXY_OP_WRITE_IMM its immediate is (imm_slot << 16) | (i & 0xffff), counted in the
// receiver's arrivals[imm_slot].
// claim: the u64 the warps claim positions from (the ring's head, or one in GPU memory that
// starts where the ring's positions are).
// fill != 0: each thread first fills its command's payload (payload_byte) through src, the
// device address of the local region's start; the ordered store (steps 3-5) puts it before the
// command, so the proxy's WRITE reads the new bytes.
// status[0]: 0, or 1 when a wait for room timed out, or 0x100 | the ring's error word.
extern "C" __global__ void proxy_produce(u8 *ring, u64 *claim, u64 first, u64 count, u32 peer,
                                         u32 local_region, u64 local_off, u32 remote_region,
                                         u64 remote_off, u64 len, u64 stride, u64 pages, u32 op,
                                         u32 imm_slot, u8 *src, u32 fill, u32 salt,
                                         u64 timeout_ns, u32 *status) {
    const u32 cap = *(const volatile u32 *)(ring + 8);
    const u32 slots = *(const volatile u32 *)(ring + 12);
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = threadIdx.x & 31u;
    const u64 warp_base = tid - lane;
    u64 cached_tail = 0;
    u32 failed = 0;
    // Every lane of a warp runs the same rounds, so the warp-wide votes below see all 32.
    for (u64 round = 0; warp_base + round * nthreads < count; ++round) {
        if (__any_sync(0xffffffffu, failed != 0)) break;
        const u64 idx = tid + round * nthreads;
        const bool mine = idx < count;
        const u64 i = first + idx;
        const u64 page = pages ? (i % pages) : 0;
        if (mine && fill) {
            u8 *d = src + local_off + page * stride;
            for (u64 j = 0; j < len; ++j) d[j] = payload_byte(i, j, salt);
        }
        // 1. claim: one atomic per warp.
        const u32 mask = __ballot_sync(0xffffffffu, mine);
        if (!mine) continue;
        const u32 leader = __ffs(mask) - 1;
        const u32 rank = __popc(mask & ((1u << lane) - 1u));
        u64 base = 0;
        if (lane == leader) base = atomicAdd_system(claim, (u64)__popc(mask));
        base = __shfl_sync(mask, base, leader);
        const u64 pos = base + rank;
        // 2. room.
        failed = wait_room_warp(ring, cap, pos, &cached_tail, timeout_ns, mask, lane);
        if (failed) {
            atomicCAS(status, 0u, failed);
            continue;
        }
        // 3-5.
        const u32 imm = op == PROXY_OP_WRITE_IMM ? ((imm_slot << PROXY_ARRIVAL_SHIFT) | (u32)(i & 0xffff)) : 0u;
        publish(ring_slot(ring, cap, slots, pos), pos, cap, op, peer, (u32)len, imm,
                proxy_pack((u16)local_region, local_off + page * stride),
                proxy_pack((u16)remote_region, remote_off + page * stride), fill != 0);
    }
}

// One thread spins until the u64 counter at `counter` (ring + PROXY_OFF_DONE, an arrivals
// word, or any u64 the proxy stores with Release) reaches target, loading it with
// ld.acquire.sys. out[0] = the value seen last, out[1] = globaltimer when it reached target
// (0 if it did not), out[2] = globaltimer at the start, out[3] = the ring's error word if
// that ended the wait. Gives up after timeout_ns (0: never).
extern "C" __global__ void proxy_wait(const u8 *ring, const u64 *counter, u64 target,
                                      u64 timeout_ns, u64 *out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const u64 t0 = globaltimer_ns();
    out[2] = t0;
    out[1] = 0;
    out[3] = 0;
    u64 v = 0;
    for (;;) {
        v = ld_acquire_sys_u64(counter);
        if (v >= target) {
            out[1] = globaltimer_ns();
            break;
        }
        const u32 e = ring_error(ring);
        if (e) {
            v = ld_acquire_sys_u64(counter);
            if (v >= target) { out[1] = globaltimer_ns(); break; }
            out[3] = e;
            break;
        }
        if (timeout_ns && globaltimer_ns() - t0 > timeout_ns) break;
    }
    out[0] = v;
}

// Latency, one thread: iters rounds of "publish one command, then spin until
// *counter >= base_count + round + 1". The thread is the ring's only producer while it runs,
// so it claims positions from a register (starting at head, which it stores back at the
// end) instead of an atomic on head: a round trip over PCIe less per round (ring/mod.rs allows
// any claim that hands out each position once; the proxy never reads head). counter is the ring's done (local
// completion: delivered, the trait's promise) or an arrivals word of this side's ring
// (the peer's answer landed). out[0] = rounds done, out[1] = ns of all rounds (globaltimer),
// out[2] = 0, or 1 on timeout, or 0x100 | the error word, out[3] = SM cycles of all rounds
// (the same span as out[1], for converting round_cycles to ns). round_cycles[r] = the
// cycles of round r, its wait for room to its answer seen (saturating at 2^32 - 1): device memory, a
// plain store after the round's poll, read by the host after the kernel ended.
extern "C" __global__ void proxy_pingpong(u8 *ring, const u64 *counter, u64 base_count, u64 iters,
                                          u64 first, u32 peer, u32 local_region, u64 local_off,
                                          u32 remote_region, u64 remote_off, u64 len, u32 op,
                                          u32 imm_slot, u64 timeout_ns, u32 sleep_ns,
                                          u32 sync, u32 margin_ns, u64 *out, u32 *round_cycles) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const u32 cap = *(const volatile u32 *)(ring + 8);
    const u32 slots = *(const volatile u32 *)(ring + 12);
    volatile u64 *head = (volatile u64 *)(ring + PROXY_OFF_HEAD);
    const u64 pos0 = *head;
    u64 cached_tail = 0;
    u32 failed = 0;
    out[2] = 0;
    const u64 start = globaltimer_ns();
    const u64 start_cycles = cycles();
    // The shortest round trip so far, publish to answer seen (ns): with margin_ns, each
    // round sleeps until margin_ns before it and only then polls (Kernels::set_poll_margin).
    u64 fastest = ~0ull;
    u64 r = 0;
    for (; r < iters; ++r) {
        const u64 i = first + r;
        const u64 pos = pos0 + r;
        const u64 c0 = cycles();
        failed = wait_room(ring, cap, pos, &cached_tail, timeout_ns, false);
        if (failed) break;
        const u32 imm = op == PROXY_OP_WRITE_IMM ? ((imm_slot << PROXY_ARRIVAL_SHIFT) | (u32)(i & 0xffff)) : 0u;
        publish_sync(ring_slot(ring, cap, slots, pos), pos, cap, op, peer, (u32)len, imm,
                     proxy_pack((u16)local_region, local_off),
                     proxy_pack((u16)remote_region, remote_off), sync);
        const u64 t0 = globaltimer_ns();
        if (margin_ns && fastest != ~0ull && fastest > margin_ns) {
            // Poll late: the answer has never come sooner than `fastest`; until margin_ns
            // before that this thread sleeps (the GPU's clock is no PCIe read), keeping its
            // reads of mapped memory off the link while the proxy's copies cross it.
            const u64 until = t0 + fastest - margin_ns;
            for (u64 now = t0; now < until; now = globaltimer_ns()) {
                const u64 left = until - now;
                asm volatile("nanosleep.u32 %0;" ::"r"((u32)(left < 1000u ? left : 1000u)) : "memory");
            }
        }
        // One PCIe read per poll: the error word and the clock only every 64th (reading the
        // error word on every poll doubled the time between two looks at the counter).
        for (u32 spin = 1; poll_sys_u64(counter, sync) < base_count + r + 1; ++spin) {
            if (sleep_ns) asm volatile("nanosleep.u32 %0;" ::"r"(sleep_ns) : "memory");
            if ((spin & 63u) != 0) continue;
            const u32 e = ring_error(ring);
            if (e) { failed = 0x100u | e; break; }
            if (timeout_ns && globaltimer_ns() - t0 > timeout_ns) { failed = 1; break; }
        }
        if (failed) break;
        polled(sync);
        const u64 c = cycles() - c0;
        round_cycles[r] = c > 0xffffffffull ? 0xffffffffu : (u32)c;
        const u64 rt = globaltimer_ns() - t0;
        if (rt < fastest) fastest = rt;
    }
    // Positions pos0 .. pos0 + r were claimed (the last maybe unpublished after a failure).
    const u64 end = globaltimer_ns(), end_cycles = cycles();
    *head = pos0 + r + (failed ? 1 : 0);
    out[0] = r;
    out[1] = end - start;
    out[2] = failed;
    out[3] = end_cycles - start_cycles;
}

// Publishes n commands staged by the host (cuda.rs's CudaProducer: the seam of bench-core's
// gpu-write, which hands a producer a list of commands): thread t takes staged command t
// (grid-stride), 32 bytes laid out as struct proxy_cmd (seq ignored), read through the
// device alias of the host staging buffer, and publishes it as proxy_produce does: warp
// claims on the ring's head, room, the words (unordered). status[0] as proxy_produce's.
extern "C" __global__ void proxy_issue(u8 *ring, const u8 *staged, u64 n, u64 timeout_ns,
                                       u32 *status) {
    const u32 cap = *(const volatile u32 *)(ring + 8);
    const u32 slots = *(const volatile u32 *)(ring + 12);
    u64 *head = (u64 *)(ring + PROXY_OFF_HEAD);
    const u64 nthreads = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = threadIdx.x & 31u;
    const u64 warp_base = tid - lane;
    u64 cached_tail = 0;
    u32 failed = 0;
    for (u64 round = 0; warp_base + round * nthreads < n; ++round) {
        if (__any_sync(0xffffffffu, failed != 0)) break;
        const u64 idx = tid + round * nthreads;
        const bool mine = idx < n;
        const u32 mask = __ballot_sync(0xffffffffu, mine);
        if (!mine) continue;
        const volatile proxy_cmd *c = (const volatile proxy_cmd *)staged + idx;
        const u32 op = c->op, peer = c->peer, len = c->len, imm = c->imm;
        const u64 local = c->local, remote = c->remote;
        const u32 leader = __ffs(mask) - 1;
        const u32 rank = __popc(mask & ((1u << lane) - 1u));
        u64 base = 0;
        if (lane == leader) base = atomicAdd_system(head, (u64)__popc(mask));
        base = __shfl_sync(mask, base, leader);
        const u64 pos = base + rank;
        failed = wait_room_warp(ring, cap, pos, &cached_tail, timeout_ns, mask, lane);
        if (failed) {
            atomicCAS(status, 0u, failed);
            continue;
        }
        // Unordered: this kernel writes no payload; the host staged the commands of bytes
        // already in place.
        publish(ring_slot(ring, cap, slots, pos), pos, cap, op, peer, len, imm, local, remote,
                false);
    }
}

// The floor of a kernel <-> CPU round trip over the same mapped memory as the ring (what
// PCIe costs alone, no proxy, no transport): iters rounds of "store r + 1 to flags[0]
// (st.release.sys, as an ordered publish stores word 0; or as sync says), then wait until flags[16] (another 128-byte line, the CPU's echo) reads >= r + 1"
// (ld.acquire.sys, or as sync says). Thread 0 publishes; with extra polling warps (sync's bits
// 8-11, launched as 32 threads each after the first warp) their lane 0 polls and raises
// `seen` in shared memory, which thread 0 spins on. out[0] = rounds done, out[1] = ns of all
// rounds (globaltimer), out[2] = 0 or 1 on timeout (the CPU stopped echoing).
extern "C" __global__ void proxy_flag_pingpong(u64 *flags, u64 iters, u64 timeout_ns, u32 sync,
                                               u64 *out) {
    __shared__ unsigned long long seen;
    __shared__ volatile u32 quit;
    if (threadIdx.x == 0) {
        seen = 0;
        quit = 0;
    }
    __syncthreads();
    const u32 warp = threadIdx.x / 32u, pollers = (sync >> 8) & 15u;
    if ((threadIdx.x & 31u) != 0 || blockIdx.x != 0 || warp > pollers) return;
    if (warp > 0) {
        const u32 stagger = 1000u / pollers * (warp - 1u);
        if (stagger) asm volatile("nanosleep.u32 %0;" ::"r"(stagger) : "memory");
        while (!quit) {
            const u64 v = poll_sys_u64(flags + 16, sync);
            if (v > *(volatile unsigned long long *)&seen) {
                polled(sync);
                atomicMax(&seen, (unsigned long long)v);
            }
        }
        return;
    }
    out[2] = 0;
    const u64 start = globaltimer_ns();
    u64 r = 0;
    for (; r < iters; ++r) {
        if (sync & (SYNC_SC_FENCE | SYNC_NO_FENCE | SYNC_UNFENCED)) {
            if (sync & SYNC_SC_FENCE) __threadfence_system();
            asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(flags), "l"(r + 1) : "memory");
        } else {
            asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flags), "l"(r + 1) : "memory");
        }
        const u64 t0 = globaltimer_ns();
        bool late = false;
        for (u32 spin = 1;; ++spin) {
            const u64 v = pollers ? *(volatile unsigned long long *)&seen : poll_sys_u64(flags + 16, sync);
            if (v >= r + 1) break;
            if ((spin & 63u) == 0 && timeout_ns && globaltimer_ns() - t0 > timeout_ns) {
                late = true;
                break;
            }
        }
        if (late) { out[2] = 1; break; }
        if (!pollers) polled(sync);
    }
    quit = 1;
    out[0] = r;
    out[1] = globaltimer_ns() - start;
}

// Load for the copy figures (tests/gpu_proxy.rs, figures_copies_beside_kernels): every
// stride-th thread of the launch polls the u64 at counter (mapped host or GPU memory) with
// ld.acquire.sys until it reaches target, pausing sleep_ns between polls (0: none), as the
// kernels above wait on the proxy. status[0] counts the threads that gave up at timeout_ns.
extern "C" __global__ void proxy_spin(const u64 *counter, u64 target, u32 stride, u32 sleep_ns,
                                      u64 timeout_ns, u32 *status) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (stride == 0 || tid % stride != 0) return;
    const u64 t0 = globaltimer_ns();
    for (u32 spin = 1; ld_acquire_sys_u64(counter) < target; ++spin) {
        if (sleep_ns) asm volatile("nanosleep.u32 %0;" ::"r"(sleep_ns) : "memory");
        if ((spin & 63u) == 0 && timeout_ns && globaltimer_ns() - t0 > timeout_ns) {
            atomicAdd(status, 1u);
            break;
        }
    }
}
