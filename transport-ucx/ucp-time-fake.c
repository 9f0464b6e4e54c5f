/* Stand-ins for shims-test.sh's check of ucp-time.c's CUDA counts on a machine without CUDA,
 * built four ways, in the shape UCX has on the GPU host:
 *
 *   -DFAKE_CUDA  libcuda.so.1: the driver functions the check calls; each checks its
 *                arguments and counts its calls (fake_cuda_calls)
 *   -DFAKE_MOD   libfakemod.so, linked to that libcuda: one "transport" step that calls
 *                cuCtxPushCurrent_v2, cuMemcpyAsync, cuEventRecord, cuEventQuery twice (the
 *                first finds the copy still running, the second done) and cuCtxPopCurrent_v2
 *   -DFAKE_UCP   libfakeucp.so: ucp_tag_send_nbx, which loads libfakemod.so with RTLD_LOCAL
 *                on its first call (as UCX loads its CUDA module, so libcuda is not in the
 *                global scope) and runs its step on every call
 *   (none)       the program: N sends, then the fake driver's own count of its calls, which
 *                must be 6 N: every call the shim took reached the real function
 */
#include <stddef.h>
#include <stdint.h>

#if defined(FAKE_CUDA)
static unsigned long calls;
static int sane = 1, fresh;
unsigned long fake_cuda_calls(void) { return sane ? calls : 0; }
int cuCtxPushCurrent_v2(void *ctx) { calls++; sane &= ctx == (void *)0x1234; return 0; }
int cuCtxPopCurrent_v2(void *pctx) { calls++; sane &= pctx == NULL; return 0; }
int cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *stream)
{
    calls++;
    sane &= dst == 0x1000 && src == 0x2000 && n == 4096 && stream == (void *)0x5678;
    fresh = 1;
    return 0;
}
int cuEventRecord(void *event, void *stream)
{
    calls++;
    sane &= event == (void *)0x9abc && stream == (void *)0x5678;
    return 0;
}
/* CUDA_ERROR_NOT_READY (600) at the first query after a copy, CUDA_SUCCESS after. */
int cuEventQuery(void *event)
{
    calls++;
    sane &= event == (void *)0x9abc;
    if (fresh) {
        fresh = 0;
        return 600;
    }
    return 0;
}

#elif defined(FAKE_MOD)
int cuCtxPushCurrent_v2(void *ctx);
int cuCtxPopCurrent_v2(void *pctx);
int cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *stream);
int cuEventRecord(void *event, void *stream);
int cuEventQuery(void *event);
int fake_mod_step(void)
{
    return cuCtxPushCurrent_v2((void *)0x1234) | cuMemcpyAsync(0x1000, 0x2000, 4096, (void *)0x5678) |
           cuEventRecord((void *)0x9abc, (void *)0x5678) |
           (cuEventQuery((void *)0x9abc) != 600) | cuEventQuery((void *)0x9abc) |
           cuCtxPopCurrent_v2(NULL);
}

#elif defined(FAKE_UCP)
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
void *ucp_tag_send_nbx(void *ep, const void *buf, size_t len, uint64_t tag, const void *param)
{
    static int (*step)(void);
    (void)ep, (void)buf, (void)len, (void)tag, (void)param;
    if (step == NULL) {
        void *mod = dlopen("libfakemod.so", RTLD_LAZY | RTLD_LOCAL);
        if (mod == NULL || (*(void **)&step = dlsym(mod, "fake_mod_step")) == NULL) {
            fprintf(stderr, "fake ucp: %s\n", dlerror());
            exit(3);
        }
    }
    if (step() != 0) exit(4);
    return NULL;
}

#else
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
void *ucp_tag_send_nbx(void *ep, const void *buf, size_t len, uint64_t tag, const void *param);
int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 2000, (*count)(void);
    for (unsigned long i = 0; i < n; i++) ucp_tag_send_nbx(NULL, NULL, 4096, 0, NULL);
    /* Loaded by now (libfakemod's dependency): its own count. */
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (cuda == NULL || (*(void **)&count = dlsym(cuda, "fake_cuda_calls")) == NULL) {
        fprintf(stderr, "fake: no libcuda.so.1 loaded\n");
        return 3;
    }
    printf("fake libcuda: %lu calls with the arguments sent\n", count());
    return 0;
}
#endif
