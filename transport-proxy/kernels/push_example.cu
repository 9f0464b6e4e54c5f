// A kernel of your own, issuing WRITEs through the proxy ring with nothing but
// proxy_ring.cuh (#include it from nvcc, or prepend ring::CUDA_HEADER for NVRTC). Compiled
// with producer.cu (src/cuda.rs), whose payload_byte pattern it writes, and run by
// tests/gpu_proxy.rs (`Produce::push`) beside the library's own producers.
//
// Thread t sends commands first + t, first + t + threads, ... Command i WRITEs len bytes from
// local_off + (i % pages) * stride of local region local_region to remote_off + (i % pages) *
// stride of the peer's region remote_region, with the immediate (imm_slot << 16) | (i &
// 0xffff), which the receiver's proxy counts in its arrivals[imm_slot].
// fill != 0: the thread first writes the payload through src (the local region's device
// address), then proxy_push, whose st.release.sys puts those bytes before the command.
// fill == 0: the payload was in place before the launch, and proxy_push_unfenced publishes
// with no fence at all.
// status[0]: 0; or 0x100 | the ring's error word (the proxy is gone); or
// PROXY_PUSH_WRONG_RING.
extern "C" __global__ void proxy_push_example(unsigned char *ring, unsigned long long first,
                                              unsigned long long count, unsigned int peer,
                                              unsigned int local_region,
                                              unsigned long long local_off,
                                              unsigned int remote_region,
                                              unsigned long long remote_off,
                                              unsigned long long len, unsigned long long stride,
                                              unsigned long long pages, unsigned int imm_slot,
                                              unsigned char *src, unsigned int fill,
                                              unsigned int salt, unsigned int *status) {
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         t < count; t += threads) {
        const unsigned long long i = first + t, off = (i % pages) * stride;
        if (fill)
            for (unsigned long long j = 0; j < len; ++j)
                src[local_off + off + j] = payload_byte(i, j, salt);
        proxy_cmd c;
        c.seq = 0;
        c.len = (unsigned int)len;
        c.imm = (imm_slot << PROXY_ARRIVAL_SHIFT) | (unsigned int)(i & 0xffff);
        c.op = PROXY_OP_WRITE_IMM;
        c.flags = 0;
        c.peer = (unsigned short)peer;
        c.local = proxy_pack((unsigned short)local_region, local_off + off);
        c.remote = proxy_pack((unsigned short)remote_region, remote_off + off);
        const unsigned int e = fill ? proxy_push(ring, &c) : proxy_push_unfenced(ring, &c);
        if (e) {
            atomicCAS(status, 0u, e == PROXY_PUSH_WRONG_RING ? e : 0x100u | e);
            return;
        }
    }
}
