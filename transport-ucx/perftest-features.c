/* LD_PRELOAD shim for ucx_perftest: add UCP features to the context it creates.
 *
 * ucx_perftest's UCP tests ask ucp_init for the features their test needs (tag_bw: TAG and
 * RMA, libperf.c). rdma-bench's UCX backend also asks for AM, which carries its immediates.
 * A context's features choose its lanes and protocols, so a difference between the tools may
 * be the features and not the code. With PERFTEST_FEATURES_ADD=BITS (a decimal or 0x number
 * of UCP_FEATURE_* bits, e.g. 64 for UCP_FEATURE_AM) this shim ORs those bits into every
 * ucp_init perftest makes, which gives ci/gpu-host-ucx.sh's "theirs-B" (UCX_THEIRS_B_FEATURES).
 *
 *   cc -O2 -shared -fPIC -o perftest-features.so transport-ucx/perftest-features.c -ldl
 *
 * It prints "perftest-features: FEATURES -> FEATURES" to stderr for each context; the script
 * refuses a theirs-B run that did not print it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

typedef ucs_status_t (*init_fn)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *,
                                ucp_context_h *);

ucs_status_t ucp_init_version(unsigned api_major_version, unsigned api_minor_version,
                              const ucp_params_t *params, const ucp_config_t *config,
                              ucp_context_h *context_p)
{
    static init_fn real;
    const char *v = getenv("PERFTEST_FEATURES_ADD");
    ucp_params_t p;
    char *end;
    unsigned long long add;

    if (real == NULL) real = (init_fn)dlsym(RTLD_NEXT, "ucp_init_version");
    if (real == NULL) {
        fprintf(stderr, "perftest-features: no ucp_init_version after this shim\n");
        return UCS_ERR_NO_ELEM;
    }
    if (v == NULL || *v == '\0' || params == NULL)
        return real(api_major_version, api_minor_version, params, config, context_p);
    add = strtoull(v, &end, 0);
    if (*end != '\0') {
        fprintf(stderr, "perftest-features: PERFTEST_FEATURES_ADD=%s is not a number\n", v);
        return UCS_ERR_INVALID_PARAM;
    }
    p = *params;
    if (!(p.field_mask & UCP_PARAM_FIELD_FEATURES)) {
        p.field_mask |= UCP_PARAM_FIELD_FEATURES;
        p.features = 0;
    }
    fprintf(stderr, "perftest-features: 0x%llx -> 0x%llx\n", (unsigned long long)p.features,
            (unsigned long long)(p.features | add));
    p.features |= add;
    return real(api_major_version, api_minor_version, &p, config, context_p);
}
