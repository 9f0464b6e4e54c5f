// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * A stand-in libcuda.so.1 for testing efa-sim's GPU code (gpu.c) where there is no GPU:
 * only the driver calls efa-sim and efa-sim-gpu make. Not CUDA: nothing else may load it.
 *
 * "Device memory" is a reserved range of the address space with no access (PROT_NONE), so
 * a simulator that touched it directly instead of through the copy calls would crash; its
 * bytes live in a second mapping that only the copies use. Copies on a stream (the *Async
 * calls) are queued and done at cuStreamSynchronize of that stream, never before, so a
 * simulator that completed an operation without synchronising its stream leaves the bytes
 * unwritten and efa-sim-gpu's check (a synchronous copy, which does not run other
 * streams' work, as with CU_STREAM_NON_BLOCKING streams) reads stale bytes. Copies need a
 * current context on the calling thread (CUDA_ERROR_INVALID_CONTEXT otherwise).
 *
 * Built into $(OUT)/fakecuda/libcuda.so.1; efa-sim/gpu.sh runs efa-sim-gpu against it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define OK 0
#define INVALID_VALUE 1
#define NOT_INITIALIZED 3
#define INVALID_CONTEXT 201

#define POOL (256ull << 20)
#define ALIGN (2ull << 20)

static uint8_t *dev_base;  /* the device range: no access */
static uint8_t *shadow;    /* its bytes */
static uint64_t next_off;
static bool inited;
static int fake_ctx = 1;
static __thread void *cur_ctx;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct alloc {
	uint64_t off, len;
};
static struct alloc allocs[4096];
static int nalloc;

struct op {
	struct op *next;
	bool to_dev;
	uint64_t dptr;
	void *host;
	size_t n;
};
struct stream {
	struct op *head, **tail;
};

static uint8_t *sh(CUdeviceptr p)
{
	return shadow + (p - (uintptr_t)dev_base);
}

static struct alloc *find(CUdeviceptr p)
{
	uint64_t off = p - (uintptr_t)dev_base;

	if (!dev_base || p < (uintptr_t)dev_base || off >= POOL)
		return NULL;
	for (int i = 0; i < nalloc; i++)
		if (off >= allocs[i].off && off < allocs[i].off + allocs[i].len)
			return &allocs[i];
	return NULL;
}

static bool in_range(CUdeviceptr p, size_t n)
{
	struct alloc *a = find(p);

	return a && p + n <= (uintptr_t)dev_base + a->off + a->len;
}

CUresult cuInit(unsigned flags)
{
	(void)flags;
	pthread_mutex_lock(&lock);
	if (!inited) {
		dev_base = mmap(NULL, POOL + ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		shadow = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		dev_base = (uint8_t *)(((uintptr_t)dev_base + ALIGN - 1) & ~(ALIGN - 1));
		inited = true;
	}
	pthread_mutex_unlock(&lock);
	return OK;
}

CUresult cuDeviceGet(int *dev, int ordinal)
{
	if (!inited)
		return NOT_INITIALIZED;
	if (ordinal != 0)
		return INVALID_VALUE;
	*dev = 0;
	return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
	(void)dev;
	*ctx = &fake_ctx;
	return inited ? OK : NOT_INITIALIZED;
}

CUresult cuCtxSetCurrent(void *ctx)
{
	cur_ctx = ctx;
	return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	CUresult r = OK;

	pthread_mutex_lock(&lock);
	if (!inited || !cur_ctx)
		r = inited ? INVALID_CONTEXT : NOT_INITIALIZED;
	else if (next_off + n > POOL || nalloc == 4096)
		r = 2; /* out of memory */
	else {
		allocs[nalloc++] = (struct alloc){ next_off, n };
		*p = (uintptr_t)dev_base + next_off;
		next_off = (next_off + n + ALIGN - 1) & ~(ALIGN - 1);
	}
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
	return find(p) ? OK : INVALID_VALUE;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n)
{
	if (!cur_ctx)
		return INVALID_CONTEXT;
	if (!in_range(p, n))
		return INVALID_VALUE;
	memset(sh(p), v, n);
	return OK;
}

CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr p, size_t n)
{
	if (!cur_ctx)
		return INVALID_CONTEXT;
	if (!in_range(p, n))
		return INVALID_VALUE;
	memcpy(h, sh(p), n);
	return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr p, const void *h, size_t n)
{
	if (!cur_ctx)
		return INVALID_CONTEXT;
	if (!in_range(p, n))
		return INVALID_VALUE;
	memcpy(sh(p), h, n);
	return OK;
}

CUresult cuStreamCreate(void **s, unsigned flags)
{
	struct stream *st;

	(void)flags;
	if (!cur_ctx)
		return INVALID_CONTEXT;
	st = calloc(1, sizeof(*st));
	st->tail = &st->head;
	*s = st;
	return OK;
}

static CUresult enqueue(void *s, bool to_dev, CUdeviceptr p, void *h, size_t n)
{
	struct stream *st = s;
	struct op *o;

	if (!cur_ctx)
		return INVALID_CONTEXT;
	if (!st || !in_range(p, n))
		return INVALID_VALUE;
	o = calloc(1, sizeof(*o));
	*o = (struct op){ NULL, to_dev, p, h, n };
	*st->tail = o;
	st->tail = &o->next;
	return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr p, const void *h, size_t n, void *s)
{
	return enqueue(s, true, p, (void *)h, n);
}

CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr p, size_t n, void *s)
{
	return enqueue(s, false, p, h, n);
}

CUresult cuStreamSynchronize(void *s)
{
	struct stream *st = s;
	struct op *o;

	if (!cur_ctx)
		return INVALID_CONTEXT;
	while ((o = st->head)) {
		if (o->to_dev)
			memcpy(sh(o->dptr), o->host, o->n);
		else
			memcpy(o->host, sh(o->dptr), o->n);
		st->head = o->next;
		free(o);
	}
	st->tail = &st->head;
	return OK;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	struct alloc *a;

	if (!inited)
		return NOT_INITIALIZED;
	a = find(p);
	if (!a)
		return INVALID_VALUE; /* not memory CUDA knows */
	switch (attr) {
	case 1: /* CONTEXT */
		*(void **)data = &fake_ctx;
		return OK;
	case 2: /* MEMORY_TYPE: device */
		*(unsigned *)data = 2;
		return OK;
	case 9: /* DEVICE_ORDINAL */
		*(int *)data = 0;
		return OK;
	case 11: /* RANGE_START_ADDR */
		*(CUdeviceptr *)data = (uintptr_t)dev_base + a->off;
		return OK;
	case 12: /* RANGE_SIZE */
		*(size_t *)data = a->len;
		return OK;
	}
	return INVALID_VALUE;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	struct alloc *a = find(p);

	if (!a)
		return INVALID_VALUE;
	*base = (uintptr_t)dev_base + a->off;
	*size = a->len;
	return OK;
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type,
				       unsigned long long flags)
{
	int fd;

	(void)flags;
	if (type != 1 || !in_range(p, n) || (p & 4095) || (n & 4095))
		return INVALID_VALUE;
	fd = memfd_create("fake-dmabuf", 0);
	if (fd < 0 || ftruncate(fd, (off_t)n))
		return 999;
	*(int *)handle = fd;
	return OK;
}

CUresult cuGetErrorString(CUresult r, const char **s)
{
	(void)r;
	*s = "fake CUDA error";
	return OK;
}
