/* The proxy ring's layout and producer protocol as CUDA C (transport-proxy/src/ring/
   documents both; its unit test checks every offset here against the Rust constants).
   Prepend it to a kernel compiled with NVRTC, or #include it from nvcc. */
#ifndef PROXY_RING_CUH
#define PROXY_RING_CUH
#define PROXY_RING_MAGIC 0x47525850u
#define PROXY_RING_VERSION 1u
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
#define PROXY_OFFSET_BITS 48
struct __align__(32) proxy_cmd {
    unsigned int seq;            /* ready word: (pos + 1), stored last */
    unsigned char op;
    unsigned char flags;
    unsigned short peer;
    unsigned int len;
    unsigned int imm;
    unsigned long long local;    /* region << 48 | offset */
    unsigned long long remote;   /* region << 48 | offset */
};
__device__ __forceinline__ unsigned long long proxy_pack(unsigned short region, unsigned long long off) {
    return ((unsigned long long)region << PROXY_OFFSET_BITS) | (off & ((1ull << PROXY_OFFSET_BITS) - 1));
}
/* ring: the device pointer of the block; returns 0, or the error word when the proxy is gone. */
__device__ __forceinline__ unsigned int proxy_push(unsigned char *ring, const proxy_cmd *c) {
    unsigned int cap = *(volatile unsigned int *)(ring + 8);
    unsigned int slots = *(volatile unsigned int *)(ring + 12);
    unsigned long long pos = atomicAdd_system((unsigned long long *)(ring + PROXY_OFF_HEAD), 1ull);
    volatile unsigned long long *tail = (volatile unsigned long long *)(ring + PROXY_OFF_TAIL);
    volatile unsigned int *err = (volatile unsigned int *)(ring + PROXY_OFF_ERROR);
    while (pos - *tail >= cap) {
        unsigned int e = *err;
        if (e) return e;
    }
    __threadfence_system(); /* acquire side of tail: the proxy's reads of the slot came first */
    proxy_cmd *slot = (proxy_cmd *)(ring + PROXY_OFF_ARRIVALS + PROXY_LINE * slots) + (pos & (cap - 1));
    slot->op = c->op; slot->flags = 0; slot->peer = c->peer; slot->len = c->len;
    slot->imm = c->imm; slot->local = c->local; slot->remote = c->remote;
    /* release at system scope: the fields (and the source bytes) before the ready word */
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(&slot->seq), "r"((unsigned int)(pos + 1)) : "memory");
    return 0;
}
#endif
