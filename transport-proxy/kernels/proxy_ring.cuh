/* The proxy ring's layout and producer protocol as CUDA C (transport-proxy/src/ring/
   documents both; its unit test checks every offset here against the Rust constants).
   Prepend it to a kernel compiled with NVRTC, or #include it from nvcc. */
#ifndef PROXY_RING_CUH
#define PROXY_RING_CUH
#define PROXY_RING_MAGIC 0x47525850u
#define PROXY_RING_VERSION 2u
#define PROXY_OFF_HEAD 64
#define PROXY_OFF_TAIL 128
#define PROXY_OFF_DONE 192
#define PROXY_OFF_ERROR 256
#define PROXY_OFF_ARRIVALS 320
#define PROXY_LINE 64
#define PROXY_OP_WRITE 1
#define PROXY_OP_WRITE_IMM 2
#define PROXY_OP_FENCE 3
#define PROXY_ARRIVAL_SHIFT 16
#define PROXY_OFFSET_BITS 47
#define PROXY_LAP_BIT_WORD1 47
#define PROXY_LAP_BIT_ADDR 63
struct __align__(32) proxy_cmd {
    unsigned int seq;            /* word 0: the ready word (pos + 1), set by proxy_store */
    unsigned int len;
    unsigned int imm;            /* word 1 */
    unsigned char op;
    unsigned char flags;         /* bit 7: the lap flag (proxy_store); bits 6..0: 0 */
    unsigned short peer;
    unsigned long long local;    /* word 2: lap flag << 63 | region << 47 | offset */
    unsigned long long remote;   /* word 3: the same */
};
__device__ __forceinline__ unsigned long long proxy_pack(unsigned short region, unsigned long long off) {
    return ((unsigned long long)region << PROXY_OFFSET_BITS) | (off & ((1ull << PROXY_OFFSET_BITS) - 1));
}
/* The lap flag of position pos in a ring of cap commands (a power of two): 1 on the first lap
   (the block starts zeroed), then 0, 1, ...: bit log2(cap) of pos, inverted. */
__device__ __forceinline__ unsigned long long proxy_lap(unsigned long long pos, unsigned int cap) {
    return (pos & cap) ? 0ull : 1ull;
}
/* The four 64-bit words of c at position pos (ring/layout.rs's Command::words), each carrying
   pos's lap. Plain arithmetic: a host compile of this header checks it against the Rust side. */
__device__ __forceinline__ void proxy_words(unsigned long long pos, unsigned int cap, const proxy_cmd *c,
                                            unsigned long long w[4]) {
    const unsigned long long lap = proxy_lap(pos, cap), addr = ~(1ull << PROXY_LAP_BIT_ADDR);
    w[0] = (unsigned long long)(unsigned int)(pos + 1) | ((unsigned long long)c->len << 32);
    w[1] = (unsigned long long)c->imm | ((unsigned long long)c->op << 32) |
           ((unsigned long long)(c->flags & 0x7f) << 40) | ((unsigned long long)c->peer << 48) |
           (lap << PROXY_LAP_BIT_WORD1);
    w[2] = (c->local & addr) | (lap << PROXY_LAP_BIT_ADDR);
    w[3] = (c->remote & addr) | (lap << PROXY_LAP_BIT_ADDR);
}
/* Stores c at position pos: its four words, each an aligned st.relaxed.sys.u64 (single-copy
   atomic), so the proxy knows the command is whole when all four carry the lap, in whatever
   order they land (ring/mod.rs).
   ordered: word 0 goes last with st.release.sys, which orders this thread's earlier stores
   (the payload it wrote) before the command, for the CPU proxy and the NIC. Unordered: no
   fence at all (on an H200 the fence was 0.56 us of the PCIe floor's round trip), valid only
   for payload this thread did not write since its last system-scope fence
   (__threadfence_system()): bytes in place before the kernel was launched, or fenced. */
__device__ __forceinline__ void proxy_store(proxy_cmd *slot, unsigned long long pos, unsigned int cap,
                                            const proxy_cmd *c, bool ordered) {
    unsigned long long v[4];
    proxy_words(pos, cap, c, v);
    unsigned long long *w = (unsigned long long *)slot;
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(w + 1), "l"(v[1]) : "memory");
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(w + 2), "l"(v[2]) : "memory");
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(w + 3), "l"(v[3]) : "memory");
    if (ordered)
        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(w), "l"(v[0]) : "memory");
    else
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(w), "l"(v[0]) : "memory");
}
/* proxy_push's answer when the block is not a ring of this header's layout (its magic or
   version differ: a kernel built against another version of this file). */
#define PROXY_PUSH_WRONG_RING 0x10000u
/* One thread pushes c: check the block, claim a position on head, wait for room, store.
   ring: the device pointer of the block. Returns 0; the ring's error word (1-255) when the
   proxy is gone; or PROXY_PUSH_WRONG_RING. Every access here crosses PCIe: the header's first
   16 bytes are one load. */
__device__ __forceinline__ unsigned int proxy_push_as(unsigned char *ring, const proxy_cmd *c, bool ordered) {
    unsigned int magic, version, cap, slots;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(magic), "=r"(version), "=r"(cap), "=r"(slots) : "l"(ring) : "memory");
    if (magic != PROXY_RING_MAGIC || version != PROXY_RING_VERSION) return PROXY_PUSH_WRONG_RING;
    unsigned long long pos = atomicAdd_system((unsigned long long *)(ring + PROXY_OFF_HEAD), 1ull);
    volatile unsigned long long *tail = (volatile unsigned long long *)(ring + PROXY_OFF_TAIL);
    volatile unsigned int *err = (volatile unsigned int *)(ring + PROXY_OFF_ERROR);
    while (pos - *tail >= cap) {
        unsigned int e = *err;
        if (e) return e;
    }
    __threadfence_system(); /* acquire side of tail: the proxy's reads of the slot came first */
    proxy_cmd *slot = (proxy_cmd *)(ring + PROXY_OFF_ARRIVALS + PROXY_LINE * slots) + (pos & (cap - 1));
    proxy_store(slot, pos, cap, c, ordered);
    return 0;
}
/* The payload this thread wrote goes before the command (st.release.sys). */
__device__ __forceinline__ unsigned int proxy_push(unsigned char *ring, const proxy_cmd *c) {
    return proxy_push_as(ring, c, true);
}
/* No fence: for payload this thread did not write since its last __threadfence_system(). */
__device__ __forceinline__ unsigned int proxy_push_unfenced(unsigned char *ring, const proxy_cmd *c) {
    return proxy_push_as(ring, c, false);
}
#endif
