// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim: GPU memory. Registrations of CUDA device memory, by address (ibv_reg_mr on a
 * device pointer: what the efa provider does with FI_HMEM when dmabuf is off, and what
 * nvidia-peermem makes work on a p5) or as a dmabuf (ibv_reg_dmabuf_mr), and the device's
 * DMA into and out of them, done with CUDA copies.
 *
 * libcuda.so.1 is opened at run time (dlopen), never linked: the simulator builds and runs
 * where there is no CUDA. There, ibv_reg_dmabuf_mr fails with EOPNOTSUPP and says why on
 * stderr, and ibv_reg_mr sees no GPU memory (a process that has not loaded libcuda has
 * none), so host memory behaves exactly as before. ibv_reg_mr asks CUDA about a pointer
 * only when the process has loaded libcuda itself (dlopen with RTLD_NOLOAD): a process
 * without CUDA never loads the driver because of the simulator.
 *
 * The GPU address of a dmabuf region. The kernel maps a dmabuf through its exporter; a
 * user-space device cannot, so the simulator takes the address from the call: libfabric
 * 2.6.0's efa provider (prov/efa/src/efa_mr.c, efa_mr_reg_ibv_mr) passes as iova the
 * region's virtual address in both of its dmabuf paths: FI_MR_DMABUF (explicit, as
 * rdma-bench registers) passes base_addr + offset, base_addr being the dmabuf's
 * page-aligned base (fi_mr(3)); the implicit path (ofi_hmem_get_dmabuf_fd, then
 * ibv_reg_dmabuf_mr) passes iov_base, with the dmabuf exported from the page-aligned start
 * of the CUDA allocation and offset = iov_base - that start (src/hmem_cuda.c,
 * cuda_get_dmabuf_fd). The simulator checks what the kernel checks (offset + length within
 * the dmabuf's size, iova and offset at the same place in a page) and what its model needs:
 * the dmabuf then starts at iova - offset, a page boundary, and lies inside the CUDA
 * allocation that holds iova. A caller whose iova is not the address fails that check
 * (EINVAL, said on stderr) unless the wrong range happens to fit: on the hardware any iova
 * works, here the GPU address cannot be known otherwise.
 *
 * Visibility: every copy is issued on a stream of the simulator's own (one per thread and
 * context, non-blocking) and that stream is synchronised before the copy returns, so a
 * completion, written after the placement returned, comes after its bytes are in GPU
 * memory (and a sent packet holds what the GPU memory held when it left).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define PAGE_SZ 4096ull

/* The few CUDA driver types and values used (cuda.h is not needed to build). */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
#define CUDA_SUCCESS 0
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_MEMORYTYPE_DEVICE 2
#define CU_STREAM_NON_BLOCKING 1

static struct {
	pthread_once_t once;
	void *lib;
	char err[256];
	CUresult (*Init)(unsigned);
	CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*DeviceGet)(int *, int);
	CUresult (*PrimaryCtxRetain)(CUcontext *, int);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*GetErrorString)(CUresult, const char **);
} cu = { .once = PTHREAD_ONCE_INIT };

static void cu_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);

	if (!h) {
		const char *e = dlerror();

		snprintf(cu.err, sizeof(cu.err), "cannot load libcuda.so.1 (%s)", e ? e : "?");
		return;
	}
#define SYM(field, name)                                                                    \
	do {                                                                                \
		*(void **)&cu.field = dlsym(h, name);                                       \
		if (!cu.field) {                                                            \
			snprintf(cu.err, sizeof(cu.err), "libcuda.so.1 has no %s", name);   \
			return;                                                             \
		}                                                                           \
	} while (0)
	SYM(Init, "cuInit");
	SYM(PointerGetAttribute, "cuPointerGetAttribute");
	SYM(MemGetAddressRange, "cuMemGetAddressRange_v2");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(StreamCreate, "cuStreamCreate");
	SYM(StreamSynchronize, "cuStreamSynchronize");
	SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	SYM(GetErrorString, "cuGetErrorString");
#undef SYM
	CUresult r = cu.Init(0);
	if (r != CUDA_SUCCESS) {
		snprintf(cu.err, sizeof(cu.err), "cuInit failed (CUresult %d)", r);
		return;
	}
	cu.lib = h;
}

/* CUDA, loaded and initialised; NULL with the reason in *why otherwise. */
static bool cu_ready(const char **why)
{
	pthread_once(&cu.once, cu_load);
	if (!cu.lib && why)
		*why = cu.err;
	return cu.lib != NULL;
}

static const char *cu_str(CUresult r)
{
	const char *s = NULL;

	if (cu.GetErrorString && cu.GetErrorString(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA error";
}

/*
 * The allocation [*base, *base + *size) of device memory holding va, and its context; false
 * if va is not CUDA device memory.
 */
static bool cu_device_range(uint64_t va, CUdeviceptr *base, size_t *size, CUcontext *ctx)
{
	unsigned type = 0;
	int ordinal = -1, dev;

	if (cu.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE)
		return false;
	/*
	 * The context the copies run in: the allocation's, or (memory of no context: cuMemMap'd)
	 * the primary context of its GPU, retained for the process's life.
	 */
	if (cu.PointerGetAttribute(ctx, CU_POINTER_ATTRIBUTE_CONTEXT, va) != CUDA_SUCCESS)
		*ctx = NULL;
	if (!*ctx &&
	    (cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va) != CUDA_SUCCESS ||
	     cu.DeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
	     cu.PrimaryCtxRetain(ctx, dev) != CUDA_SUCCESS))
		return false;
	/* The allocation: by attribute (no current context needed), else the older call. */
	if (cu.PointerGetAttribute(base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va) == CUDA_SUCCESS &&
	    cu.PointerGetAttribute(size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, va) == CUDA_SUCCESS)
		return true;
	return cu.MemGetAddressRange(base, size, va) == CUDA_SUCCESS;
}

static int gpu_mr(struct sim_mr *mr, uint64_t va, size_t len, CUdeviceptr base, size_t size,
		  CUcontext ctx, const char *how)
{
	if (va + len > base + size) {
		fprintf(stderr,
			"efa-sim: %s of GPU memory %#llx+%zu refused (EFAULT): it runs past its "
			"CUDA allocation %#llx+%zu, as pinning would fail\n",
			how, (unsigned long long)va, len, base, size);
		return EFAULT;
	}
	mr->gpu = true;
	mr->cuctx = ctx;
	atomic_fetch_add(&g_sim.st.gpu_mrs, 1);
	if (!strcmp(how, "ibv_reg_dmabuf_mr"))
		atomic_fetch_add(&g_sim.st.gpu_dmabuf, 1);
	sim_log(2, "%s: GPU memory %#llx+%zu (allocation %#llx+%zu)\n", how,
		(unsigned long long)va, len, base, size);
	return 0;
}

int sim_gpu_reg_va(struct sim_mr *mr, uint64_t va, size_t len, bool *is_gpu)
{
	CUdeviceptr base;
	size_t size;
	CUcontext ctx;
	void *h;

	*is_gpu = false;
	/* A process that has not loaded libcuda has no GPU memory: leave the driver alone. */
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return 0;
	dlclose(h);
	if (!cu_ready(NULL) || !cu_device_range(va, &base, &size, &ctx))
		return 0;
	*is_gpu = true;
	return gpu_mr(mr, va, len, base, size, ctx, "ibv_reg_mr");
}

int sim_gpu_reg_dmabuf(struct sim_mr *mr, int fd, uint64_t offset, size_t len, uint64_t iova)
{
	const char *why = NULL;
	CUdeviceptr base;
	size_t size;
	CUcontext ctx;
	off_t dsize;

	if (!cu_ready(&why)) {
		fprintf(stderr,
			"efa-sim: ibv_reg_dmabuf_mr refused (EOPNOTSUPP): the simulator moves GPU "
			"memory with CUDA copies and %s\n", why);
		return EOPNOTSUPP;
	}
	/* The kernel's checks (ib_umem_dmabuf_get): the range inside the dmabuf. */
	dsize = lseek(fd, 0, SEEK_END);
	if (dsize < 0) {
		fprintf(stderr, "efa-sim: ibv_reg_dmabuf_mr: fd %d is not a dmabuf (%s)\n", fd,
			strerror(errno));
		return EBADF;
	}
	if (offset + len < offset || offset + len > (uint64_t)dsize ||
	    (iova & (PAGE_SZ - 1)) != (offset & (PAGE_SZ - 1))) {
		fprintf(stderr,
			"efa-sim: ibv_reg_dmabuf_mr refused (EINVAL): offset %llu + length %zu past "
			"the dmabuf's %lld bytes, or iova %#llx and offset at other places in a page\n",
			(unsigned long long)offset, len, (long long)dsize, (unsigned long long)iova);
		return EINVAL;
	}
	/*
	 * The model's: iova is the region's address, so the dmabuf starts at iova - offset, a
	 * page boundary, and lies inside the CUDA allocation that holds iova.
	 */
	uint64_t start = iova - offset;
	if (!cu_device_range(iova, &base, &size, &ctx) || (start & (PAGE_SZ - 1)) ||
	    start < (base & ~(PAGE_SZ - 1)) ||
	    start + (uint64_t)dsize > ((base + size + PAGE_SZ - 1) & ~(PAGE_SZ - 1))) {
		fprintf(stderr,
			"efa-sim: ibv_reg_dmabuf_mr refused (EINVAL): iova %#llx - offset %llu is not "
			"a page-aligned start of the dmabuf's %lld bytes inside the CUDA allocation "
			"holding iova; the simulator takes the GPU address from iova, as libfabric "
			"2.6.0's efa provider passes it (efa-sim/gpu.c)\n",
			(unsigned long long)iova, (unsigned long long)offset, (long long)dsize);
		return EINVAL;
	}
	return gpu_mr(mr, iova, len, base, size, ctx, "ibv_reg_dmabuf_mr");
}

/* The calling thread's stream in ctx (created once per thread and context). */
static CUstream gpu_stream(CUcontext ctx)
{
	static __thread CUcontext t_ctx;
	static __thread CUstream t_stream;
	static __thread bool t_have;
	CUresult r;

	if (cu.CtxSetCurrent(ctx) != CUDA_SUCCESS)
		return NULL;
	if (t_have && t_ctx == ctx)
		return t_stream;
	r = cu.StreamCreate(&t_stream, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "efa-sim: cuStreamCreate: %s\n", cu_str(r));
		t_have = false;
		return NULL;
	}
	t_ctx = ctx;
	t_have = true;
	return t_stream;
}

/* A copy into (to_gpu) or out of GPU memory at va, finished when this returns. */
static int gpu_copy(struct sim_mr *mr, uint64_t va, void *host, uint64_t n, bool to_gpu)
{
	CUstream s = gpu_stream(mr->cuctx);
	CUresult r;

	if (!s)
		return EIO;
	r = to_gpu ? cu.MemcpyHtoDAsync(va, host, n, s) : cu.MemcpyDtoHAsync(host, va, n, s);
	if (r == CUDA_SUCCESS)
		r = cu.StreamSynchronize(s);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "efa-sim: DMA %s GPU memory %#llx+%llu: %s\n", to_gpu ? "into" : "out of",
			(unsigned long long)va, (unsigned long long)n, cu_str(r));
		return EIO;
	}
	atomic_fetch_add(to_gpu ? &g_sim.st.gpu_put : &g_sim.st.gpu_get, n);
	return 0;
}

int sim_gpu_put(struct sim_mr *mr, uint64_t va, const uint8_t *src, uint64_t n)
{
	return gpu_copy(mr, va, (void *)src, n, true);
}

int sim_gpu_get(struct sim_mr *mr, uint64_t va, uint8_t *dst, uint64_t n)
{
	int err = gpu_copy(mr, va, dst, n, false);

	if (err)
		memset(dst, 0, n);
	return err;
}
