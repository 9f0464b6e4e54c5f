/* LD_PRELOAD shim for ucx_perftest: write every host buffer it allocates.
 *
 * ucx_perftest's UCP tests allocate their buffers with ucp_mem_map(UCP_MEM_MAP_ALLOCATE)
 * and never write the send buffer. With heap buffers (UCX_ALLOC_PRIO=heap) that memory is
 * fresh anonymous memory, so a reader sees the kernel's zero page: a receiver's
 * process_vm_readv (cma rendezvous) or a sender's copy into a FIFO or socket reads one
 * 4 KiB page, hot in cache, for every 4 KiB of the message. rdma-bench sends from a buffer
 * it filled. This shim writes each host buffer once, right after ucp_mem_map allocated it,
 * so both tools send real bytes (docs/measurements.md, "UCX backend against").
 *
 * PERFTEST_BUF_OFFSET=N (0-4095): the shim allocates each host buffer itself instead, N bytes
 * into a page (posix_memalign, then ucp_mem_map of that address without ALLOCATE), and writes
 * the whole allocation, the page after the buffer included, as `rdma-bench --buf-offset N`
 * places and writes its regions (it prints "perftest-written: wrote START-END" as well):
 * where a copy's source sits in its page can change what the copy costs, and so can a
 * never-touched page right after it; UCX's heap puts perftest's buffers wherever malloc does.
 * Give a multiple of 64: UCX 1.13 rounds a mapping's start down to 16 bytes, and perftest
 * uses the buffer from where ucp_mem_query says the mapping starts. transport-ucx/shims-test.sh
 * checks both shims against the ucx_perftest on PATH.
 *
 * Built by transport-ucx/compare-tag.sh and ci/gpu-host-ucx.sh:
 *   cc -O2 -shared -fPIC -o perftest-written.so transport-ucx/perftest-written.c -ldl
 * It prints "perftest-written: LENGTH bytes at ADDRESS" to stderr for each buffer it wrote;
 * the scripts refuse a perftest run that did not print it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#define PAGE 4096

/* PERFTEST_BUF_OFFSET, or -1 when unset (UCX allocates); the shim refuses a bad value. */
static long buf_offset(void)
{
    const char *v = getenv("PERFTEST_BUF_OFFSET");
    char *end;
    long n;

    if (v == NULL || *v == '\0') return -1;
    n = strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n >= PAGE) {
        fprintf(stderr, "perftest-written: PERFTEST_BUF_OFFSET=%s: 0 to %d\n", v, PAGE - 1);
        exit(2);
    }
    return n;
}

/* Host memory, to be allocated by UCX: what this shim may place itself. */
static int host_alloc(const ucp_mem_map_params_t *p)
{
    return (p->field_mask & UCP_MEM_MAP_PARAM_FIELD_FLAGS) && (p->flags & UCP_MEM_MAP_ALLOCATE) &&
           (p->field_mask & UCP_MEM_MAP_PARAM_FIELD_LENGTH) &&
           (!(p->field_mask & UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) ||
            p->memory_type == UCS_MEMORY_TYPE_HOST);
}

typedef ucs_status_t (*mem_map_fn)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);

ucs_status_t ucp_mem_map(ucp_context_h context, const ucp_mem_map_params_t *params,
                         ucp_mem_h *memh_p)
{
    static mem_map_fn real;
    ucp_mem_attr_t attr;
    ucs_status_t status;

    if (real == NULL) {
        real = (mem_map_fn)dlsym(RTLD_NEXT, "ucp_mem_map");
        if (real == NULL) {
            fprintf(stderr, "perftest-written: no ucp_mem_map after this library\n");
            return UCS_ERR_UNSUPPORTED;
        }
    }
    long off = buf_offset();
    if (off >= 0 && host_alloc(params)) {
        ucp_mem_map_params_t placed = *params;
        void *base;
        if (posix_memalign(&base, PAGE, params->length + PAGE) != 0) return UCS_ERR_NO_MEMORY;
        placed.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
        placed.address = (char *)base + off;
        placed.flags &= ~(unsigned)UCP_MEM_MAP_ALLOCATE;
        /* The whole allocation, the page after the buffer included, as rdma-bench's
         * HostBuffer writes every page of its own (buffer, a page and the offset): a copy
         * whose source ends at a page boundary with a never-touched page behind it costs
         * several times more on the dev box (docs/measurements.md, "The page-aligned
         * penalty, explained"), and perftest's put buffers are exactly SIZE long. */
        memset(base, 0xa5, params->length + PAGE);
        /* Never freed: perftest's ucp_mem_unmap releases UCX's registration only; the
         * process ends after its one test. */
        status = real(context, &placed, memh_p);
        if (status == UCS_OK) {
            fprintf(stderr, "perftest-written: %zu bytes at %p (placed)\n", params->length,
                    placed.address);
            fprintf(stderr, "perftest-written: wrote %p-%p\n", base,
                    (void *)((char *)base + params->length + PAGE));
        }
        return status;
    }
    status = real(context, params, memh_p);
    if (status != UCS_OK || !(params->field_mask & UCP_MEM_MAP_PARAM_FIELD_FLAGS) ||
        !(params->flags & UCP_MEM_MAP_ALLOCATE)) {
        return status;
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH |
                      UCP_MEM_ATTR_FIELD_MEM_TYPE;
    if (ucp_mem_query(*memh_p, &attr) == UCS_OK && attr.mem_type == UCS_MEMORY_TYPE_HOST) {
        memset(attr.address, 0xa5, attr.length);
        fprintf(stderr, "perftest-written: %zu bytes at %p\n", attr.length, attr.address);
    }
    return status;
}
