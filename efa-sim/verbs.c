// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim: the verbs objects. Protection domains, memory regions, address handles,
 * completion queues (the ibv_cq_ex and efadv_cq function pointers) and queue pairs (the
 * ibv_qp_ex work-request pointers), filled the way rdma-core's efa provider fills them.
 *
 * One file, as the efa provider keeps them in one (providers/efa/verbs.c): these are the
 * objects of one context, created, looked up and destroyed against each other under its
 * locks (ibv_destroy_qp purges the QP's entries from its CQs), the ibv_cq_ex readers share
 * the CQ cursor with ibv_poll_cq, and ibv_post_send is built from the static ibv_qp_ex
 * work-request functions.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

/* ---- protection domains ---- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct sim_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->pd.context = c;
	return &pd->pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

/* ---- memory regions ---- */

/*
 * Keys. The device hands out keys of its own, the same for every process that opens it, so
 * a key means one region of one process at a time. Here each device has a counter shared
 * by the processes of the fabric (sim_next_key, device.c), and a key is a fixed bijection
 * of it seeded by the fabric: keys look random, never repeat within a fabric, and a
 * region's key says nothing of where it sits in its process's table.
 *
 * The table is open addressing by key; MR_TOMB marks a slot whose region was deregistered.
 */
#define MR_TOMB ((struct sim_mr *)1)

static uint32_t mr_hash(uint32_t key, uint32_t cap)
{
	return (key * 0x9e3779b1u) & (cap - 1);
}

/*
 * The live region `key` of this context, or NULL. With `pd`, a region of another
 * protection domain is no region either: the device checks the key's PD against the QP's
 * on every access.
 */
struct sim_mr *sim_mr_lookup_locked(struct sim_ctx *ctx, uint32_t key, struct ibv_pd *pd)
{
	uint32_t i, n;

	if (!ctx->mrs_cap)
		goto none;
	for (i = mr_hash(key, ctx->mrs_cap), n = 0; n < ctx->mrs_cap; i = (i + 1) & (ctx->mrs_cap - 1), n++) {
		struct sim_mr *mr = ctx->mrs[i];

		if (!mr)
			break;
		if (mr != MR_TOMB && mr->mr.lkey == key) {
			if (pd && mr->mr.pd != pd) {
				atomic_fetch_add(&g_sim.st.pd_mismatch, 1);
				goto none;
			}
			return mr;
		}
	}
none:
	atomic_fetch_add(&g_sim.st.bad_key, 1);
	return NULL;
}

/* Insert under mr_lock (write); grows the table at half full. */
static int mr_insert(struct sim_ctx *ctx, struct sim_mr *mr)
{
	uint32_t i;

	if (2 * (ctx->mrs_used + 1) > ctx->mrs_cap) {
		uint32_t cap = 64, old = ctx->mrs_cap, j;
		struct sim_mr **t, **o = ctx->mrs;

		while (4 * (ctx->nmr + 1) > cap)
			cap *= 2;
		t = calloc(cap, sizeof(*t));
		if (!t)
			return ENOMEM;
		for (j = 0; j < old; j++)
			if (o[j] && o[j] != MR_TOMB) {
				for (i = mr_hash(o[j]->mr.lkey, cap); t[i]; i = (i + 1) & (cap - 1))
					;
				t[i] = o[j];
			}
		free(o);
		ctx->mrs = t;
		ctx->mrs_cap = cap;
		ctx->mrs_used = ctx->nmr;
	}
	for (i = mr_hash(mr->mr.lkey, ctx->mrs_cap); ctx->mrs[i] && ctx->mrs[i] != MR_TOMB;
	     i = (i + 1) & (ctx->mrs_cap - 1))
		;
	if (!ctx->mrs[i])
		ctx->mrs_used++;
	ctx->mrs[i] = mr;
	ctx->nmr++;
	return 0;
}

static void mr_remove(struct sim_ctx *ctx, struct sim_mr *mr)
{
	uint32_t i, n;

	for (i = mr_hash(mr->mr.lkey, ctx->mrs_cap), n = 0; n < ctx->mrs_cap && ctx->mrs[i];
	     i = (i + 1) & (ctx->mrs_cap - 1), n++)
		if (ctx->mrs[i] == mr) {
			ctx->mrs[i] = MR_TOMB;
			ctx->nmr--;
			return;
		}
}

/* A dmabuf to register instead of addr (ibv_reg_dmabuf_mr), or fd -1. */
struct dmabuf_arg {
	int fd;
	uint64_t offset;
};

static struct ibv_mr *reg_mr_any(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				 unsigned access, const struct dmabuf_arg *dmabuf)
{
	struct sim_ctx *ctx = to_ctx(pd->context);
	unsigned supported = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	struct sim_mr *mr;
	bool gpu = false;
	int err;

	if (ctx->dev->a.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE)
		supported |= IBV_ACCESS_REMOTE_WRITE;
	access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE; /* optional flags may be ignored */
	/* The core's checks first (EINVAL), then what the efa driver supports (EOPNOTSUPP). */
	if (((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
	    len > ctx->dev->a.max_mr_size || (!addr && len && !dmabuf)) {
		errno = EINVAL;
		return NULL;
	}
	if (access & ~supported) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	if (dmabuf) {
		/* GPU memory as a dmabuf: its address is iova (gpu.c says why). */
		err = sim_gpu_reg_dmabuf(mr, dmabuf->fd, dmabuf->offset, len, iova);
		addr = (void *)(uintptr_t)iova;
	} else {
		/* GPU memory by address (nvidia-peermem's path), else host memory. */
		err = sim_gpu_reg_va(mr, (uintptr_t)addr, len, &gpu);
		/* As the kernel: pin the pages, writable ones where the access asks for writes. */
		if (!err && !gpu)
			err = sim_pin(mr, addr, len,
				      access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
				      access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
	}
	if (err) {
		sim_log(1, "reg_mr %p+%zu refused: %s\n", addr, len, strerror(err));
		free(mr);
		errno = err;
		return NULL;
	}
	mr->mr.context = pd->context;
	mr->mr.pd = pd;
	mr->mr.addr = addr;
	mr->mr.length = len;
	mr->mr.lkey = mr->mr.rkey = sim_next_key(ctx->dev);
	mr->mr.handle = mr->mr.lkey;
	mr->iova = iova;
	mr->access = (int)access;
	pthread_rwlock_wrlock(&ctx->mr_lock);
	err = ctx->nmr >= (uint32_t)ctx->dev->a.max_mr ? ENOMEM : mr_insert(ctx, mr);
	pthread_rwlock_unlock(&ctx->mr_lock);
	if (err) {
		sim_unpin(mr);
		free(mr);
		errno = err;
		return NULL;
	}
	sim_log(3, "reg_mr %p+%zu key %#x access %#x%s\n", addr, len, mr->mr.lkey, access,
		mr->gpu ? " (GPU memory)" : "");
	return &mr->mr;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
			     unsigned access)
{
	return reg_mr_any(pd, addr, len, iova, access, NULL);
}

#undef ibv_reg_mr
#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
			       int access);

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return reg_mr(pd, addr, len, (uintptr_t)addr, (unsigned)access);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
			       int access)
{
	return reg_mr(pd, addr, len, iova, (unsigned)access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				unsigned int access)
{
	return reg_mr(pd, addr, len, iova, access);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				 int fd, int access)
{
	struct dmabuf_arg d = { .fd = fd, .offset = offset };

	return reg_mr_any(pd, NULL, len, iova, (unsigned)access, &d);
}

int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct sim_ctx *ctx = to_ctx(ibmr->context);
	struct sim_mr *mr = (struct sim_mr *)ibmr;

	/* Waits for any copy in progress into or out of this region; its key is never reused. */
	pthread_rwlock_wrlock(&ctx->mr_lock);
	mr_remove(ctx, mr);
	pthread_rwlock_unlock(&ctx->mr_lock);
	sim_unpin(mr);
	free(mr);
	return 0;
}

int efasim_query_mr(struct ibv_mr *mr, struct efadv_mr_attr *attr, uint32_t inlen)
{
	(void)mr;
	if (inlen < offsetof(struct efadv_mr_attr, rdma_recv_ic_id) + sizeof(attr->rdma_recv_ic_id))
		return EINVAL;
	memset(attr, 0, inlen); /* no interconnect ids are known */
	return 0;
}

/* ---- address handles ---- */

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct sim_ctx *ctx = to_ctx(pd->context);
	struct sim_ah *ah;
	uint32_t i;

	if (!attr->is_global || attr->port_num != 1) {
		errno = EINVAL;
		return NULL;
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->gid = attr->grh.dgid;
	pthread_mutex_lock(&ctx->ah_lock);
	for (i = 0; i < ctx->nah; i++)
		if (!ctx->ahs[i])
			break;
	if (i == ctx->nah) {
		struct sim_ah **a;

		if (ctx->nah >= (uint32_t)ctx->dev->a.max_ah || ctx->nah >= 0xfffe) {
			pthread_mutex_unlock(&ctx->ah_lock);
			free(ah);
			errno = ENOMEM;
			return NULL;
		}
		a = realloc(ctx->ahs, (ctx->nah + 16) * sizeof(*a));
		if (!a) {
			pthread_mutex_unlock(&ctx->ah_lock);
			free(ah);
			errno = ENOMEM;
			return NULL;
		}
		memset(a + ctx->nah, 0, 16 * sizeof(*a));
		ctx->ahs = a;
		ctx->nah += 16;
	}
	ah->ahn = (uint16_t)(i + 1);
	ah->ah.handle = i;
	ctx->ahs[i] = ah;
	pthread_mutex_unlock(&ctx->ah_lock);
	return &ah->ah;
}

int ibv_destroy_ah(struct ibv_ah *ibah)
{
	struct sim_ctx *ctx = to_ctx(ibah->context);
	struct sim_ah *ah = (struct sim_ah *)ibah;

	pthread_mutex_lock(&ctx->ah_lock);
	ctx->ahs[ah->ahn - 1] = NULL;
	pthread_mutex_unlock(&ctx->ah_lock);
	free(ah);
	return 0;
}

int efasim_query_ah(struct ibv_ah *ah, struct efadv_ah_attr *attr, uint32_t inlen)
{
	if (inlen < offsetof(struct efadv_ah_attr, ahn) + sizeof(attr->ahn))
		return EINVAL;
	memset(attr, 0, inlen);
	attr->ahn = ((struct sim_ah *)ah)->ahn;
	return 0;
}

/*
 * The number of the address handle that protection domain `pd` has for a GID, or 0xffff:
 * what a receive completion reports as `slid` (each PD, so each libfabric domain, has its
 * own handles, and the provider finds the sender by its own handle's number).
 */
int sim_ah_for_gid(struct sim_ctx *ctx, const union ibv_gid *gid, struct ibv_pd *pd)
{
	int ahn = 0xffff;
	uint32_t i;

	pthread_mutex_lock(&ctx->ah_lock);
	for (i = 0; i < ctx->nah; i++)
		if (ctx->ahs[i] && ctx->ahs[i]->ah.pd == pd &&
		    !memcmp(&ctx->ahs[i]->gid, gid, sizeof(*gid))) {
			ahn = ctx->ahs[i]->ahn;
			break;
		}
	pthread_mutex_unlock(&ctx->ah_lock);
	return ahn;
}

/* ---- completion queues ---- */

static inline struct sim_cq *to_cq(struct ibv_cq_ex *ex)
{
	return (struct sim_cq *)ex;
}

/*
 * The ring is the device's: a completion goes at producer index `prod` with a phase bit
 * that flips every lap, and the reader takes the entry at `cons` only while its phase is
 * the one expected for this lap (rdma-core's efa_sub_cq). Nothing stops the device when
 * the ring is full: a completion then overwrites one not yet polled, the completions in
 * between are lost, and the reader may stall on a phase it never sees (sim_cq_push counts
 * the overruns).
 */
static inline struct sim_cqe *cur(struct sim_cq *cq)
{
	return &cq->ring[cq->cons & (cq->cap - 1)];
}

static bool cq_ready(struct sim_cq *cq)
{
	return cur(cq)->phase == (((cq->cons / cq->cap) & 1) ^ 1);
}

static void release_cur(struct sim_cq *cq)
{
	struct sim_cqe *e = cur(cq);

	if (!e->recv && cq->cur_qp)
		atomic_fetch_sub(&cq->cur_qp->sq_outstanding, 1);
	cq->cons++;
	cq->have_cur = false;
}

/*
 * The QP of the completion at the reader, as rdma-core finds it in its QP table. A
 * destroyed QP's completion (one it left unpolled, or one the device flushed) is not
 * found: rdma-core then consumes it and fails the poll with EINVAL ("QP[n] does not exist
 * in QP table") while some QP still uses the CQ, and skips the CQ (ENOENT) once none does.
 */
static int cq_find_qp(struct sim_cq *cq)
{
	struct sim_cqe *e = cur(cq);

	cq->cur_qp = sim_qp_by_num(cq->ctx, e->qp_num);
	if (cq->cur_qp)
		return 0;
	if (!cq->nqp)
		return ENOENT;
	atomic_fetch_add(&g_sim.st.stale_cqe, 1);
	sim_log(1, "CQ: a completion of QP %u, which no longer exists: the poll fails (EINVAL)\n",
		e->qp_num);
	cq->cons++;
	return EINVAL;
}

static void load_cur(struct sim_cq *cq)
{
	struct sim_cqe *e = cur(cq);

	cq->ex.wr_id = e->wr_id;
	cq->ex.status = e->status == ST_OK ? IBV_WC_SUCCESS
		      : e->status == ST_FLUSHED ? IBV_WC_WR_FLUSH_ERR
		      : (e->status == ST_LOCAL_QP_INTERNAL || e->status == ST_LOCAL_UNSUPPORTED_OP ||
			 e->status == ST_LOCAL_INVALID_AH) ? IBV_WC_LOC_QP_OP_ERR
		      : e->status == ST_LOCAL_INVALID_LKEY ? IBV_WC_LOC_PROT_ERR
		      : e->status == ST_LOCAL_BAD_LENGTH ? IBV_WC_LOC_LEN_ERR
		      : e->status == ST_REMOTE_ABORT ? IBV_WC_REM_ABORT_ERR
		      : e->status == ST_REMOTE_RNR ? IBV_WC_RNR_RETRY_EXC_ERR
		      : e->status == ST_REMOTE_BAD_DEST_QPN ? IBV_WC_REM_INV_RD_REQ_ERR
		      : e->status == ST_REMOTE_BAD_STATUS ? IBV_WC_BAD_RESP_ERR
		      : e->status == ST_REMOTE_BAD_LENGTH ? IBV_WC_REM_INV_REQ_ERR
		      : (e->status == ST_LOCAL_UNRESP_REMOTE || e->status == ST_LOCAL_UNREACH_REMOTE)
				? IBV_WC_RESP_TIMEOUT_ERR
		      : e->status == ST_REMOTE_BAD_ADDRESS ? IBV_WC_REM_ACCESS_ERR
		      : e->status == ST_REMOTE_UNKNOWN_PEER ? IBV_WC_REM_OP_ERR
							    : IBV_WC_GENERAL_ERR;
	cq->have_cur = true;
}

static int cq_start_poll(struct ibv_cq_ex *ex, struct ibv_poll_cq_attr *attr)
{
	struct sim_cq *cq = to_cq(ex);
	int err;

	if (attr->comp_mask)
		return EINVAL;
	pthread_mutex_lock(&cq->lock);
	if (!cq_ready(cq)) {
		pthread_mutex_unlock(&cq->lock);
		/* Nothing yet: let the progress engines run (this box may have few cores). */
		sched_yield();
		return ENOENT;
	}
	err = cq_find_qp(cq);
	if (err) {
		pthread_mutex_unlock(&cq->lock);
		return err;
	}
	load_cur(cq);
	return 0;
}

static int cq_next_poll(struct ibv_cq_ex *ex)
{
	struct sim_cq *cq = to_cq(ex);
	int err;

	if (cq->have_cur)
		release_cur(cq);
	if (!cq_ready(cq))
		return ENOENT;
	err = cq_find_qp(cq);
	if (err)
		return err;
	load_cur(cq);
	return 0;
}

static void cq_end_poll(struct ibv_cq_ex *ex)
{
	struct sim_cq *cq = to_cq(ex);

	if (cq->have_cur)
		release_cur(cq);
	pthread_mutex_unlock(&cq->lock);
}

static enum ibv_wc_opcode cq_read_opcode(struct ibv_cq_ex *ex)
{
	return (enum ibv_wc_opcode)cur(to_cq(ex))->opcode;
}

static uint32_t cq_read_vendor_err(struct ibv_cq_ex *ex)
{
	return cur(to_cq(ex))->status;
}

static unsigned int cq_read_wc_flags(struct ibv_cq_ex *ex)
{
	return cur(to_cq(ex))->has_imm ? IBV_WC_WITH_IMM : 0;
}

static uint32_t cq_read_byte_len(struct ibv_cq_ex *ex)
{
	struct sim_cqe *e = cur(to_cq(ex));

	return e->recv ? e->byte_len : 0;
}

static __be32 cq_read_imm_data(struct ibv_cq_ex *ex)
{
	return htobe32(cur(to_cq(ex))->imm);
}

static uint32_t cq_read_qp_num(struct ibv_cq_ex *ex)
{
	return cur(to_cq(ex))->qp_num;
}

static uint32_t cq_read_src_qp(struct ibv_cq_ex *ex)
{
	return cur(to_cq(ex))->src_qp;
}

static uint32_t cq_read_slid(struct ibv_cq_ex *ex)
{
	return cur(to_cq(ex))->slid;
}

static uint8_t cq_read_zero8(struct ibv_cq_ex *ex)
{
	(void)ex;
	return 0;
}

static int cq_read_sgid(struct efadv_cq *dv, union ibv_gid *sgid)
{
	struct sim_cq *cq = (struct sim_cq *)((char *)dv - offsetof(struct sim_cq, dv));
	struct sim_cqe *e = cur(cq);

	if (e->slid != 0xffff)
		return -ENOENT; /* only available when the sender's AH is unknown here */
	*sgid = e->sgid;
	return 0;
}

static bool cq_is_unsolicited(struct efadv_cq *dv)
{
	struct sim_cq *cq = (struct sim_cq *)((char *)dv - offsetof(struct sim_cq, dv));

	return cur(cq)->unsolicited;
}

static struct ibv_cq_ex *create_cq(struct ibv_context *c, struct ibv_cq_init_attr_ex *attr,
				   struct efadv_cq_init_attr *efa_attr)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_cq *cq;
	uint32_t cap = 1;

	if (attr->comp_mask || (attr->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS) ||
	    attr->cqe > (uint32_t)ctx->dev->a.max_cqe) {
		errno = attr->cqe > (uint32_t)ctx->dev->a.max_cqe ? EINVAL : EOPNOTSUPP;
		return NULL;
	}
	while (cap < attr->cqe) /* rdma-core rounds up to a power of two */
		cap <<= 1;
	cq = calloc(1, sizeof(*cq));
	if (!cq || !(cq->ring = calloc(cap, sizeof(*cq->ring)))) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->cap = cap;
	cq->ctx = ctx;
	cq->ex.context = c;
	cq->ex.channel = attr->channel;
	cq->ex.cq_context = attr->cq_context;
	cq->ex.cqe = (int)cap;
	pthread_mutex_init(&cq->ex.mutex, NULL);
	pthread_cond_init(&cq->ex.cond, NULL);
	pthread_mutex_init(&cq->lock, NULL);
	cq->ex.start_poll = cq_start_poll;
	cq->ex.next_poll = cq_next_poll;
	cq->ex.end_poll = cq_end_poll;
	cq->ex.read_opcode = cq_read_opcode;
	cq->ex.read_vendor_err = cq_read_vendor_err;
	cq->ex.read_wc_flags = cq_read_wc_flags;
	if (attr->wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		cq->ex.read_byte_len = cq_read_byte_len;
	if (attr->wc_flags & IBV_WC_EX_WITH_IMM)
		cq->ex.read_imm_data = cq_read_imm_data;
	if (attr->wc_flags & IBV_WC_EX_WITH_QP_NUM)
		cq->ex.read_qp_num = cq_read_qp_num;
	if (attr->wc_flags & IBV_WC_EX_WITH_SRC_QP)
		cq->ex.read_src_qp = cq_read_src_qp;
	if (attr->wc_flags & IBV_WC_EX_WITH_SLID)
		cq->ex.read_slid = cq_read_slid;
	if (attr->wc_flags & IBV_WC_EX_WITH_SL)
		cq->ex.read_sl = cq_read_zero8;
	if (attr->wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		cq->ex.read_dlid_path_bits = cq_read_zero8;
	if (efa_attr && (efa_attr->wc_flags & EFADV_WC_EX_WITH_SGID))
		cq->dv.wc_read_sgid = cq_read_sgid;
	if (efa_attr && (efa_attr->wc_flags & EFADV_WC_EX_WITH_IS_UNSOLICITED))
		cq->dv.wc_is_unsolicited = cq_is_unsolicited;
	return &cq->ex;
}

struct ibv_cq_ex *sim_create_cq_ex(struct ibv_context *c, struct ibv_cq_init_attr_ex *attr)
{
	return create_cq(c, attr, NULL);
}

struct ibv_cq_ex *efasim_create_cq(struct ibv_context *c, struct ibv_cq_init_attr_ex *attr,
				   struct efadv_cq_init_attr *efa_attr, uint32_t inlen)
{
	uint32_t caps = to_ctx(c)->dev->a.device_caps;
	uint64_t supported = 0;

	if (inlen < offsetof(struct efadv_cq_init_attr, wc_flags) + sizeof(efa_attr->wc_flags) ||
	    efa_attr->comp_mask) {
		errno = EINVAL;
		return NULL;
	}
	if (caps & EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID)
		supported |= EFADV_WC_EX_WITH_SGID;
	if (caps & EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV)
		supported |= EFADV_WC_EX_WITH_IS_UNSOLICITED;
	if (efa_attr->wc_flags & ~supported) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return create_cq(c, attr, efa_attr);
}

struct efadv_cq *efasim_cq_from_ibv_cq_ex(struct ibv_cq_ex *ex)
{
	return &to_cq(ex)->dv;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = (uint32_t)cqe,
		.cq_context = cq_context,
		.channel = channel,
		.comp_vector = (uint32_t)comp_vector,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_cq_ex *ex = create_cq(c, &attr, NULL);

	return ex ? ibv_cq_ex_to_cq(ex) : NULL;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;

	pthread_mutex_destroy(&cq->lock);
	pthread_mutex_destroy(&cq->ex.mutex);
	pthread_cond_destroy(&cq->ex.cond);
	free(cq->ring);
	free(cq);
	return 0;
}

/* Write a completion as the device does (called by the engine, and by ibv_destroy_qp). */
void sim_cq_push(struct sim_cq *cq, const struct sim_cqe *e)
{
	struct sim_cqe *slot;
	bool notify = false;

	pthread_mutex_lock(&cq->lock);
	if (cq->prod - cq->cons >= cq->cap) {
		atomic_fetch_add(&g_sim.st.cq_overrun, 1);
		if (!cq->overflow_warned)
			sim_log(0, "CQ of %u entries overrun: a completion was written over one not yet "
				   "polled, and completions are lost (size the CQ for every work request "
				   "that can complete before it is polled)\n", cq->cap);
		cq->overflow_warned = true;
	}
	slot = &cq->ring[cq->prod & (cq->cap - 1)];
	*slot = *e;
	slot->phase = ((cq->prod / cq->cap) & 1) ^ 1;
	cq->prod++;
	if (cq->armed && cq->ex.channel) {
		cq->armed = false;
		notify = true;
	}
	pthread_mutex_unlock(&cq->lock);
	if (notify) {
		struct sim_comp_channel *ch = (struct sim_comp_channel *)cq->ex.channel;
		struct sim_cq *p = cq;

		if (write(ch->wfd, &p, sizeof(p)) != sizeof(p))
			sim_log(0, "completion event lost: %s\n", strerror(errno));
	}
}


int sim_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;

	(void)solicited_only;
	if (!cq->ex.channel)
		return EINVAL;
	pthread_mutex_lock(&cq->lock);
	cq->armed = true;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

int sim_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	int i;

	pthread_mutex_lock(&cq->lock);
	for (i = 0; i < n && cq_ready(cq); i++) {
		struct sim_cqe *e = cur(cq);
		int err = cq_find_qp(cq);

		if (err) {
			if (err == EINVAL && !i)
				i = -EINVAL; /* efa_poll_cq: the first entry failed */
			break;
		}
		load_cur(cq);
		memset(&wc[i], 0, sizeof(wc[i]));
		wc[i].wr_id = e->recv && e->unsolicited ? 0 : e->wr_id;
		wc[i].status = cq->ex.status;
		wc[i].opcode = (enum ibv_wc_opcode)e->opcode;
		wc[i].vendor_err = e->status;
		wc[i].byte_len = e->recv ? e->byte_len : 0;
		wc[i].imm_data = htobe32(e->imm);
		wc[i].qp_num = e->qp_num;
		wc[i].src_qp = e->src_qp;
		wc[i].wc_flags = e->has_imm ? IBV_WC_WITH_IMM : 0;
		wc[i].slid = e->slid;
		release_cur(cq);
	}
	pthread_mutex_unlock(&cq->lock);
	return i;
}

/* The efa provider has no resize_cq: libibverbs answers from its defaults. */
int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq, (void)cqe;
	return EOPNOTSUPP;
}

/* ---- completion channels ---- */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct sim_comp_channel *ch = calloc(1, sizeof(*ch));
	int fds[2];

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC)) {
		free(ch);
		return NULL;
	}
	ch->ch.context = c;
	ch->ch.fd = fds[0];
	ch->wfd = fds[1];
	fcntl(ch->wfd, F_SETFL, O_NONBLOCK);
	return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct sim_comp_channel *ch = (struct sim_comp_channel *)channel;

	close(ch->ch.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct sim_cq *p;
	ssize_t n = read(channel->fd, &p, sizeof(p));

	if (n != sizeof(p))
		return -1;
	*cq = ibv_cq_ex_to_cq(&p->ex);
	*cq_context = p->ex.cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- queue pairs ---- */

static inline struct sim_qp *to_qp(struct ibv_qp_ex *ex)
{
	return (struct sim_qp *)ex;
}

/* A new work request of the session; NULL once the session has failed. */
static struct sim_op *wr_new(struct ibv_qp_ex *ex, uint8_t kind)
{
	struct sim_qp *qp = to_qp(ex);
	struct sim_op *op;

	if (qp->wr_err)
		return NULL;
	if (ex->qp_base.state != IBV_QPS_RTS && ex->qp_base.state != IBV_QPS_SQD) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	if (ex->wr_flags & ~(unsigned)(IBV_SEND_SIGNALED | IBV_SEND_INLINE)) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	if (atomic_load(&qp->sq_outstanding) + qp->npending >= qp->max_send_wr) {
		sim_log(1, "SQ[%u] is full\n", ex->qp_base.qp_num);
		qp->wr_err = ENOMEM;
		return NULL;
	}
	op = calloc(1, sizeof(*op) + qp->max_inline);
	if (!op) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	op->qp = qp;
	op->kind = kind;
	op->wr_id = ex->wr_id;
	if (qp->pending_tail)
		qp->pending_tail->next = op;
	else
		qp->pending_head = op;
	qp->pending_tail = op;
	qp->npending++;
	qp->cur = op;
	return op;
}

static void wr_start(struct ibv_qp_ex *ex)
{
	struct sim_qp *qp = to_qp(ex);

	pthread_mutex_lock(&qp->sq_lock);
	qp->wr_err = 0;
	qp->pending_head = qp->pending_tail = qp->cur = NULL;
	qp->npending = 0;
}

static void drop_pending(struct sim_qp *qp)
{
	while (qp->pending_head) {
		struct sim_op *op = qp->pending_head;

		qp->pending_head = op->next;
		free(op);
	}
	qp->pending_tail = qp->cur = NULL;
	qp->npending = 0;
}

static int wr_complete(struct ibv_qp_ex *ex)
{
	struct sim_qp *qp = to_qp(ex);
	struct sim_ctx *ctx = qp->ctx;
	struct sim_op *op;
	int err = qp->wr_err;

	for (op = qp->pending_head; op && !err; op = op->next)
		if (!op->have_addr)
			err = EINVAL;
	if (err) {
		drop_pending(qp);
		pthread_mutex_unlock(&qp->sq_lock);
		return err;
	}
	if (qp->pending_head) {
		atomic_fetch_add(&qp->sq_outstanding, qp->npending);
		pthread_mutex_lock(&ctx->newq_lock);
		if (ctx->newq_tail)
			ctx->newq_tail->next = qp->pending_head;
		else
			ctx->newq_head = qp->pending_head;
		ctx->newq_tail = qp->pending_tail;
		pthread_mutex_unlock(&ctx->newq_lock);
		qp->pending_head = qp->pending_tail = qp->cur = NULL;
		qp->npending = 0;
		sim_engine_wake(ctx);
	}
	pthread_mutex_unlock(&qp->sq_lock);
	return 0;
}

static void wr_abort(struct ibv_qp_ex *ex)
{
	struct sim_qp *qp = to_qp(ex);

	drop_pending(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}

static void wr_send(struct ibv_qp_ex *ex)
{
	wr_new(ex, OP_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *ex, __be32 imm)
{
	struct sim_op *op = wr_new(ex, OP_SEND);

	if (op) {
		op->has_imm = true;
		op->imm = be32toh(imm);
	}
}

static void wr_rdma(struct ibv_qp_ex *ex, uint8_t kind, uint32_t rkey, uint64_t raddr)
{
	struct sim_op *op = wr_new(ex, kind);

	if (op) {
		op->rkey = rkey;
		op->raddr = raddr;
	}
}

static void wr_rdma_read(struct ibv_qp_ex *ex, uint32_t rkey, uint64_t raddr)
{
	wr_rdma(ex, OP_READ, rkey, raddr);
}

static void wr_rdma_write(struct ibv_qp_ex *ex, uint32_t rkey, uint64_t raddr)
{
	wr_rdma(ex, OP_WRITE, rkey, raddr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *ex, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	struct sim_op *op = wr_new(ex, OP_WRITE);

	if (op) {
		op->rkey = rkey;
		op->raddr = raddr;
		op->has_imm = true;
		op->imm = be32toh(imm);
	}
}

static void wr_set_sge_list(struct ibv_qp_ex *ex, size_t n, const struct ibv_sge *sge)
{
	struct sim_qp *qp = to_qp(ex);
	struct sim_op *op = qp->cur;
	size_t i, max;

	if (qp->wr_err || !op)
		return;
	max = op->kind == OP_SEND ? qp->max_send_sge : (size_t)qp->ctx->dev->a.max_sge_rd;
	if (n > max || n > 4) {
		sim_log(1, "SQ[%u] num_sge %zu > %zu\n", ex->qp_base.qp_num, n, max);
		qp->wr_err = EINVAL;
		return;
	}
	op->nsge = (int)n;
	op->len = 0;
	op->inl = false;
	for (i = 0; i < n; i++) {
		op->sge[i] = sge[i];
		op->len += sge[i].length;
	}
}

static void wr_set_sge(struct ibv_qp_ex *ex, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	wr_set_sge_list(ex, 1, &sge);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *ex, size_t n, const struct ibv_data_buf *buf)
{
	struct sim_qp *qp = to_qp(ex);
	struct sim_op *op = qp->cur;
	size_t i, total = 0;

	if (qp->wr_err || !op)
		return;
	for (i = 0; i < n; i++)
		total += buf[i].length;
	if (total > qp->max_inline || op->kind != OP_SEND) {
		qp->wr_err = EINVAL;
		return;
	}
	total = 0;
	for (i = 0; i < n; i++) {
		memcpy(op->inline_data + total, buf[i].addr, buf[i].length);
		total += buf[i].length;
	}
	op->inl = true;
	op->nsge = 0;
	op->len = total;
}

static void wr_set_inline_data(struct ibv_qp_ex *ex, void *addr, size_t length)
{
	struct ibv_data_buf b = { .addr = addr, .length = length };

	wr_set_inline_data_list(ex, 1, &b);
}

static void wr_set_ud_addr(struct ibv_qp_ex *ex, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct sim_qp *qp = to_qp(ex);
	struct sim_op *op = qp->cur;

	if (qp->wr_err || !op)
		return;
	if (!ah) {
		qp->wr_err = EINVAL;
		return;
	}
	op->dgid = ((struct sim_ah *)ah)->gid;
	op->dqpn = qpn;
	op->dqkey = qkey;
	op->have_addr = true;
}

int sim_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;
	struct ibv_qp_ex *ex = &qp->ex;
	int err;

	wr_start(ex);
	for (; wr; wr = wr->next) {
		ex->wr_id = wr->wr_id;
		ex->wr_flags = wr->send_flags;
		if (wr->opcode == IBV_WR_SEND)
			wr_send(ex);
		else if (wr->opcode == IBV_WR_SEND_WITH_IMM)
			wr_send_imm(ex, wr->imm_data);
		else
			qp->wr_err = EINVAL;
		if (wr->send_flags & IBV_SEND_INLINE) {
			struct ibv_data_buf b[4];
			int i;

			for (i = 0; i < wr->num_sge && i < 4; i++) {
				b[i].addr = (void *)(uintptr_t)wr->sg_list[i].addr;
				b[i].length = wr->sg_list[i].length;
			}
			wr_set_inline_data_list(ex, (size_t)i, b);
		} else {
			wr_set_sge_list(ex, (size_t)wr->num_sge, wr->sg_list);
		}
		wr_set_ud_addr(ex, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
		if (qp->wr_err) {
			*bad = wr;
			break;
		}
	}
	err = wr_complete(ex);
	return err;
}

int sim_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;
	int err = 0;

	pthread_mutex_lock(&qp->rq_lock);
	for (; wr; wr = wr->next) {
		struct sim_rwqe *w;
		int i;

		if (ibqp->state == IBV_QPS_RESET || ibqp->state == IBV_QPS_ERR ||
		    wr->num_sge > (int)qp->max_recv_sge || wr->num_sge > 4 || wr->num_sge < 0)
			err = EINVAL;
		else if (qp->rq_count == qp->max_recv_wr)
			err = ENOMEM;
		if (err) {
			*bad = wr;
			break;
		}
		w = &qp->rq[(qp->rq_head + qp->rq_count) % qp->max_recv_wr];
		w->wr_id = wr->wr_id;
		w->nsge = wr->num_sge;
		for (i = 0; i < wr->num_sge; i++)
			w->sge[i] = wr->sg_list[i];
		qp->rq_count++;
	}
	pthread_mutex_unlock(&qp->rq_lock);
	return err;
}

static void cq_ref(struct ibv_cq *ibcq, int d);

static struct ibv_qp *create_qp(struct ibv_context *c, struct ibv_qp_init_attr_ex *attr,
				const struct efadv_qp_init_attr *efa_attr)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_attr *a = &ctx->dev->a;
	uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	uint16_t flags = 0;
	struct sim_qp *qp;
	int err = 0;

	if (attr->qp_type == IBV_QPT_DRIVER) {
		if (a->device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_READ)
			ops |= IBV_QP_EX_WITH_RDMA_READ;
		if (a->device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE)
			ops |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
		if (a->device_caps & EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV)
			flags |= EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV;
		if (efa_attr->driver_qp_type != EFADV_QP_DRIVER_TYPE_SRD)
			err = EOPNOTSUPP;
	} else if (attr->qp_type != IBV_QPT_UD) {
		err = EOPNOTSUPP;
	}
	if (!err && (efa_attr->flags & ~flags))
		err = EOPNOTSUPP;
	if (!err && (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)))
		err = EOPNOTSUPP;
	if (!err && !(attr->comp_mask & IBV_QP_INIT_ATTR_PD))
		err = EINVAL;
	if (!err && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (attr->send_ops_flags & ~ops))
		err = EOPNOTSUPP;
	if (!err && (!attr->send_cq || !attr->recv_cq || attr->srq))
		err = EINVAL;
	if (!err && (attr->cap.max_send_sge > a->max_sq_sge || attr->cap.max_recv_sge > a->max_rq_sge ||
		     attr->cap.max_send_wr > a->max_sq_wr || attr->cap.max_recv_wr > a->max_rq_wr ||
		     attr->cap.max_inline_data > a->inline_buf_size))
		err = EINVAL;
	if (err) {
		sim_log(1, "create_qp refused: %s\n", strerror(err));
		errno = err;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->ctx = ctx;
	qp->fd = -1;
	qp->srd = attr->qp_type == IBV_QPT_DRIVER;
	qp->unsolicited_write_recv = efa_attr->flags & EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV;
	qp->max_send_wr = attr->cap.max_send_wr ? attr->cap.max_send_wr : 1;
	qp->max_recv_wr = attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	qp->max_inline = a->inline_buf_size;
	qp->rnr_retry = 7;
	qp->rq = calloc(qp->max_recv_wr, sizeof(*qp->rq));
	if (!qp->rq) {
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	pthread_mutex_init(&qp->ex.qp_base.mutex, NULL);
	pthread_cond_init(&qp->ex.qp_base.cond, NULL);
	qp->ex.qp_base.context = c;
	qp->ex.qp_base.qp_context = attr->qp_context;
	qp->ex.qp_base.pd = attr->pd;
	qp->ex.qp_base.send_cq = attr->send_cq;
	qp->ex.qp_base.recv_cq = attr->recv_cq;
	qp->ex.qp_base.qp_type = attr->qp_type;
	qp->ex.qp_base.state = IBV_QPS_RESET;
	qp->kstate = IBV_QPS_RESET;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		struct ibv_qp_ex *ex = &qp->ex;

		ex->comp_mask = 1; /* has the extended functions (ibv_qp_to_qp_ex) */
		ex->wr_start = wr_start;
		ex->wr_complete = wr_complete;
		ex->wr_abort = wr_abort;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND)
			ex->wr_send = wr_send;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_IMM)
			ex->wr_send_imm = wr_send_imm;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_READ)
			ex->wr_rdma_read = wr_rdma_read;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE)
			ex->wr_rdma_write = wr_rdma_write;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
			ex->wr_rdma_write_imm = wr_rdma_write_imm;
		ex->wr_set_inline_data = wr_set_inline_data;
		ex->wr_set_inline_data_list = wr_set_inline_data_list;
		ex->wr_set_sge = wr_set_sge;
		ex->wr_set_sge_list = wr_set_sge_list;
		ex->wr_set_ud_addr = wr_set_ud_addr;
	}
	if (sim_qp_bind(qp)) {
		int e = errno;

		free(qp->rq);
		free(qp);
		errno = e;
		return NULL;
	}
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_inline_data = qp->max_inline;
	atomic_store(&qp->alive, true);
	cq_ref(qp->ex.qp_base.send_cq, 1);
	cq_ref(qp->ex.qp_base.recv_cq, 1);
	pthread_mutex_lock(&ctx->qp_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	atomic_fetch_add(&ctx->qp_gen, 1);
	pthread_mutex_unlock(&ctx->qp_lock);
	sim_engine_wake(ctx);
	sim_log(2, "%s QP %u created on %s (unsolicited write recv %d, send CQ %p, recv CQ %p)\n",
		qp->srd ? "SRD" : "UD", qp->ex.qp_base.qp_num, ctx->dev->ibdev.name,
		qp->unsolicited_write_recv, (void *)qp->ex.qp_base.send_cq, (void *)qp->ex.qp_base.recv_cq);
	return &qp->ex.qp_base;
}

struct ibv_qp *sim_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *attr)
{
	struct efadv_qp_init_attr efa_attr = { 0 };

	if (attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return create_qp(c, attr, &efa_attr);
}

struct ibv_qp *efasim_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *attr,
				   struct efadv_qp_init_attr *efa_attr, uint32_t inlen)
{
	struct efadv_qp_init_attr local = { 0 };

	if (attr->qp_type != IBV_QPT_DRIVER ||
	    inlen < offsetof(struct efadv_qp_init_attr, driver_qp_type) + sizeof(efa_attr->driver_qp_type) ||
	    efa_attr->comp_mask) {
		errno = EINVAL;
		return NULL;
	}
	memcpy(&local, efa_attr, inlen < sizeof(local) ? inlen : sizeof(local));
	return create_qp(c, attr, &local);
}

struct ibv_qp *efasim_create_driver_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr,
				       uint32_t driver_qp_type)
{
	struct ibv_qp_init_attr_ex ex = { 0 };
	struct efadv_qp_init_attr efa_attr = { .driver_qp_type = driver_qp_type };
	struct ibv_qp *qp;

	if (attr->qp_type != IBV_QPT_DRIVER) {
		errno = EINVAL;
		return NULL;
	}
	memcpy(&ex, attr, sizeof(*attr));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	qp = create_qp(pd->context, &ex, &efa_attr);
	if (qp)
		memcpy(attr, &ex, sizeof(*attr));
	return qp;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex ex = { 0 };
	struct efadv_qp_init_attr efa_attr = { 0 };
	struct ibv_qp *qp;

	if (attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	memcpy(&ex, attr, sizeof(*attr));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	qp = create_qp(pd->context, &ex, &efa_attr);
	if (qp)
		memcpy(attr, &ex, sizeof(*attr));
	return qp;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *ibqp)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;

	return qp->ex.comp_mask ? &qp->ex : NULL;
}

/*
 * The kernel's checks of a QP transition (efa_modify_qp_validate): attribute bits the
 * driver does not support are refused (EOPNOTSUPP), then the transition must be one the
 * state table allows, with its required attributes and no others than its optional ones
 * (EINVAL): ib_modify_qp_is_ok's table for UD, the efa driver's own for SRD (which adds
 * RNR_RETRY to RTR->RTS); the port must be 1 and the P_Key index 0 (EOPNOTSUPP).
 */
struct qp_trans {
	bool valid;
	int req, opt;
};

static struct qp_trans qp_transition(bool srd, enum ibv_qp_state cur, enum ibv_qp_state next)
{
	const int cs = IBV_QP_CUR_STATE, pk = IBV_QP_PKEY_INDEX, po = IBV_QP_PORT, qk = IBV_QP_QKEY;
	struct qp_trans t = { 0 };

	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		t.valid = cur != IBV_QPS_RESET || next == IBV_QPS_RESET;
		return t;
	}
	switch (cur) {
	case IBV_QPS_RESET:
		if (next == IBV_QPS_INIT)
			t = (struct qp_trans){ true, pk | po | qk, 0 };
		break;
	case IBV_QPS_INIT:
		if (next == IBV_QPS_INIT)
			t = (struct qp_trans){ true, 0, pk | po | qk };
		else if (next == IBV_QPS_RTR)
			t = (struct qp_trans){ true, 0, pk | qk };
		break;
	case IBV_QPS_RTR:
		if (next == IBV_QPS_RTS)
			t = (struct qp_trans){ true, IBV_QP_SQ_PSN, cs | qk | (srd ? IBV_QP_RNR_RETRY : 0) };
		break;
	case IBV_QPS_RTS:
		if (next == IBV_QPS_RTS)
			t = (struct qp_trans){ true, 0, cs | qk };
		else if (next == IBV_QPS_SQD)
			t = (struct qp_trans){ true, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY };
		break;
	case IBV_QPS_SQD:
		if (next == IBV_QPS_RTS)
			t = (struct qp_trans){ true, 0, cs | qk };
		else if (next == IBV_QPS_SQD)
			t = (struct qp_trans){ true, 0, pk | qk };
		break;
	case IBV_QPS_SQE:
		if (next == IBV_QPS_RTS)
			t = (struct qp_trans){ true, 0, cs | qk };
		break;
	default:
		break;
	}
	return t;
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	const int supported = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY |
			      IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_SQ_PSN |
			      IBV_QP_RNR_RETRY;
	struct sim_qp *qp = (struct sim_qp *)ibqp;
	enum ibv_qp_state cur = (mask & IBV_QP_CUR_STATE) ? attr->cur_qp_state : qp->kstate;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	struct qp_trans t;

	if (mask & ~supported) {
		sim_log(1, "modify_qp: unsupported attribute mask %#x (supported %#x)\n", mask, supported);
		return EOPNOTSUPP;
	}
	t = qp_transition(qp->srd, cur, next);
	if ((unsigned)cur > IBV_QPS_ERR || (unsigned)next > IBV_QPS_ERR || !t.valid ||
	    ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
	     cur != IBV_QPS_SQD && cur != IBV_QPS_SQE) ||
	    (mask & t.req) != t.req || (mask & ~(t.req | t.opt | IBV_QP_STATE))) {
		sim_log(1, "modify_qp: QP %u: invalid transition %d -> %d with mask %#x\n", ibqp->qp_num,
			cur, next, mask);
		return EINVAL;
	}
	if (((mask & IBV_QP_PORT) && attr->port_num != 1) ||
	    ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index))
		return EOPNOTSUPP;
	if ((mask & IBV_QP_RNR_RETRY) && !(qp->ctx->dev->a.device_caps & EFADV_DEVICE_ATTR_CAPS_RNR_RETRY))
		return EOPNOTSUPP;
	if (mask & IBV_QP_QKEY)
		qp->qkey = attr->qkey;
	if (mask & IBV_QP_RNR_RETRY)
		qp->rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_STATE) {
		if (next == IBV_QPS_RESET) {
			pthread_mutex_lock(&qp->rq_lock);
			qp->rq_count = 0;
			pthread_mutex_unlock(&qp->rq_lock);
		}
		qp->kstate = next;
		ibqp->state = next;
	}
	return 0;
}

int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
		 struct ibv_qp_init_attr *init)
{
	const int supported = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
			      IBV_QP_SQ_PSN | IBV_QP_CAP | IBV_QP_RNR_RETRY;
	struct sim_qp *qp = (struct sim_qp *)ibqp;

	if (mask & ~supported)
		return EOPNOTSUPP; /* the efa driver's EFA_QUERY_QP_SUPP_MASK */
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = qp->kstate;
	attr->qkey = qp->qkey;
	attr->rnr_retry = qp->rnr_retry;
	attr->port_num = 1;
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	if (init) {
		memset(init, 0, sizeof(*init));
		init->send_cq = ibqp->send_cq;
		init->recv_cq = ibqp->recv_cq;
		init->cap = attr->cap;
		init->qp_type = ibqp->qp_type;
		init->sq_sig_all = 1;
	}
	return 0;
}

/*
 * libibverbs' wrapper over the efa provider: flags may only ask for the capability vector
 * (else 0); the provider reports IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES where the
 * device has EFA_QUERY_DEVICE_CAPS_DATA_POLLING_128, whatever the operation; without flags
 * the answer is whether whole messages are in order (never, on SRD).
 */
int ibv_query_qp_data_in_order(struct ibv_qp *ibqp, enum ibv_wr_opcode op, uint32_t flags)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;
	int caps = 0;

	(void)op;
	if (flags & ~(uint32_t)IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS)
		return 0;
	if (qp->ctx->dev->a.device_caps & SIM_CAP_DATA_POLLING_128)
		caps |= IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES;
	return flags ? caps : !!(caps & IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG);
}

/*
 * Shared receive queues: the efa provider has none, so libibverbs answers with its
 * defaults (EOPNOTSUPP). Exported for programs linked against the whole libibverbs ABI,
 * such as rdma-bench's verbs backend, which must load here and then learn there is no
 * device for it (ibv_create_qp refuses RC queue pairs the same way).
 */
struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	(void)pd, (void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	(void)srq;
	return EOPNOTSUPP;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	(void)srq, (void)attr, (void)mask;
	return EOPNOTSUPP;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	(void)srq, (void)attr;
	return EOPNOTSUPP;
}

int sim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)srq;
	*bad = wr;
	return EOPNOTSUPP;
}

/* The live QP `qpn` of a context, or NULL (rdma-core's QP table). */
struct sim_qp *sim_qp_by_num(struct sim_ctx *ctx, uint32_t qpn)
{
	struct sim_qp *qp;

	pthread_mutex_lock(&ctx->qp_lock);
	for (qp = ctx->qps; qp && qp->ex.qp_base.qp_num != qpn; qp = qp->next)
		;
	pthread_mutex_unlock(&ctx->qp_lock);
	return qp;
}

static void cq_ref(struct ibv_cq *ibcq, int d)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;

	pthread_mutex_lock(&cq->lock);
	cq->nqp += d;
	pthread_mutex_unlock(&cq->lock);
}

/*
 * Destroying a QP: the device flushes what it still holds of it (each work request in
 * flight and each posted receive completes with EFA_IO_COMP_STATUS_FLUSHED), and
 * rdma-core takes the QP out of its table at once, so those completions, and any the
 * application left unpolled, meet no QP at the next poll (cq_find_qp).
 */
int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp, **pp;
	struct sim_ctx *ctx = qp->ctx;
	uint32_t i;

	atomic_store(&qp->alive, false);
	pthread_mutex_lock(&ctx->qp_lock);
	for (pp = &ctx->qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	atomic_fetch_add(&ctx->qp_gen, 1);
	pthread_mutex_unlock(&ctx->qp_lock);
	cq_ref(ibqp->send_cq, -1);
	cq_ref(ibqp->recv_cq, -1);
	/* The engine flushes and drops everything of this QP before its next loop. */
	if (!sim_engine_quiesce(ctx)) {
		close(qp->fd);
		qp->fd = -1;
		return 0; /* the engine may still hold it: leave the memory */
	}
	pthread_mutex_lock(&qp->rq_lock);
	for (i = 0; i < qp->rq_count; i++) {
		struct sim_cqe c = { 0 };

		c.wr_id = qp->rq[(qp->rq_head + i) % qp->max_recv_wr].wr_id;
		c.qp_num = ibqp->qp_num;
		c.status = ST_FLUSHED;
		c.opcode = IBV_WC_RECV;
		c.recv = true;
		sim_cq_push((struct sim_cq *)ibqp->recv_cq, &c);
		atomic_fetch_add(&g_sim.st.flushed, 1);
	}
	qp->rq_count = 0;
	pthread_mutex_unlock(&qp->rq_lock);
	sim_log(2, "QP %u destroyed\n", ibqp->qp_num);
	if (qp->fd >= 0)
		close(qp->fd);
	pthread_mutex_destroy(&qp->sq_lock);
	pthread_mutex_destroy(&qp->rq_lock);
	pthread_mutex_destroy(&ibqp->mutex);
	pthread_cond_destroy(&ibqp->cond);
	free(qp->rq);
	free(qp);
	return 0;
}
