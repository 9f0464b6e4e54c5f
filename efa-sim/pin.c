// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim: what registration does to memory, and the device's DMA into it.
 *
 * The kernel pins a region's pages at ibv_reg_mr (pin_user_pages: every page must be
 * mapped, and writable where the access asks for writes, or the call fails with EFAULT),
 * and the device then reads and writes those physical pages until ibv_dereg_mr, whatever
 * the process does to its own mapping meanwhile: memory freed while registered keeps
 * receiving the device's writes, invisibly, and a new mapping at the same address receives
 * nothing.
 *
 * A user-space process cannot pin its anonymous pages, so registration here moves them
 * onto memory it can keep: the whole pages inside the range are copied into a memfd that
 * is mapped over them (MAP_SHARED | MAP_FIXED, the same protection) and mapped a second
 * time for the device; pages that already are shared memory (a memfd this did earlier, a
 * shared file) get that second mapping with mremap(old_size = 0). The partial pages at the
 * ends of a range, which other data shares, and stacks stay as they are and are reached
 * through the process's mapping, with process_vm_readv/writev so that a page the process
 * unmapped fails the copy instead of crashing the device. Registration holds g_sim.dma_lock
 * for writing while it moves pages, so no DMA runs meanwhile; a thread of the process
 * writing into a range while another registers it could lose that write (not a pattern a
 * correct program has: the range's owner registers it).
 *
 * Moving costs a copy of the range's pages at registration, so it is done for the regions a
 * peer can reach (remote read or write access), where a peer's WRITE into freed memory is
 * the hazard; regions of local access only (the provider's own packet pools, receive and
 * send buffers) are checked the same way and reached through the mapping, crash-free.
 * EFA_SIM_PIN=0 (device file: pin 0) turns the moving off everywhere: the device then
 * follows the process's mapping, as the simulator did before.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sim.h"

#define PG 4096ull

/* Raw system calls: libfabric's memory monitor hooks the libc entry points of mmap and
 * friends and would see the pages moved here as the application unmapping its buffer. */
static void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static int raw_munmap(void *addr, size_t len)
{
	return (int)syscall(SYS_munmap, addr, len);
}

static void *raw_mremap_dup(void *addr, size_t len)
{
	return (void *)syscall(SYS_mremap, addr, (size_t)0, len, MREMAP_MAYMOVE);
}

struct vma {
	uint64_t lo, hi;
	int prot;
	bool shared, special, stack, huge;
};

/* The mappings of this process that meet [lo, hi), in address order. */
static int read_maps(uint64_t lo, uint64_t hi, struct vma **out)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	struct vma *v = NULL;
	int n = 0, cap = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long a, b;
		char perms[8] = "", path[4096] = "";
		struct vma *x;

		if (sscanf(line, "%llx-%llx %7s %*s %*s %*s %4095[^\n]", &a, &b, perms, path) < 3)
			continue;
		if (b <= lo)
			continue;
		if (a >= hi)
			break;
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			x = realloc(v, (size_t)cap * sizeof(*v));
			if (!x) {
				free(v);
				fclose(f);
				return -1;
			}
			v = x;
		}
		x = &v[n++];
		memset(x, 0, sizeof(*x));
		x->lo = a;
		x->hi = b;
		x->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			  (perms[2] == 'x' ? PROT_EXEC : 0);
		x->shared = perms[3] == 's';
		{
			const char *p = path;

			while (*p == ' ')
				p++;
			x->special = !strcmp(p, "[vvar]") || !strcmp(p, "[vdso]") ||
				     !strcmp(p, "[vsyscall]") || !strncmp(p, "[vvar_vclock]", 13);
			x->stack = !strncmp(p, "[stack", 6);
			x->huge = strstr(p, "anon_hugepage") || strstr(p, "/hugetlbfs") ||
				  strstr(p, "SYSV");
		}
	}
	fclose(f);
	*out = v;
	return n;
}

static int add_seg(struct sim_mr *mr, int *cap, uint64_t va, uint64_t len, uint8_t *pinned)
{
	if (!len)
		return 0;
	if (mr->nseg == *cap) {
		struct sim_seg *s = realloc(mr->seg, (size_t)(*cap ? 2 * *cap : 4) * sizeof(*s));

		if (!s)
			return ENOMEM;
		mr->seg = s;
		*cap = *cap ? 2 * *cap : 4;
	}
	mr->seg[mr->nseg].va = va;
	mr->seg[mr->nseg].len = len;
	mr->seg[mr->nseg].pinned = pinned;
	mr->nseg++;
	return 0;
}

/* Copy the pages of [lo, hi) that hold data (present or swapped: the others read as zero). */
static void copy_pages(uint8_t *dst, uint64_t lo, uint64_t hi)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t pg, ent[512];

	for (pg = lo; pg < hi;) {
		uint64_t n = (hi - pg) / PG, i;

		if (n > 512)
			n = 512;
		if (fd < 0 || pread(fd, ent, n * 8, (off_t)(pg / PG * 8)) != (ssize_t)(n * 8)) {
			memcpy(dst + (pg - lo), (void *)(uintptr_t)pg, n * PG);
		} else {
			for (i = 0; i < n; i++)
				if (ent[i] & (3ull << 62)) /* present or swapped */
					memcpy(dst + (pg - lo) + i * PG, (void *)(uintptr_t)(pg + i * PG), PG);
		}
		pg += n * PG;
	}
	if (fd >= 0)
		close(fd);
}

/* Move [lo, hi) (whole pages of one private mapping with protection `prot`) onto a memfd;
 * returns the device's mapping of it, or NULL (the range is then left as it was). */
static uint8_t *move_to_pinned(uint64_t lo, uint64_t hi, int prot)
{
	size_t n = hi - lo;
	uint8_t *dev;
	void *user;
	int fd = memfd_create("efa-sim-pinned", MFD_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)n)) {
		close(fd);
		return NULL;
	}
	dev = raw_mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (dev == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	copy_pages(dev, lo, hi);
	user = raw_mmap((void *)(uintptr_t)lo, n, prot, MAP_SHARED | MAP_FIXED, fd, 0);
	close(fd);
	if (user == MAP_FAILED) {
		raw_munmap(dev, n);
		return NULL;
	}
	atomic_fetch_add(&g_sim.st.pinned, n / PG);
	return dev;
}

int sim_pin(struct sim_mr *mr, void *addr, size_t len, bool write, bool remote)
{
	uint64_t a = (uintptr_t)addr, end = a + len, lo = a & ~(PG - 1);
	uint64_t hi = (end + PG - 1) & ~(PG - 1), at = lo;
	struct vma *v = NULL;
	int n, i, cap = 0, err = 0;

	mr->nseg = 0;
	mr->seg = NULL;
	if (!len)
		return 0;
	if (end < a)
		return EFAULT;
	n = read_maps(lo, hi, &v);
	if (n < 0)
		return errno ? errno : ENOMEM;
	/* As pin_user_pages: every page mapped, readable, writable if writes are asked for. */
	for (i = 0; i < n; i++) {
		if (v[i].lo > at || v[i].special || !(v[i].prot & PROT_READ) ||
		    (write && !(v[i].prot & PROT_WRITE)))
			break;
		at = v[i].hi;
	}
	if (i < n || at < hi) {
		free(v);
		return EFAULT;
	}
	pthread_rwlock_wrlock(&g_sim.dma_lock);
	for (i = 0; i < n && !err; i++) {
		uint64_t plo = v[i].lo > a ? v[i].lo : a, phi = v[i].hi < end ? v[i].hi : end;
		uint64_t ilo = (plo + PG - 1) & ~(PG - 1), ihi = phi & ~(PG - 1);
		uint8_t *pin = NULL;

		if (!g_sim.f.pin || !remote || v[i].stack || v[i].huge || ilo >= ihi) {
			err = add_seg(mr, &cap, plo, phi - plo, NULL);
			continue;
		}
		if (v[i].shared)
			pin = raw_mremap_dup((void *)(uintptr_t)ilo, ihi - ilo);
		else
			pin = move_to_pinned(ilo, ihi, v[i].prot);
		if (pin == MAP_FAILED)
			pin = NULL;
		if (!pin) {
			sim_log(1, "reg_mr: could not pin %#llx+%llu: the device follows the mapping there\n",
				(unsigned long long)ilo, (unsigned long long)(ihi - ilo));
			err = add_seg(mr, &cap, plo, phi - plo, NULL);
			continue;
		}
		err = add_seg(mr, &cap, plo, ilo - plo, NULL);
		if (!err)
			err = add_seg(mr, &cap, ilo, ihi - ilo, pin);
		else
			raw_munmap(pin, ihi - ilo);
		if (!err)
			err = add_seg(mr, &cap, ihi, phi - ihi, NULL);
	}
	pthread_rwlock_unlock(&g_sim.dma_lock);
	free(v);
	if (err)
		sim_unpin(mr);
	return err;
}

void sim_unpin(struct sim_mr *mr)
{
	int i;

	for (i = 0; i < mr->nseg; i++)
		if (mr->seg[i].pinned)
			raw_munmap(mr->seg[i].pinned, mr->seg[i].len);
	free(mr->seg);
	mr->seg = NULL;
	mr->nseg = 0;
}

/* The segment of `mr` holding va (whose range the caller checked). */
static struct sim_seg *seg_of(struct sim_mr *mr, uint64_t va)
{
	int i;

	for (i = 0; i < mr->nseg; i++)
		if (va >= mr->seg[i].va && va - mr->seg[i].va < mr->seg[i].len)
			return &mr->seg[i];
	return NULL;
}

static bool use_pvm = true;

void sim_dma_flush(struct sim_dma *d)
{
	ssize_t r;
	unsigned i;
	uint64_t want = 0;

	if (!d->n)
		return;
	for (i = 0; i < d->n; i++)
		want += d->r[i].iov_len;
	r = process_vm_writev(getpid(), d->l, d->n, d->r, d->n, 0);
	if (r < 0 && (errno == ENOSYS || errno == EPERM)) {
		if (use_pvm)
			sim_log(0, "process_vm_writev: %s: DMA into unmapped pages will crash\n",
				strerror(errno));
		use_pvm = false;
	}
	if (!use_pvm) {
		for (i = 0; i < d->n; i++) {
			memcpy(d->r[i].iov_base, d->l[i].iov_base, d->l[i].iov_len);
			__atomic_thread_fence(__ATOMIC_RELEASE); /* pieces land in order */
		}
		r = (ssize_t)want;
	}
	if (r < 0)
		r = 0;
	if ((uint64_t)r < want) {
		/* The process unmapped pages the region pinned: the device's writes there are
		 * lost to it, as they would be on pinned pages it no longer maps. */
		d->short_bytes += want - (uint64_t)r;
		atomic_fetch_add(&g_sim.st.dma_unmapped, want - (uint64_t)r);
	}
	d->n = 0;
}

void sim_dma_put(struct sim_dma *d, struct sim_mr *mr, uint64_t va, const uint8_t *src, uint64_t n)
{
	if (mr->gpu) { /* a CUDA copy, finished when it returns (gpu.c) */
		if (!sim_gpu_put(mr, va, src, n))
			d->bytes += n;
		return;
	}
	while (n) {
		struct sim_seg *s = seg_of(mr, va);
		uint64_t take;

		if (!s)
			return;
		take = s->len - (va - s->va);
		if (take > n)
			take = n;
		if (d->ordered) {
			/* Pieces end where a 128-byte block's last 8 bytes begin and where a
			 * block ends; they land in ascending order, each copy (or the kernel's
			 * copy of each iovec) finished before the next starts. */
			uint64_t off = va & 127, cut = off < 120 ? 120 - off : 128 - off;

			if (take > cut)
				take = cut;
		}
		if (s->pinned) {
			memcpy(s->pinned + (va - s->va), src, take);
			if (d->ordered)
				__atomic_thread_fence(__ATOMIC_RELEASE);
		} else {
			if (d->n == d->max)
				sim_dma_flush(d);
			d->l[d->n].iov_base = (void *)src;
			d->l[d->n].iov_len = take;
			d->r[d->n].iov_base = (void *)(uintptr_t)va;
			d->r[d->n].iov_len = take;
			d->n++;
		}
		d->bytes += take;
		va += take;
		src += take;
		n -= take;
	}
}

uint64_t sim_dma_get(struct sim_mr *mr, uint64_t va, uint8_t *dst, uint64_t n)
{
	uint64_t done = 0;

	if (mr->gpu) /* a CUDA copy, finished when it returns (gpu.c) */
		return sim_gpu_get(mr, va, dst, n) ? 0 : n;
	while (n) {
		struct sim_seg *s = seg_of(mr, va);
		uint64_t take;

		if (!s)
			break;
		take = s->len - (va - s->va);
		if (take > n)
			take = n;
		if (s->pinned) {
			memcpy(dst, s->pinned + (va - s->va), take);
		} else {
			struct iovec l = { dst, take }, r = { (void *)(uintptr_t)va, take };
			ssize_t got = use_pvm ? process_vm_readv(getpid(), &l, 1, &r, 1, 0) : -1;

			if (got < 0 && use_pvm && (errno == ENOSYS || errno == EPERM))
				use_pvm = false;
			if (!use_pvm) {
				memcpy(dst, (void *)(uintptr_t)va, take);
				got = (ssize_t)take;
			}
			if (got < (ssize_t)take) {
				/* pinned pages the process no longer maps: what they held is gone here */
				uint64_t miss = take - (uint64_t)(got > 0 ? got : 0);

				memset(dst + (got > 0 ? got : 0), 0, miss);
				atomic_fetch_add(&g_sim.st.dma_unmapped, miss);
			}
		}
		done += take;
		va += take;
		dst += take;
		n -= take;
	}
	return done;
}
