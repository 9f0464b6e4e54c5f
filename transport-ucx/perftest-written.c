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
 * Built by transport-ucx/compare-tag.sh and ci/gpu-host-ucx.sh:
 *   cc -O2 -shared -fPIC -o perftest-written.so transport-ucx/perftest-written.c -ldl
 * It prints "perftest-written: LENGTH bytes at ADDRESS" to stderr for each buffer it wrote;
 * the scripts refuse a perftest run that did not print it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <ucp/api/ucp.h>

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
