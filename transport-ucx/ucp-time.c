/* LD_PRELOAD shim: where a tag stream's time goes, per process, for any UCP program.
 *
 * Wraps ucp_tag_send_nbx, ucp_tag_recv_nbx, ucp_put_nbx and ucp_worker_progress, counts their
 * calls (and the sends that returned a request: UCX could not send at once, e.g. a full
 * shared-memory FIFO; the receives done at once: their eager message had arrived before them,
 * unexpected, which costs UCX a copy more; and the sends, receives and puts whose parameters
 * lack UCP_OP_ATTR_FLAG_MULTI_SEND, which UCX 1.22 weighs when it picks a protocol: perftest's
 * stream tests set it on every call, its ping-pongs on none), and adds up the time spent
 * inside each with the TSC (rdtsc before and after each call; the TSC rate is calibrated
 * against CLOCK_MONOTONIC over the process's life). At exit, a process that made at least
 * 1000 tag or put calls prints one line to stderr:
 *
 *   ucp-time: src%4096 OFF, dst%4096 OFF, N msgs, span MS ms, NS ns/msg: send NS ns/call
 *   (CALLS, REQ requests), recv NS ns/call (CALLS, DONE done at once), progress NS ns/call
 *   (CALLS, WORK with work, NS ns each, idle NS ns each) = NS ns/msg, rest NS ns/msg;
 *   put NS ns/call (CALLS); without the bandwidth flag: S sends, R receives, P puts;
 *   react NS ns (N), median NS ns, under 1 us NS ns (N)
 *
 * Where the process's UCX made CUDA driver calls (its CUDA transports link libcuda.so.1 and
 * call it directly), a second line follows with the calls a message of each function it
 * made, and the mean time inside one (a tool's own CUDA calls through dlsym'd pointers, as
 * rdma-bench's through cudarc, are not seen):
 *
 *   ucp-time-cuda: C calls/msg, NS ns/msg: cuCtxPushCurrent C/msg NS ns; ...
 *
 * and a third with where UCX issued its copies (inside which wrapped call), and its copies'
 * events: how many a record found still pending before it (several copies in flight on the
 * stream), the queries a message that found the work still running ("early"; each costs a
 * driver call, 1.3-1.7 us on the GPU host), how many of those ran in the progress call that
 * recorded the event, and each query's age of its event (since its record):
 *
 *   ucp-time-events: copies issued in progress N, in recv N, in send N, in put N, outside N;
 *   events recorded N, each behind P pending (most M, N not tracked); early queries Q/msg (N,
 *   N in the progress call that recorded the event), their event's age NS ns; ready queries
 *   N, their event's age NS ns
 *
 * span runs from the first wrapped call to the last one; "rest" is what the process spent
 * per message outside the four calls (its own loop, and the time between calls; for a
 * process whose setup makes wrapped calls, its setup too); src%4096 and dst%4096 are the
 * first send's and the first receive's buffer addresses modulo the page size. A progress
 * call "with work" returned non-zero (it handled an arrival or a completion), an idle one
 * returned 0: in a ping-pong the idle calls are the spin, and their time one turn of the
 * wait. "react" is the tool's own time on a ping-pong's path: from the end of a progress call
 * with work to the start of the next ucp_tag_send_nbx, averaged over the sends that had
 * such a call before them (what the tool's loop does between UCX handing it the message and
 * its answer; a receive it posts in between counts too). Its mean takes in the rare reacts
 * that span something else, such as the control exchange between a warm-up and the timed
 * loop (a few of them, 100 us each, added 20-30 ns to ours' client's mean of 22,000 at
 * 4 KiB, docs/measurements.md U179); the median and the mean of those under 1 us do not.
 * It takes no header: the four prototypes are spelled with void pointers, and the flag is
 * read from the first field of the parameters (ucp_request_param_t's uint32_t op_attr_mask,
 * the first field in 1.13 and 1.22), so it builds where UCX's headers are not installed (the
 * GPU host's wheel ships none of them):
 *
 *   cc -O2 -shared -fPIC -o ucp-time.so transport-ucx/ucp-time.c -ldl
 *   LD_PRELOAD=$PWD/ucp-time.so rdma-bench server ...   (and ucx_perftest ..., each side)
 *
 * Both tools pay the same two rdtsc per call. docs/measurements.md (U27-U30) has what it
 * showed: on the GPU host, ours' sender spends 1.6-1.8x perftest's time inside
 * ucp_tag_send_nbx at 4 KiB.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

typedef void *P;

static uint64_t c_prog, n_prog, w_prog, c_send, n_send, r_send, c_recv, n_recv, i_recv;
static uint64_t c_work, c_react, n_react, work_end;
/* Each react's TSC cycles, one bucket a cycle up to REACT_MAX; longer ones only counted. */
#define REACT_MAX 8192
static uint32_t react_at[REACT_MAX];
static uint64_t c_put, n_put, p_send, p_recv, p_put;
static uint64_t first, last;
/* Which wrapped UCP call the thread is inside (W_*), and progress calls so far: the CUDA
 * wrappers below tell where UCX issued each copy and how soon it queried the copy's event. */
enum { W_OUT, W_PROG, W_RECV, W_SEND, W_PUT, W_N };
static int where;
static uint64_t prog_seq;
static uintptr_t src0, dst0;
static struct timespec t0;

/* A returned pointer that is a request, not NULL (done) or an error status. */
#define IS_REQ(r) ((r) != NULL && (uintptr_t)(r) < (uintptr_t)-100)
/* UCP_OP_ATTR_FLAG_MULTI_SEND (ucp.h: UCS_BIT(19) in 1.13 and 1.22). */
#define MULTI_SEND (1u << 19)
/* The call's parameters lack the bandwidth flag. */
#define PLAIN(param) (param == NULL || !(*(const uint32_t *)(param) & MULTI_SEND))

static inline void mark(uint64_t t)
{
    if (first == 0) {
        first = t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    last = t;
}

unsigned ucp_worker_progress(P worker)
{
    static unsigned (*real)(P);
    if (real == NULL) real = (unsigned (*)(P))dlsym(RTLD_NEXT, "ucp_worker_progress");
    prog_seq++;
    where = W_PROG;
    uint64_t a = __rdtsc();
    unsigned r = real(worker);
    uint64_t b = __rdtsc();
    where = W_OUT;
    mark(a);
    c_prog += b - a;
    n_prog++;
    if (r != 0) {
        w_prog++;
        c_work += b - a;
        work_end = b;
    }
    return r;
}

P ucp_tag_send_nbx(P ep, const void *buf, size_t len, uint64_t tag, const void *param)
{
    static P (*real)(P, const void *, size_t, uint64_t, const void *);
    if (real == NULL)
        real = (P (*)(P, const void *, size_t, uint64_t, const void *))dlsym(RTLD_NEXT, "ucp_tag_send_nbx");
    where = W_SEND;
    uint64_t a = __rdtsc();
    P r = real(ep, buf, len, tag, param);
    uint64_t b = __rdtsc();
    where = W_OUT;
    mark(a);
    if (work_end != 0) {
        c_react += a - work_end;
        n_react++;
        if (a - work_end < REACT_MAX) react_at[a - work_end]++;
        work_end = 0;
    }
    c_send += b - a;
    if (n_send++ == 0) src0 = (uintptr_t)buf;
    if (IS_REQ(r)) r_send++;
    if (PLAIN(param)) p_send++;
    return r;
}

P ucp_tag_recv_nbx(P worker, void *buf, size_t len, uint64_t tag, uint64_t mask, const void *param)
{
    static P (*real)(P, void *, size_t, uint64_t, uint64_t, const void *);
    if (real == NULL)
        real = (P (*)(P, void *, size_t, uint64_t, uint64_t, const void *))dlsym(RTLD_NEXT, "ucp_tag_recv_nbx");
    where = W_RECV;
    uint64_t a = __rdtsc();
    P r = real(worker, buf, len, tag, mask, param);
    uint64_t b = __rdtsc();
    where = W_OUT;
    mark(a);
    c_recv += b - a;
    if (n_recv++ == 0) dst0 = (uintptr_t)buf;
    if (r == NULL) i_recv++;
    if (PLAIN(param)) p_recv++;
    return r;
}

P ucp_put_nbx(P ep, const void *buf, size_t len, uint64_t raddr, P rkey, const void *param)
{
    static P (*real)(P, const void *, size_t, uint64_t, P, const void *);
    if (real == NULL)
        real = (P (*)(P, const void *, size_t, uint64_t, P, const void *))dlsym(RTLD_NEXT, "ucp_put_nbx");
    where = W_PUT;
    uint64_t a = __rdtsc();
    P r = real(ep, buf, len, raddr, rkey, param);
    uint64_t b = __rdtsc();
    where = W_OUT;
    mark(a);
    c_put += b - a;
    n_put++;
    if (PLAIN(param)) p_put++;
    return r;
}

/* CUDA driver calls UCX makes (its CUDA transports link libcuda.so.1 and call it directly, so
 * a preloaded definition takes their calls; a tool's own calls through dlsym'd pointers, as
 * cudarc's, are not seen). Each wrapper forwards to libcuda's own function, found through the
 * handle of the libcuda already loaded (UCX loads its CUDA module, and so libcuda, as a local
 * dependency, where RTLD_NEXT does not reach), and counts the calls and the TSC cycles inside.
 * Counters are plain: the stream's calls come from the one thread that posts and polls. */
enum { CU_PUSH, CU_POP, CU_RETAIN, CU_RELEASE, CU_CURRENT, CU_ID, CU_STATE, CU_ATTR, CU_ATTRS,
       CU_RANGE, CU_COPY, CU_DTOD, CU_HTOD, CU_RECORD, CU_QUERY, CU_SYNC, CU_CALLBACK, CU_N };
static const char *const cu_name[CU_N] = {
    "cuCtxPushCurrent", "cuCtxPopCurrent", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
    "cuCtxGetCurrent", "cuCtxGetId", "cuDevicePrimaryCtxGetState", "cuPointerGetAttribute",
    "cuPointerGetAttributes", "cuMemGetAddressRange", "cuMemcpyAsync", "cuMemcpyDtoDAsync",
    "cuMemcpyHtoD", "cuEventRecord", "cuEventQuery", "cuStreamSynchronize", "cuStreamAddCallback"};
static uint64_t cu_n[CU_N], cu_c[CU_N];

static void *cu_real(const char *sym)
{
    static void *lib;
    void *f = NULL;
    if (lib == NULL) lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib != NULL) f = dlsym(lib, sym);
    if (f == NULL) f = dlsym(RTLD_NEXT, sym);
    if (f == NULL) {
        fprintf(stderr, "ucp-time: %s called, and no libcuda defines it\n", sym);
        abort();
    }
    return f;
}

/* The copies and their events, timed: where each copy was issued (W_*); each event recorded
 * (a copy's completion marker on its stream) with its TSC and the progress call it was
 * recorded in, and how many recorded before it were still pending then; each query of a
 * recorded event, "early" where it found the work still running (and "same" where that
 * query ran in the progress call that recorded the event), "ready" where it found it done
 * (the event then leaves the table), with the event's age. Up to EV_MAX events pending at
 * once are tracked; a query of an event not in the table is not counted here. */
#define EV_MAX 256
static struct { P event; uint64_t t, seq; } ev[EV_MAX];
static unsigned ev_n, ev_most;
static uint64_t copy_at[W_N], n_rec, c_behind, lost_rec;
static uint64_t q_early, q_same, c_early_age, q_ready, c_ready_age;

/* The pending entry of `event`, or ev_n. */
static unsigned ev_find(P event)
{
    unsigned i;
    for (i = 0; i < ev_n && ev[i].event != event; i++)
        ;
    return i;
}

/* `event` recorded at TSC t (an event recorded again while pending keeps its entry). */
static void on_record(P event, uint64_t t)
{
    unsigned i = ev_find(event);
    if (i == ev_n) {
        if (ev_n == EV_MAX) {
            lost_rec++;
            return;
        }
        ev_n++;
    }
    n_rec++;
    c_behind += ev_n - 1;
    if (ev_n - 1 > ev_most) ev_most = ev_n - 1;
    ev[i].event = event;
    ev[i].t = t;
    ev[i].seq = prog_seq;
}

/* `event` queried at TSC t; r: CUDA_SUCCESS (0), else CUDA_ERROR_NOT_READY. */
static void on_query(P event, int r, uint64_t t)
{
    unsigned i = ev_find(event);
    if (i == ev_n) return;
    if (r != 0) {
        q_early++;
        c_early_age += t - ev[i].t;
        if (where == W_PROG && prog_seq == ev[i].seq) q_same++;
    } else {
        q_ready++;
        c_ready_age += t - ev[i].t;
        ev[i] = ev[--ev_n];
    }
}

/* int SYM PARAMS, forwarding ARGS, counted under K; then AFTER, which may read the result r
 * and the TSC before (a) and after (b) the call. */
#define CU_WRAP_THEN(K, SYM, PARAMS, ARGS, AFTER)                           \
    int SYM PARAMS                                                          \
    {                                                                       \
        static int(*real) PARAMS;                                           \
        if (real == NULL) *(void **)&real = cu_real(#SYM);                  \
        uint64_t a = __rdtsc();                                             \
        int r = real ARGS;                                                  \
        uint64_t b = __rdtsc();                                             \
        cu_c[K] += b - a;                                                   \
        cu_n[K]++;                                                          \
        AFTER;                                                              \
        return r;                                                           \
    }
#define CU_WRAP(K, SYM, PARAMS, ARGS) CU_WRAP_THEN(K, SYM, PARAMS, ARGS, (void)0)
CU_WRAP(CU_PUSH, cuCtxPushCurrent_v2, (P ctx), (ctx))
CU_WRAP(CU_POP, cuCtxPopCurrent_v2, (P pctx), (pctx))
CU_WRAP(CU_RETAIN, cuDevicePrimaryCtxRetain, (P pctx, int dev), (pctx, dev))
CU_WRAP(CU_RELEASE, cuDevicePrimaryCtxRelease_v2, (int dev), (dev))
CU_WRAP(CU_CURRENT, cuCtxGetCurrent, (P pctx), (pctx))
CU_WRAP(CU_ID, cuCtxGetId, (P ctx, P id), (ctx, id))
CU_WRAP(CU_STATE, cuDevicePrimaryCtxGetState, (int dev, P flags, P active), (dev, flags, active))
CU_WRAP(CU_ATTR, cuPointerGetAttribute, (P data, int attr, uint64_t ptr), (data, attr, ptr))
CU_WRAP(CU_ATTRS, cuPointerGetAttributes, (unsigned n, P attrs, P data, uint64_t ptr),
        (n, attrs, data, ptr))
CU_WRAP(CU_RANGE, cuMemGetAddressRange_v2, (P base, P size, uint64_t ptr), (base, size, ptr))
CU_WRAP_THEN(CU_COPY, cuMemcpyAsync, (uint64_t dst, uint64_t src, size_t n, P stream),
             (dst, src, n, stream), copy_at[where]++)
CU_WRAP(CU_DTOD, cuMemcpyDtoDAsync_v2, (uint64_t dst, uint64_t src, size_t n, P stream),
        (dst, src, n, stream))
CU_WRAP(CU_HTOD, cuMemcpyHtoD_v2, (uint64_t dst, const void *src, size_t n), (dst, src, n))
CU_WRAP_THEN(CU_RECORD, cuEventRecord, (P event, P stream), (event, stream), on_record(event, b))
CU_WRAP_THEN(CU_QUERY, cuEventQuery, (P event), (event), on_query(event, r, a))
CU_WRAP(CU_SYNC, cuStreamSynchronize, (P stream), (stream))
CU_WRAP(CU_CALLBACK, cuStreamAddCallback, (P stream, P cb, P data, unsigned flags),
        (stream, cb, data, flags))

/* The median react and the mean of those under 1 us (ns), from react_at; -1 where none. */
static void react_typical(double ghz, double *median, double *mean, uint64_t *n)
{
    uint64_t under = (uint64_t)(ghz * 1000), seen = 0, sum = 0, counted = 0;
    if (under > REACT_MAX) under = REACT_MAX;
    *median = -1;
    for (uint64_t c = 0; c < REACT_MAX; c++) {
        seen += react_at[c];
        if (*median < 0 && 2 * seen > n_react) *median = c / ghz;
        if (c < under) sum += c * react_at[c], counted += react_at[c];
    }
    *mean = counted ? sum / ghz / counted : -1;
    *n = counted;
}

__attribute__((destructor)) static void report(void)
{
    struct timespec t1;
    if (n_send + n_recv + n_put < 1000) return;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    double ghz = (double)(__rdtsc() - first) / ns;
    double span = (last - first) / ghz;
    double r_median, r_mean;
    uint64_t r_n;
    react_typical(ghz, &r_median, &r_mean, &r_n);
    double msgs = n_send > n_recv ? n_send : n_recv;
    if (n_put > msgs) msgs = n_put;
    fprintf(stderr,
            "ucp-time: src%%4096 %lu, dst%%4096 %lu, %.0f msgs, span %.1f ms, %.1f ns/msg: send %.1f ns/call "
            "(%lu, %lu requests), recv %.1f ns/call (%lu, %lu done at once), progress %.1f ns/call "
            "(%lu, %lu with work, %.1f ns each, idle %.1f ns each) = %.1f ns/msg, rest %.1f ns/msg; "
            "put %.1f ns/call (%lu); without the bandwidth flag: %lu sends, %lu receives, %lu puts; "
            "react %.1f ns (%lu), median %.1f ns, under 1 us %.1f ns (%lu)\n",
            (unsigned long)(src0 & 4095), (unsigned long)(dst0 & 4095), msgs, span / 1e6, span / msgs,
            n_send ? c_send / ghz / n_send : 0, (unsigned long)n_send, (unsigned long)r_send,
            n_recv ? c_recv / ghz / n_recv : 0, (unsigned long)n_recv, (unsigned long)i_recv,
            n_prog ? c_prog / ghz / n_prog : 0, (unsigned long)n_prog, (unsigned long)w_prog,
            w_prog ? c_work / ghz / w_prog : 0,
            n_prog > w_prog ? (c_prog - c_work) / ghz / (n_prog - w_prog) : 0,
            c_prog / ghz / msgs, (span - (c_send + c_recv + c_prog + c_put) / ghz) / msgs,
            n_put ? c_put / ghz / n_put : 0, (unsigned long)n_put, (unsigned long)p_send,
            (unsigned long)p_recv, (unsigned long)p_put, n_react ? c_react / ghz / n_react : 0, (unsigned long)n_react,
            r_median, r_mean, (unsigned long)r_n);
    uint64_t calls = 0, cycles = 0;
    for (int k = 0; k < CU_N; k++) calls += cu_n[k], cycles += cu_c[k];
    if (calls == 0) return;
    fprintf(stderr, "ucp-time-cuda: %.2f calls/msg, %.1f ns/msg:", calls / msgs, cycles / ghz / msgs);
    for (int k = 0; k < CU_N; k++)
        if (cu_n[k] != 0)
            fprintf(stderr, " %s %.3f/msg %.0f ns;", cu_name[k], cu_n[k] / msgs, cu_c[k] / ghz / cu_n[k]);
    fputc('\n', stderr);
    fprintf(stderr,
            "ucp-time-events: copies issued in progress %lu, in recv %lu, in send %lu, in put %lu, "
            "outside %lu; events recorded %lu, each behind %.2f pending (most %u, %lu not tracked); "
            "early queries %.3f/msg (%lu, %lu in the progress call that recorded the event), "
            "their event's age %.0f ns; ready queries %lu, their event's age %.0f ns\n",
            (unsigned long)copy_at[W_PROG], (unsigned long)copy_at[W_RECV],
            (unsigned long)copy_at[W_SEND], (unsigned long)copy_at[W_PUT],
            (unsigned long)copy_at[W_OUT], (unsigned long)n_rec,
            n_rec ? (double)c_behind / n_rec : 0, ev_most, (unsigned long)lost_rec, q_early / msgs,
            (unsigned long)q_early, (unsigned long)q_same, q_early ? c_early_age / ghz / q_early : 0,
            (unsigned long)q_ready, q_ready ? c_ready_age / ghz / q_ready : 0);
}
