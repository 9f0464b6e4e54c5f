// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim-gpu: GPU memory on the simulated device, driven through rdma-core's API directly
 * (no libfabric), so that a failure of the provider's runs can be told from one of the
 * device's.
 *
 * Without CUDA (no libcuda.so.1): ibv_reg_dmabuf_mr must fail with EOPNOTSUPP, and host
 * memory must register and move as before. With CUDA (GPU 0): WRITEs from host memory into
 * GPU memory registered by address (ibv_reg_mr on a device pointer) and as a dmabuf
 * (ibv_reg_dmabuf_mr, the fd from cuMemGetHandleForAddressRange at the allocation's
 * page-aligned base, iova the region's address, as libfabric 2.6.0's efa provider passes
 * it), READs back out of GPU memory, a WRITE from GPU memory into GPU memory; every byte
 * checked with cuMemcpyDtoH right after the completion, on a stream of this program's own
 * (so the device's copies must have finished when it completed). A dmabuf whose iova is not
 * CUDA memory must be refused (EINVAL), and a registration past an allocation (EFAULT).
 *
 *   efa-sim-gpu          prints "efa-sim-gpu: PASS ..." lines, exit 0 when all held;
 *                        "efa-sim-gpu: no CUDA ..." and the no-CUDA checks where there is none
 *   efa-sim-gpu --require-cuda   exit 1 where there is no CUDA
 *
 * Run under ci/efa-sim.sh, or on the GPU host with the simulator on LD_LIBRARY_PATH and
 * SYSFS_PATH/EFA_SIM_DEVICES set (ci/gpu-efa-sim.sh run does).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#define QKEY 0x1234
#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*GetHandle)(void *, CUdeviceptr, size_t, int, unsigned long long);
} cu;

static int failures;

static void die(const char *what, int err)
{
	fprintf(stderr, "efa-sim-gpu: %s: %s\n", what, strerror(err));
	exit(2);
}

static void check(bool ok, const char *what)
{
	printf("efa-sim-gpu: %s %s\n", ok ? "PASS" : "FAIL", what);
	fflush(stdout);
	if (!ok)
		failures++;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	union ibv_gid gid;
	struct ibv_ah *ah;
	uint32_t peer_qpn;
};

static void side_open(struct side *s, struct ibv_device *dev)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN };
	struct efadv_qp_init_attr ea = { .driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD };
	struct ibv_qp_init_attr_ex qa = { 0 };
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

	memset(s, 0, sizeof(*s));
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("ibv_open_device", errno);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq_ex(s->ctx, &ca);
	if (!s->pd || !s->cq)
		die("ibv_alloc_pd/ibv_create_cq_ex", errno);
	qa.qp_type = IBV_QPT_DRIVER;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = s->pd;
	qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(s->cq);
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 64;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
	s->qp = efadv_create_qp_ex(s->ctx, &qa, &ea, sizeof(ea));
	if (!s->qp)
		die("efadv_create_qp_ex", errno);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("ibv_modify_qp INIT", errno);
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		die("ibv_modify_qp RTR", errno);
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("ibv_modify_qp RTS", errno);
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid", errno);
}

static void link_sides(struct side *a, struct side *b)
{
	struct ibv_ah_attr at = { .is_global = 1, .port_num = 1 };

	at.grh.dgid = b->gid;
	a->ah = ibv_create_ah(a->pd, &at);
	at.grh.dgid = a->gid;
	b->ah = ibv_create_ah(b->pd, &at);
	if (!a->ah || !b->ah)
		die("ibv_create_ah", errno);
	a->peer_qpn = b->qp->qp_num;
	b->peer_qpn = a->qp->qp_num;
}

/* One WRITE (or READ) of len bytes from local (lkey, laddr) to remote (rkey, raddr); the
 * completion's status, or -1 when none came within 10 s. */
static int rdma(struct side *a, bool read, uint32_t lkey, uint64_t laddr, uint32_t rkey,
		uint64_t raddr, uint32_t len)
{
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t end = now_ms() + 10000;
	int err, st;

	ibv_wr_start(a->qpx);
	a->qpx->wr_id = 7;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	if (read)
		ibv_wr_rdma_read(a->qpx, rkey, raddr);
	else
		ibv_wr_rdma_write(a->qpx, rkey, raddr);
	ibv_wr_set_sge(a->qpx, lkey, laddr, len);
	ibv_wr_set_ud_addr(a->qpx, a->ah, a->peer_qpn, QKEY);
	if ((err = ibv_wr_complete(a->qpx)))
		die("ibv_wr_complete", err);
	while ((err = ibv_start_poll(a->cq, &pa)) == ENOENT)
		if (now_ms() > end)
			return -1;
	if (err)
		die("ibv_start_poll", err);
	st = a->cq->status;
	ibv_end_poll(a->cq);
	return st;
}

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 7 + (i >> 9)) | 1;
}

static bool load_cuda(const char **why)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);

	if (!h) {
		*why = dlerror();
		return false;
	}
#define SYM(f, n)                                                            \
	if (!(*(void **)&cu.f = dlsym(h, n))) {                              \
		*why = "libcuda.so.1 lacks " n;                              \
		return false;                                                \
	}
	SYM(Init, "cuInit");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(MemAlloc, "cuMemAlloc_v2");
	SYM(MemFree, "cuMemFree_v2");
	SYM(MemsetD8, "cuMemsetD8_v2");
	SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
	SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
	SYM(GetHandle, "cuMemGetHandleForAddressRange");
#undef SYM
	return true;
}

/* The GPU bytes at d equal want (a DtoH copy of this program's own). */
static bool gpu_equals(CUdeviceptr d, const uint8_t *want, size_t len)
{
	uint8_t *got = malloc(len);
	bool ok;

	if (!got || cu.MemcpyDtoH(got, d, len))
		die("cuMemcpyDtoH", EIO);
	ok = !memcmp(got, want, len);
	free(got);
	return ok;
}

int main(int argc, char **argv)
{
	bool require = argc > 1 && !strcmp(argv[1], "--require-cuda");
	const size_t n = 1 << 20, len = n - 4096 - 100; /* many packets, not page aligned */
	struct ibv_device **devs;
	struct side a, b;
	const char *why = NULL;
	int ndev;
	uint8_t *src, *back;
	struct ibv_mr *hmr, *bmr;

	devs = ibv_get_device_list(&ndev);
	if (!devs || ndev < 2)
		die("fewer than two devices (run with the simulator)", ENODEV);
	side_open(&a, devs[0]);
	side_open(&b, devs[1]);
	link_sides(&a, &b);
	src = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	back = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || back == MAP_FAILED)
		die("mmap", errno);
	fill(src, n, 3);
	hmr = ibv_reg_mr(a.pd, src, n, ACC);
	bmr = ibv_reg_mr(a.pd, back, n, ACC);
	if (!hmr || !bmr)
		die("ibv_reg_mr (host)", errno);

	if (!load_cuda(&why)) {
		struct ibv_mr *tmr;
		int fd = memfd_create("not-a-gpu-dmabuf", 0);

		printf("efa-sim-gpu: no CUDA (%s)\n", why ? why : "?");
		if (fd < 0 || ftruncate(fd, 1 << 16))
			die("memfd", errno);
		errno = 0;
		tmr = ibv_reg_dmabuf_mr(b.pd, 0, 4096, 0x10000, fd, ACC);
		check(!tmr && errno == EOPNOTSUPP,
		      "without libcuda: ibv_reg_dmabuf_mr fails with EOPNOTSUPP");
		/* Host memory as before: a WRITE into a host region of the other side. */
		tmr = ibv_reg_mr(b.pd, back, n, ACC);
		if (!tmr)
			die("ibv_reg_mr", errno);
		memset(back, 0, n);
		check(rdma(&a, false, hmr->lkey, (uintptr_t)src + 100, tmr->rkey, (uintptr_t)back + 100,
			   (uint32_t)len) == IBV_WC_SUCCESS && !memcmp(back + 100, src + 100, len),
		      "without libcuda: host memory WRITE, every byte");
		return failures ? 1 : require ? 1 : 0;
	}

	/* GPU 0, its primary context (as rdma-bench and the provider use). */
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr g, g2;
	if (cu.Init(0) || cu.DeviceGet(&dev, 0) || cu.PrimaryCtxRetain(&ctx, dev) ||
	    cu.CtxSetCurrent(ctx) || cu.MemAlloc(&g, n) || cu.MemAlloc(&g2, n))
		die("CUDA set-up (GPU 0)", EIO);
	cu.MemsetD8(g, 0, n);
	cu.MemsetD8(g2, 0, n);

	/* 1. By address: host -> GPU WRITE, GPU -> host READ, GPU -> GPU WRITE. */
	struct ibv_mr *gmr = ibv_reg_mr(b.pd, (void *)(uintptr_t)g, n, ACC);
	check(gmr != NULL, "ibv_reg_mr on a CUDA device pointer");
	if (gmr) {
		int st = rdma(&a, false, hmr->lkey, (uintptr_t)src + 100, gmr->rkey, g + 100,
			      (uint32_t)len);
		check(st == IBV_WC_SUCCESS && gpu_equals(g + 100, src + 100, len),
		      "WRITE host -> GPU (by address): completed, every byte in GPU memory");
		memset(back, 0, n);
		st = rdma(&a, true, bmr->lkey, (uintptr_t)back + 5, gmr->rkey, g + 100, (uint32_t)len);
		check(st == IBV_WC_SUCCESS && !memcmp(back + 5, src + 100, len),
		      "READ GPU -> host (by address): every byte");
		struct ibv_mr *smr = ibv_reg_mr(a.pd, (void *)(uintptr_t)g, n, ACC);
		struct ibv_mr *dmr = ibv_reg_mr(b.pd, (void *)(uintptr_t)g2, n, ACC);
		st = smr && dmr ? rdma(&a, false, smr->lkey, g + 100, dmr->rkey, g2 + 300, (uint32_t)len)
				: -2;
		check(st == IBV_WC_SUCCESS && gpu_equals(g2 + 300, src + 100, len),
		      "WRITE GPU -> GPU (by address): every byte");
		errno = 0;
		/* past any rounding of the allocation's size (2 MiB granularity) */
		check(!ibv_reg_mr(b.pd, (void *)(uintptr_t)(g + 4096), n + (2u << 20), ACC) &&
			      errno == EFAULT,
		      "ibv_reg_mr past the end of a CUDA allocation: EFAULT");
		if (smr)
			ibv_dereg_mr(smr);
		if (dmr)
			ibv_dereg_mr(dmr);
		ibv_dereg_mr(gmr);
	}

	/* 2. As a dmabuf: the fd of the allocation's page-aligned base, iova the address. */
	int fd = -1;
	CUresult r = cu.GetHandle(&fd, g, n, 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */, 0);
	if (r) {
		printf("efa-sim-gpu: SKIPPED dmabuf: cuMemGetHandleForAddressRange: CUresult %d "
		       "(the driver exports no dmabuf)\n", r);
	} else {
		uint64_t off = 4096 + 64;
		struct ibv_mr *dmr = ibv_reg_dmabuf_mr(b.pd, off, n - off, g + off, fd, ACC);

		check(dmr != NULL, "ibv_reg_dmabuf_mr (offset 4160, iova = address)");
		if (dmr) {
			cu.MemsetD8(g, 0, n);
			int st = rdma(&a, false, hmr->lkey, (uintptr_t)src, dmr->rkey, g + off + 36,
				      (uint32_t)(n - off - 36));
			check(st == IBV_WC_SUCCESS && gpu_equals(g + off + 36, src, n - off - 36),
			      "WRITE host -> GPU (dmabuf): every byte in GPU memory");
			memset(back, 0, n);
			st = rdma(&a, true, bmr->lkey, (uintptr_t)back, dmr->rkey, g + off + 36,
				  (uint32_t)(n - off - 36));
			check(st == IBV_WC_SUCCESS && !memcmp(back, src, n - off - 36),
			      "READ GPU -> host (dmabuf): every byte");
			ibv_dereg_mr(dmr);
		}
		errno = 0;
		check(!ibv_reg_dmabuf_mr(b.pd, off, 4096, (uintptr_t)src + off, fd, ACC) &&
			      errno == EINVAL,
		      "ibv_reg_dmabuf_mr with an iova that is not CUDA memory: EINVAL");
		close(fd);
	}
	cu.MemFree(g);
	cu.MemFree(g2);
	printf("efa-sim-gpu: %s\n", failures ? "FAILED" : "all passed");
	return failures ? 1 : 0;
}
