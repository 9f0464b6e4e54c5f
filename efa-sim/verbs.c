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

/* Keys are (slot + 1) << 8 | generation: a stale key of a reused slot does not match. */
struct sim_mr *sim_mr_lookup_locked(struct sim_ctx *ctx, uint32_t key)
{
	uint32_t slot = (key >> 8) - 1;

	if ((key >> 8) == 0 || slot >= ctx->nmr || !ctx->mrs[slot] || ctx->mrs[slot]->dead ||
	    ctx->mrs[slot]->mr.lkey != key)
		return NULL;
	return ctx->mrs[slot];
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
			     unsigned access)
{
	struct sim_ctx *ctx = to_ctx(pd->context);
	const unsigned supported = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_OPTIONAL_RANGE;
	struct sim_mr *mr;
	uint32_t slot, gen;

	if ((access & ~supported) ||
	    ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
	    ((access & IBV_ACCESS_REMOTE_WRITE) &&
	     !(ctx->dev->a.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE)) ||
	    len > ctx->dev->a.max_mr_size || (!addr && len)) {
		errno = EINVAL;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_rwlock_wrlock(&ctx->mr_lock);
	for (slot = 0; slot < ctx->nmr; slot++)
		if (!ctx->mrs[slot] || ctx->mrs[slot]->dead)
			break;
	if (slot == ctx->nmr) {
		struct sim_mr **m;

		if (ctx->nmr >= (uint32_t)ctx->dev->a.max_mr) {
			pthread_rwlock_unlock(&ctx->mr_lock);
			free(mr);
			errno = ENOMEM;
			return NULL;
		}
		m = realloc(ctx->mrs, (ctx->nmr + 64) * sizeof(*m));
		if (!m) {
			pthread_rwlock_unlock(&ctx->mr_lock);
			free(mr);
			errno = ENOMEM;
			return NULL;
		}
		memset(m + ctx->nmr, 0, 64 * sizeof(*m));
		ctx->mrs = m;
		ctx->nmr += 64;
	}
	gen = 1;
	if (ctx->mrs[slot]) {
		gen = ((ctx->mrs[slot]->mr.lkey & 0xff) + 1) & 0xff;
		free(ctx->mrs[slot]);
	}
	mr->mr.context = pd->context;
	mr->mr.pd = pd;
	mr->mr.addr = addr;
	mr->mr.length = len;
	mr->mr.handle = slot;
	mr->mr.lkey = mr->mr.rkey = ((slot + 1) << 8) | gen;
	mr->iova = iova;
	mr->access = (int)access;
	ctx->mrs[slot] = mr;
	pthread_rwlock_unlock(&ctx->mr_lock);
	sim_log(3, "reg_mr %p+%zu key %#x access %#x\n", addr, len, mr->mr.lkey, access);
	return &mr->mr;
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
	(void)pd, (void)offset, (void)len, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP; /* no device memory here */
	return NULL;
}

int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct sim_ctx *ctx = to_ctx(ibmr->context);
	struct sim_mr *mr = (struct sim_mr *)ibmr;

	/* Waits for any copy in progress into or out of this region. */
	pthread_rwlock_wrlock(&ctx->mr_lock);
	mr->dead = true; /* the slot keeps it until reused, so the key stays unique */
	pthread_rwlock_unlock(&ctx->mr_lock);
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

static inline struct sim_cqe *cur(struct sim_cq *cq)
{
	return &cq->ring[cq->head];
}

static void release_cur(struct sim_cq *cq)
{
	struct sim_cqe *e = cur(cq);

	if (!e->recv)
		atomic_fetch_sub(&e->qp->sq_outstanding, 1);
	cq->head = (cq->head + 1) % cq->cap;
	cq->count--;
	cq->have_cur = false;
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

	if (attr->comp_mask)
		return EINVAL;
	pthread_mutex_lock(&cq->lock);
	if (!cq->count) {
		pthread_mutex_unlock(&cq->lock);
		/* Nothing yet: let the progress engines run (this box may have few cores). */
		sched_yield();
		return ENOENT;
	}
	load_cur(cq);
	return 0;
}

static int cq_next_poll(struct ibv_cq_ex *ex)
{
	struct sim_cq *cq = to_cq(ex);

	if (cq->have_cur)
		release_cur(cq);
	if (!cq->count)
		return ENOENT;
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
	while (cap < attr->cqe)
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

/* Called by the engine (and nothing else holds another lock of ours meanwhile). */
void sim_cq_push(struct sim_cq *cq, const struct sim_cqe *e)
{
	bool notify = false;

	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap) {
		/* The hardware would overrun; keep the entry and say so once. */
		struct sim_cqe *ring = calloc(cq->cap * 2, sizeof(*ring));
		uint32_t i;

		if (!ring) {
			pthread_mutex_unlock(&cq->lock);
			sim_log(0, "CQ overrun and out of memory: a completion is lost\n");
			return;
		}
		for (i = 0; i < cq->count; i++)
			ring[i] = cq->ring[(cq->head + i) % cq->cap];
		free(cq->ring);
		cq->ring = ring;
		cq->head = 0;
		cq->cap *= 2;
		if (!cq->overflow_warned)
			sim_log(0, "CQ of %u entries overrun (the device would fail here)\n", cq->cap / 2);
		cq->overflow_warned = true;
	}
	cq->ring[(cq->head + cq->count) % cq->cap] = *e;
	cq->count++;
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

/* Drop the entries of a queue pair that is being destroyed. */
static void cq_purge(struct sim_cq *cq, struct sim_qp *qp)
{
	uint32_t i, n = 0;

	pthread_mutex_lock(&cq->lock);
	for (i = 0; i < cq->count; i++) {
		struct sim_cqe *e = &cq->ring[(cq->head + i) % cq->cap];

		if (e->qp != qp)
			cq->ring[(cq->head + n++) % cq->cap] = *e;
	}
	cq->count = n;
	pthread_mutex_unlock(&cq->lock);
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
	for (i = 0; i < n && cq->count; i++) {
		struct sim_cqe *e = cur(cq);

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
	pthread_mutex_lock(&ctx->qp_lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	atomic_fetch_add(&ctx->qp_gen, 1);
	pthread_mutex_unlock(&ctx->qp_lock);
	sim_engine_wake(ctx);
	sim_log(2, "%s QP %u created on %s (unsolicited write recv %d)\n", qp->srd ? "SRD" : "UD",
		qp->ex.qp_base.qp_num, ctx->dev->ibdev.name, qp->unsolicited_write_recv);
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

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;

	if ((mask & IBV_QP_PORT) && attr->port_num != 1)
		return EINVAL;
	if (mask & IBV_QP_QKEY)
		qp->qkey = attr->qkey;
	if (mask & IBV_QP_RNR_RETRY) {
		if (!(qp->ctx->dev->a.device_caps & EFADV_DEVICE_ATTR_CAPS_RNR_RETRY))
			return EOPNOTSUPP;
		qp->rnr_retry = attr->rnr_retry;
	}
	if (mask & IBV_QP_STATE) {
		if (attr->qp_state == IBV_QPS_RESET) {
			pthread_mutex_lock(&qp->rq_lock);
			qp->rq_count = 0;
			pthread_mutex_unlock(&qp->rq_lock);
		}
		ibqp->state = attr->qp_state;
	}
	return 0;
}

int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
		 struct ibv_qp_init_attr *init)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp;

	(void)mask;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = ibqp->state;
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

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp, (void)op, (void)flags;
	return 0; /* SRD: no ordering promise, not even for 128-byte aligned data */
}

int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sim_qp *qp = (struct sim_qp *)ibqp, **pp;
	struct sim_ctx *ctx = qp->ctx;

	atomic_store(&qp->alive, false);
	pthread_mutex_lock(&ctx->qp_lock);
	for (pp = &ctx->qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	atomic_fetch_add(&ctx->qp_gen, 1);
	pthread_mutex_unlock(&ctx->qp_lock);
	/* The engine drops everything of this QP before its next loop. */
	if (!sim_engine_quiesce(ctx)) {
		close(qp->fd);
		qp->fd = -1;
		return 0; /* the engine may still hold it: leave the memory */
	}
	cq_purge((struct sim_cq *)ibqp->send_cq, qp);
	if (ibqp->recv_cq != ibqp->send_cq)
		cq_purge((struct sim_cq *)ibqp->recv_cq, qp);
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
