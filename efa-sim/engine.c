// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim: the per-device progress engine, one thread per opened device.
 *
 * Every queue pair has a UNIX datagram socket with an abstract name made of the fabric
 * id, its device's GID and its QP number, so QPs of any process sharing the fabric reach
 * each other. The engine turns posted work requests into packets of at most the device's
 * MTU (a SEND is one packet; a WRITE or a READ response is cut into packets), queues them
 * in a random order, and sends them from that queue in a seeded random order within a
 * window and after a seeded random delay. A packet's payload is read from the source
 * memory when the packet leaves, not at post: a buffer reused before its completion sends
 * what it holds then. The engine handles what arrives as the device does: it checks queue
 * keys, memory keys (and their protection domain), ranges and access, places the payload
 * in registered memory of its own process, consumes receive work requests (or answers
 * RNR), writes completions, and answers each request once. A packet lands in two steps,
 * the second a little later (after the delay knob's random wait, or at the engine's next
 * round): without the device's 128-byte in-order capability the upper half of each
 * 128-byte block first, then the lower halves; with it, every other whole block first. So
 * the last byte of a buffer may be visible before its first, and with the capability no
 * 128-byte block's last 8 bytes are seen before the rest of it (struct sim_dma's
 * `ordered`). The initiator completes an operation when the answer arrives (after the
 * target placed every byte), resends after an RNR within the QP's rnr_retry, and fails it
 * when no answer comes within the timeout.
 *
 * One file: it is one thread's state machine. The packet format, the transmit queue, the
 * operation table, the placement queue, the reassembly of WRITEs and struct sim_engine are
 * private to it, and each section (initiator, target, loop) works on that state; splitting
 * it would put them all in sim.h for no reader but this engine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

#define MAGIC 0x45464153u /* "EFAS" */
#define MAXPKT (64u * 1024) /* the largest payload a packet carries here */
#define HASH 4096

enum { P_SEND = 1, P_WRITE, P_READ_REQ, P_READ_RESP, P_ACK };
#define F_IMM 1
#define F_LOSE 2 /* EFA_SIM_LOSE_WRITE_PERMILLE: the target drops this piece's bytes */

struct pkt {
	uint32_t magic;
	uint8_t type, flags, status, pad;
	uint8_t sgid[16];
	uint32_t sqpn, dqpn, qkey, imm;
	uint64_t op_id;
	uint32_t attempt, len;
	uint64_t total, off;
	uint32_t rkey, pad2;
	uint64_t raddr;
	uint8_t data[];
};

/* Where a queued packet's payload comes from when it leaves. */
enum { SRC_NONE, SRC_OP, SRC_MR };

struct txpkt {
	struct txpkt *prev, *next;
	struct sim_qp *from;
	uint64_t ready_at;
	struct sockaddr_un to;
	socklen_t tolen;
	uint8_t to_gid[16];
	uint8_t src;     /* SRC_OP: the operation's own memory (op_id, off); SRC_MR: a region of
			  * `from`'s process (a READ response: src_key at src_va) */
	uint32_t src_key;
	uint64_t src_va;
	struct pkt p;    /* the header; the payload is read into the engine's buffer */
};

/* A WRITE arriving in several packets. */
struct reasm {
	struct reasm *next;
	struct sim_qp *qp;
	uint8_t sgid[16];
	uint32_t sqpn, attempt;
	uint64_t op_id, got, total, max_off;
	uint8_t status;
};

/* The second step of a packet's placement, and what follows it. */
struct later {
	uint64_t due;
	struct sim_qp *qp;      /* where it arrived */
	uint8_t status;         /* of the access, found at arrival */
	bool placed;            /* nothing (more) to place: an error, a lost piece, or done */
	struct sim_rwqe w;      /* P_SEND: the receive it consumed */
	struct pkt p;           /* a copy of the packet, payload included */
};

struct responder {
	uint8_t gid[16];
	uint32_t qpn;
};

struct sim_engine {
	struct sim_op *ops[HASH];
	struct sim_op *resend; /* ops waiting for an RNR resend */
	struct txpkt *tx_head, *tx_tail;
	unsigned ntx;
	struct reasm *reasm;
	struct later **heap;   /* placements waiting for their second step, by due time */
	unsigned nheap, heap_cap;
	uint64_t next_id, rng, last_sweep;
	unsigned nops; /* operations in the hash */
	unsigned qp_gen;
	struct pollfd *pfd;
	struct sim_qp **pqp;
	unsigned npfd;
	struct responder seen[256];
	unsigned nseen;
	uint8_t *rxbuf, *txbuf;
	struct iovec dma_l[256], dma_r[256];
};

static atomic_uint ctx_counter;

static uint64_t rnd(struct sim_engine *e)
{
	uint64_t x = e->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	e->rng = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* Payload bytes a WRITE or READ-response packet carries: the device's MTU. */
static uint64_t pkt_size(struct sim_ctx *ctx)
{
	uint64_t n = g_sim.f.pkt_size ? g_sim.f.pkt_size : ctx->dev->a.max_msg_sz;

	return n < 64 ? 64 : n > MAXPKT ? MAXPKT : n;
}

static void addr_of(struct sockaddr_un *sa, socklen_t *len, const uint8_t *gid, uint32_t qpn)
{
	char name[100];
	int n, i;

	n = snprintf(name, sizeof(name), "efasim-%s-", g_sim.ns);
	for (i = 0; i < 16; i++)
		n += snprintf(name + n, sizeof(name) - (size_t)n, "%02x", gid[i]);
	n += snprintf(name + n, sizeof(name) - (size_t)n, "-%u", qpn);
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path + 1, name, (size_t)n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int sim_qp_bind(struct sim_qp *qp)
{
	struct sim_ctx *ctx = qp->ctx;
	unsigned max = ctx->dev->a.max_qp > 2 ? (unsigned)ctx->dev->a.max_qp : 2;
	unsigned start, i;
	int fd, sz = 4 << 20;

	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	/* QP numbers are device-wide (all processes), below max_qp, like the kernel's. */
	start = (unsigned)(sim_now_ns() / 1000 + (uint64_t)getpid() * 7919);
	for (i = 0; i < max - 1; i++) {
		uint32_t qpn = 1 + (start + i) % (max - 1);
		struct sockaddr_un sa;
		socklen_t len;

		addr_of(&sa, &len, ctx->dev->gid.raw, qpn);
		if (!bind(fd, (struct sockaddr *)&sa, len)) {
			qp->fd = fd;
			qp->ex.qp_base.qp_num = qpn;
			qp->ex.qp_base.handle = qpn;
			return 0;
		}
		if (errno != EADDRINUSE)
			break;
	}
	if (errno == EADDRINUSE)
		errno = ENOMEM; /* every QP number of the device is taken */
	close(fd);
	return -1;
}

/* ---- memory access ("DMA") ---- */

/* Region `key` of protection domain `pd` holding [addr, addr+len) with `access`, or NULL. */
static struct sim_mr *mr_for(struct sim_ctx *ctx, uint32_t key, struct ibv_pd *pd, uint64_t addr,
			     uint64_t len, int access)
{
	struct sim_mr *mr = sim_mr_lookup_locked(ctx, key, pd);

	if (!mr || (access && (mr->access & access) != access) || addr < mr->iova ||
	    len > mr->mr.length || addr - mr->iova > mr->mr.length - len)
		return NULL;
	return mr;
}

/* The process address of iova `addr` of `mr`. */
static uint64_t mr_va(struct sim_mr *mr, uint64_t addr)
{
	return (uintptr_t)mr->mr.addr + (addr - mr->iova);
}

/* Read `len` bytes at byte offset `off` of a scatter list (local keys of `pd`) into buf. */
static int sge_read(struct sim_ctx *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int n,
		    uint64_t off, uint8_t *buf, uint64_t len)
{
	int i, st = ST_OK;

	pthread_rwlock_rdlock(&g_sim.dma_lock);
	pthread_rwlock_rdlock(&ctx->mr_lock);
	for (i = 0; i < n && len; i++) {
		struct sim_mr *mr;
		uint64_t take;

		if (off >= sge[i].length) {
			off -= sge[i].length;
			continue;
		}
		take = sge[i].length - off;
		if (take > len)
			take = len;
		mr = mr_for(ctx, sge[i].lkey, pd, sge[i].addr + off, take, 0);
		if (!mr) {
			st = ST_LOCAL_INVALID_LKEY;
			break;
		}
		sim_dma_get(mr, mr_va(mr, sge[i].addr + off), buf, take);
		buf += take;
		len -= take;
		off = 0;
	}
	pthread_rwlock_unlock(&ctx->mr_lock);
	pthread_rwlock_unlock(&g_sim.dma_lock);
	if (st == ST_OK && len)
		st = ST_LOCAL_INVALID_LKEY;
	return st;
}

/* Check that a scatter list (local keys of `pd`) can take `len` bytes written. */
static int sge_check(struct sim_ctx *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int n,
		     uint64_t len, int access)
{
	uint64_t room = 0;
	int i, st = ST_OK;

	pthread_rwlock_rdlock(&ctx->mr_lock);
	for (i = 0; i < n; i++) {
		if (sge[i].length && !mr_for(ctx, sge[i].lkey, pd, sge[i].addr, sge[i].length, access))
			st = ST_LOCAL_INVALID_LKEY;
		room += sge[i].length;
	}
	pthread_rwlock_unlock(&ctx->mr_lock);
	if (st == ST_OK && room < len)
		st = ST_LOCAL_BAD_LENGTH;
	return st;
}

/*
 * Where a packet's payload lands: a remote-write region (key, iova of the packet's first
 * byte) or a scatter list (a receive, a READ's local buffer) from byte offset `off`.
 */
struct dest {
	struct sim_ctx *ctx;
	struct ibv_pd *pd;
	uint32_t key;
	uint64_t addr;
	const struct ibv_sge *sge;
	int nsge;
	uint64_t off;
};

/*
 * Step `step` (1 or 2) of placing `len` bytes at `d`. Runs of the target's address space
 * alternate between the steps: 64-byte halves of each 128-byte block (the upper half goes
 * first), or with the in-order capability whole 128-byte blocks (odd ones first).
 */
static void place(struct sim_engine *e, struct dest *d, const uint8_t *data, uint64_t len, int step,
		  bool in_order_128)
{
	struct sim_dma dma = { .l = e->dma_l, .r = e->dma_r, .max = 256, .ordered = in_order_128 };
	unsigned shift = in_order_128 ? 7 : 6;
	uint64_t done = 0, off = d->off;
	int i = 0;

	pthread_rwlock_rdlock(&g_sim.dma_lock);
	pthread_rwlock_rdlock(&d->ctx->mr_lock);
	while (done < len) {
		struct sim_mr *mr;
		uint64_t addr, n, j;

		if (d->sge) { /* the next piece of the scatter list */
			while (i < d->nsge && off >= d->sge[i].length)
				off -= d->sge[i++].length;
			if (i == d->nsge)
				break;
			addr = d->sge[i].addr + off;
			n = d->sge[i].length - off;
			if (n > len - done)
				n = len - done;
			mr = mr_for(d->ctx, d->sge[i].lkey, d->pd, addr, n, IBV_ACCESS_LOCAL_WRITE);
			off += n;
		} else {
			addr = d->addr;
			n = len;
			mr = mr_for(d->ctx, d->key, d->pd, addr, n, IBV_ACCESS_REMOTE_WRITE);
		}
		if (!mr) /* deregistered since the packet arrived: the bytes go nowhere */
			break;
		if (mr->gpu) {
			/*
			 * GPU memory: the piece in one CUDA copy at the first step (a copy per
			 * 64-byte run would be a CUDA call each), so a GPU kernel polling the
			 * target sees a piece land whole, not in halves: not modelled for GPU
			 * memory. The completion still waits for both steps.
			 */
			if (step == 1)
				sim_dma_put(&dma, mr, mr_va(mr, addr), data + done, n);
			done += n;
			continue;
		}
		for (j = 0; j < n;) {
			uint64_t a = addr + j, run = (1ull << shift) - (a & ((1ull << shift) - 1));

			if (run > n - j)
				run = n - j;
			if ((((a >> shift) & 1) ? 1 : 2) == step)
				sim_dma_put(&dma, mr, mr_va(mr, a), data + done + j, run);
			j += run;
		}
		done += n;
	}
	sim_dma_flush(&dma);
	pthread_rwlock_unlock(&d->ctx->mr_lock);
	pthread_rwlock_unlock(&g_sim.dma_lock);
}

static bool in_order_128(struct sim_qp *qp)
{
	return qp->ctx->dev->a.device_caps & SIM_CAP_DATA_POLLING_128;
}

/* ---- transmit queue ---- */

static struct txpkt *tx_new(struct sim_qp *from, const uint8_t *dgid, uint32_t dqpn)
{
	struct txpkt *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->from = from;
	addr_of(&t->to, &t->tolen, dgid, dqpn);
	memcpy(t->to_gid, dgid, 16);
	t->p.magic = MAGIC;
	memcpy(t->p.sgid, from->ctx->dev->gid.raw, 16);
	t->p.sqpn = from->ex.qp_base.qp_num;
	t->p.dqpn = dqpn;
	return t;
}

static void tx_enqueue(struct sim_engine *e, struct txpkt *t)
{
	t->ready_at = sim_now_ns();
	if (g_sim.f.delay_us) {
		uint64_t d = rnd(e) % ((uint64_t)g_sim.f.delay_us + 1);

		t->ready_at += d * 1000;
		if (d)
			atomic_fetch_add(&g_sim.st.delayed, 1);
	}
	t->next = NULL;
	t->prev = e->tx_tail;
	if (e->tx_tail)
		e->tx_tail->next = t;
	else
		e->tx_head = t;
	e->tx_tail = t;
	e->ntx++;
}

/* Queue packets in a random order (packets of one operation take different paths). */
static void tx_enqueue_shuffled(struct sim_engine *e, struct txpkt **v, uint64_t n)
{
	uint64_t i;

	for (i = n; i > 1; i--) {
		uint64_t j = rnd(e) % i;
		struct txpkt *t = v[i - 1];

		v[i - 1] = v[j];
		v[j] = t;
	}
	for (i = 0; i < n; i++)
		tx_enqueue(e, v[i]);
}

static void tx_unlink(struct sim_engine *e, struct txpkt *t)
{
	if (t->prev)
		t->prev->next = t->next;
	else
		e->tx_head = t->next;
	if (t->next)
		t->next->prev = t->prev;
	else
		e->tx_tail = t->prev;
	e->ntx--;
}

/* An answer to a request packet `req` that arrived on `qp`. */
static void reply(struct sim_engine *e, struct sim_qp *qp, const struct pkt *req, uint8_t status)
{
	struct txpkt *t = tx_new(qp, req->sgid, req->sqpn);

	if (!t)
		return;
	t->p.type = P_ACK;
	t->p.status = status;
	t->p.op_id = req->op_id;
	t->p.attempt = req->attempt;
	tx_enqueue(e, t);
}

/* ---- operations at the initiator ---- */

static struct sim_op **op_slot(struct sim_engine *e, uint64_t id)
{
	return &e->ops[id % HASH];
}

static struct sim_op *op_find(struct sim_engine *e, uint64_t id)
{
	struct sim_op *op;

	for (op = *op_slot(e, id); op; op = op->next)
		if (op->id == id)
			return op;
	return NULL;
}

static void op_unhash(struct sim_engine *e, struct sim_op *op)
{
	struct sim_op **pp;

	for (pp = op_slot(e, op->id); *pp; pp = &(*pp)->next)
		if (*pp == op) {
			*pp = op->next;
			return;
		}
}

static void op_cqe(struct sim_op *op, uint8_t status)
{
	struct sim_cqe c = { 0 };

	c.wr_id = op->wr_id;
	c.qp_num = op->qp->ex.qp_base.qp_num;
	c.status = status;
	c.opcode = op->kind == OP_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_SEND; /* READ reads as SEND */
	sim_cq_push((struct sim_cq *)op->qp->ex.qp_base.send_cq, &c);
}

static void op_complete(struct sim_engine *e, struct sim_op *op, uint8_t status)
{
	struct sim_op **pp;

	op_unhash(e, op);
	e->nops--;
	if (op->waiting_resend)
		for (pp = &e->resend; *pp; pp = &(*pp)->wnext)
			if (*pp == op) {
				*pp = op->wnext;
				break;
			}
	if (status)
		sim_log(1, "QP %u: operation %llu to QP %u failed with status %u\n",
			op->qp->ex.qp_base.qp_num, (unsigned long long)op->id, op->dqpn, status);
	else
		sim_log(3, "QP %u op %llu: done\n", op->qp->ex.qp_base.qp_num, (unsigned long long)op->id);
	op_cqe(op, status);
	free(op);
}

/* A work request of a QP being destroyed: the device flushes it (EFA_IO_COMP_STATUS_FLUSHED). */
static void op_flush(struct sim_op *op)
{
	atomic_fetch_add(&g_sim.st.flushed, 1);
	op_cqe(op, ST_FLUSHED);
	free(op);
}

static void saw_responder(struct sim_engine *e, const uint8_t *gid, uint32_t qpn)
{
	unsigned i;

	for (i = 0; i < e->nseen; i++)
		if (e->seen[i].qpn == qpn && !memcmp(e->seen[i].gid, gid, 16))
			return;
	i = e->nseen < 256 ? e->nseen++ : (unsigned)(rnd(e) % 256);
	memcpy(e->seen[i].gid, gid, 16);
	e->seen[i].qpn = qpn;
}

static bool responded(struct sim_engine *e, const uint8_t *gid, uint32_t qpn)
{
	unsigned i;

	for (i = 0; i < e->nseen; i++)
		if (e->seen[i].qpn == qpn && !memcmp(e->seen[i].gid, gid, 16))
			return true;
	return false;
}

/* Turn an operation into packets (again, after an RNR). Their payload is read as each
 * leaves (transmit), from the operation's scatter list. */
static void op_transmit(struct sim_engine *e, struct sim_op *op)
{
	struct sim_ctx *ctx = op->qp->ctx;
	uint64_t off = 0, lose_at = UINT64_MAX, size, first, npkt, i;
	struct txpkt **v, *t;
	int st;

	op->deadline = sim_now_ns() + (uint64_t)g_sim.f.timeout_ms * 1000000;
	op->got = 0;
	if (op->kind == OP_READ) {
		st = sge_check(ctx, op->qp->ex.qp_base.pd, op->sge, op->nsge, op->len, IBV_ACCESS_LOCAL_WRITE);
		if (st) {
			op_complete(e, op, (uint8_t)(st == ST_LOCAL_BAD_LENGTH ? ST_LOCAL_INVALID_LKEY : st));
			return;
		}
		t = tx_new(op->qp, op->dgid.raw, op->dqpn);
		if (!t)
			goto nomem;
		t->p.type = P_READ_REQ;
		t->p.total = op->len;
		t->p.rkey = op->rkey;
		t->p.raddr = op->raddr;
		t->p.qkey = op->dqkey;
		t->p.op_id = op->id;
		t->p.attempt = op->attempt;
		tx_enqueue(e, t);
		return;
	}
	if (!op->inl) { /* the local keys are checked at post time too */
		uint64_t room = 0;
		int k;

		for (k = 0; k < op->nsge; k++)
			room += op->sge[k].length;
		pthread_rwlock_rdlock(&ctx->mr_lock);
		for (k = 0, st = ST_OK; k < op->nsge && !st; k++)
			if (op->sge[k].length &&
			    !mr_for(ctx, op->sge[k].lkey, op->qp->ex.qp_base.pd, op->sge[k].addr, op->sge[k].length, 0))
				st = ST_LOCAL_INVALID_LKEY;
		pthread_rwlock_unlock(&ctx->mr_lock);
		if (st || room < op->len) {
			op_complete(e, op, ST_LOCAL_INVALID_LKEY);
			return;
		}
	}
	size = op->kind == OP_WRITE ? pkt_size(ctx) : (op->len ? op->len : 1);
	/* A device with the 128-byte in-order capability cuts a WRITE at 128-byte boundaries of
	 * the target's addresses, so no block spans two packets (which may land in any order). */
	if (op->kind == OP_WRITE && in_order_128(op->qp) && size >= 256) {
		size &= ~127ull;
		first = size - (op->raddr & 127);
	} else {
		first = size;
	}
	npkt = op->len > first ? 1 + (op->len - first + size - 1) / size : 1;
	/* The EFA_SIM_LOSE_WRITE_PERMILLE defect picks a WRITE (without immediate), then one of
	 * its packets at random, so the lost bytes may sit anywhere in the target range. */
	if (op->kind == OP_WRITE && !op->has_imm && g_sim.f.lose_write_permille && op->len &&
	    rnd(e) % 1000 < g_sim.f.lose_write_permille) {
		lose_at = rnd(e) % npkt; /* the index of the packet */
		atomic_fetch_add(&g_sim.st.writes_lost, 1);
	}
	v = malloc(npkt * sizeof(*v));
	if (!v)
		goto nomem;
	for (i = 0; i < npkt; i++) {
		uint64_t cut = i ? size : first, n = op->len - off < cut ? op->len - off : cut;

		t = v[i] = tx_new(op->qp, op->dgid.raw, op->dqpn);
		if (!t) {
			while (i--)
				free(v[i]);
			free(v);
			goto nomem;
		}
		t->src = SRC_OP;
		t->p.type = op->kind == OP_SEND ? P_SEND : P_WRITE;
		t->p.flags = (op->has_imm ? F_IMM : 0) | (i == lose_at ? F_LOSE : 0);
		t->p.imm = op->imm;
		t->p.qkey = op->dqkey;
		t->p.op_id = op->id;
		t->p.attempt = op->attempt;
		t->p.total = op->len;
		t->p.off = off;
		t->p.len = (uint32_t)n;
		t->p.rkey = op->rkey;
		t->p.raddr = op->raddr;
		off += n;
	}
	tx_enqueue_shuffled(e, v, npkt);
	free(v);
	return;
nomem:
	op_complete(e, op, ST_LOCAL_QP_INTERNAL);
}

static void op_start(struct sim_engine *e, struct sim_op *op)
{
	struct sim_qp *qp = op->qp;
	struct sim_attr *a = &qp->ctx->dev->a;
	struct sim_op **slot;

	op->id = ++e->next_id;
	op->attempt = 0;
	op->rnr_left = qp->rnr_retry;
	slot = op_slot(e, op->id);
	op->next = *slot;
	*slot = op;
	e->nops++;
	if (op->kind != OP_SEND && !qp->srd) {
		op_complete(e, op, ST_LOCAL_UNSUPPORTED_OP);
		return;
	}
	sim_log(3, "QP %u op %llu: %s len %llu nsge %d%s imm %d to QP %u rkey %#x raddr %#llx\n",
		qp->ex.qp_base.qp_num, (unsigned long long)op->id,
		op->kind == OP_SEND ? "SEND" : op->kind == OP_WRITE ? "WRITE" : "READ",
		(unsigned long long)op->len, op->nsge, op->inl ? " inline" : "", op->has_imm, op->dqpn,
		op->rkey, (unsigned long long)op->raddr);
	if ((op->kind == OP_SEND && op->len > a->max_msg_sz) ||
	    (op->kind != OP_SEND && op->len > a->max_rdma_size)) {
		op_complete(e, op, ST_LOCAL_BAD_LENGTH);
		return;
	}
	op_transmit(e, op);
}

/* ---- placements waiting for their second step (a min-heap by due time) ---- */

static void heap_swap(struct sim_engine *e, unsigned a, unsigned b)
{
	struct later *t = e->heap[a];

	e->heap[a] = e->heap[b];
	e->heap[b] = t;
}

static void heap_down(struct sim_engine *e, unsigned i)
{
	for (;;) {
		unsigned l = 2 * i + 1, r = l + 1, m = i;

		if (l < e->nheap && e->heap[l]->due < e->heap[m]->due)
			m = l;
		if (r < e->nheap && e->heap[r]->due < e->heap[m]->due)
			m = r;
		if (m == i)
			return;
		heap_swap(e, i, m);
		i = m;
	}
}

static bool heap_push(struct sim_engine *e, struct later *l)
{
	unsigned i;

	if (e->nheap == e->heap_cap) {
		unsigned cap = e->heap_cap ? 2 * e->heap_cap : 256;
		struct later **h = realloc(e->heap, cap * sizeof(*h));

		if (!h)
			return false;
		e->heap = h;
		e->heap_cap = cap;
	}
	i = e->nheap++;
	e->heap[i] = l;
	while (i && e->heap[(i - 1) / 2]->due > e->heap[i]->due) {
		heap_swap(e, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	return true;
}

static struct later *heap_pop(struct sim_engine *e)
{
	struct later *l = e->heap[0];

	e->heap[0] = e->heap[--e->nheap];
	heap_down(e, 0);
	return l;
}

/* Keep only the placements whose QP lives (after QPs were destroyed). */
static void heap_purge(struct sim_engine *e)
{
	unsigned i, n = 0;

	for (i = 0; i < e->nheap; i++) {
		if (atomic_load(&e->heap[i]->qp->alive))
			e->heap[n++] = e->heap[i];
		else
			free(e->heap[i]);
	}
	e->nheap = n;
	for (i = n / 2 + 1; i-- > 0;)
		heap_down(e, i);
}

static void later_run(struct sim_engine *e, struct later *l, bool dying);

/*
 * Place the first step of packet `p` (arrived on `qp`, its access checked: `status`) now
 * and queue the second; `d` says where its payload goes (NULL: nowhere, an error or a lost
 * piece). If the queue cannot grow, both steps happen now.
 */
static void land(struct sim_engine *e, struct sim_qp *qp, struct pkt *p, struct dest *d,
		 uint8_t status, const struct sim_rwqe *w)
{
	struct later *l = malloc(sizeof(*l) + p->len);
	bool ordered = in_order_128(qp);

	if (d && p->len)
		place(e, d, p->data, p->len, 1, ordered);
	if (!l) {
		struct later tmp = { .qp = qp, .status = status, .placed = true };

		if (d && p->len)
			place(e, d, p->data, p->len, 2, ordered);
		tmp.p = *p; /* the header: what follows the placement needs no payload */
		if (w)
			tmp.w = *w;
		later_run(e, &tmp, false);
		return;
	}
	l->due = sim_now_ns();
	if (g_sim.f.delay_us)
		l->due += (rnd(e) % ((uint64_t)g_sim.f.delay_us + 1)) * 1000;
	l->qp = qp;
	l->status = status;
	l->placed = !d || !p->len;
	if (w)
		l->w = *w;
	memcpy(&l->p, p, sizeof(*p) + p->len);
	if (!heap_push(e, l)) {
		if (!l->placed)
			place(e, d, p->data, p->len, 2, ordered);
		l->placed = true;
		later_run(e, l, false);
		free(l);
	}
}

/* ---- the target side ---- */

/* Take a posted receive, or none (RNR), possibly made up by the RNR fault knob. */
static bool rq_pop(struct sim_engine *e, struct sim_qp *qp, struct sim_rwqe *out)
{
	bool ok = false;

	if (g_sim.f.rnr_permille && rnd(e) % 1000 < g_sim.f.rnr_permille) {
		atomic_fetch_add(&g_sim.st.rnr_injected, 1);
		return false;
	}
	pthread_mutex_lock(&qp->rq_lock);
	if (qp->rq_count) {
		*out = qp->rq[qp->rq_head];
		qp->rq_head = (qp->rq_head + 1) % qp->max_recv_wr;
		qp->rq_count--;
		ok = true;
	}
	pthread_mutex_unlock(&qp->rq_lock);
	return ok;
}

static void recv_cqe(struct sim_qp *qp, const struct pkt *p, struct sim_cqe *c, uint8_t opcode)
{
	memset(c, 0, sizeof(*c));
	c->recv = true;
	c->qp_num = qp->ex.qp_base.qp_num;
	c->opcode = opcode;
	c->src_qp = p->sqpn;
	c->has_imm = p->flags & F_IMM;
	c->imm = p->imm;
	memcpy(c->sgid.raw, p->sgid, 16);
	c->slid = (uint16_t)sim_ah_for_gid(qp->ctx, &c->sgid, qp->ex.qp_base.pd);
}

static bool qp_accepts(struct sim_qp *qp, const struct pkt *p)
{
	enum ibv_qp_state s = qp->ex.qp_base.state;

	return p->qkey == qp->qkey && (s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD);
}

static void on_send(struct sim_engine *e, struct sim_qp *qp, struct pkt *p)
{
	struct sim_rwqe w;
	struct dest d = { .ctx = qp->ctx, .pd = qp->ex.qp_base.pd };
	int st;

	if (!qp_accepts(qp, p)) {
		reply(e, qp, p, ST_REMOTE_BAD_DEST_QPN);
		return;
	}
	if (!rq_pop(e, qp, &w)) {
		reply(e, qp, p, ST_REMOTE_RNR);
		return;
	}
	st = sge_check(qp->ctx, qp->ex.qp_base.pd, w.sge, w.nsge, p->len, IBV_ACCESS_LOCAL_WRITE);
	d.sge = w.sge;
	d.nsge = w.nsge;
	land(e, qp, p, st ? NULL : &d, (uint8_t)st, &w);
}

/* The status of an RDMA request against this process's memory; checks only. */
static uint8_t rdma_check(struct sim_qp *qp, struct pkt *p, int access)
{
	struct sim_ctx *ctx = qp->ctx;
	union ibv_gid g;
	uint8_t st = ST_OK;

	if (!qp->srd)
		return ST_REMOTE_BAD_STATUS;
	memcpy(g.raw, p->sgid, 16);
	if (sim_ah_for_gid(ctx, &g, qp->ex.qp_base.pd) == 0xffff)
		return ST_REMOTE_UNKNOWN_PEER; /* RDMA needs an address handle of the initiator */
	pthread_rwlock_rdlock(&ctx->mr_lock);
	if (!mr_for(ctx, p->rkey, qp->ex.qp_base.pd, p->raddr, p->total, access))
		st = ST_REMOTE_BAD_ADDRESS;
	pthread_rwlock_unlock(&ctx->mr_lock);
	return st;
}

static void write_done(struct sim_engine *e, struct sim_qp *qp, const struct pkt *p, uint8_t st)
{
	struct sim_cqe c;
	struct sim_rwqe w = { 0 };

	if (st == ST_OK && (p->flags & F_IMM)) {
		if (!qp->unsolicited_write_recv && !rq_pop(e, qp, &w)) {
			reply(e, qp, p, ST_REMOTE_RNR);
			return;
		}
		recv_cqe(qp, p, &c, IBV_WC_RECV_RDMA_WITH_IMM);
		c.wr_id = qp->unsolicited_write_recv ? 0 : w.wr_id;
		c.unsolicited = qp->unsolicited_write_recv;
		c.byte_len = (uint32_t)p->total;
		sim_cq_push((struct sim_cq *)qp->ex.qp_base.recv_cq, &c);
	}
	reply(e, qp, p, st);
}

/* A WRITE packet fully placed (or refused): count it towards its WRITE. */
static void write_piece_done(struct sim_engine *e, struct sim_qp *qp, const struct pkt *p, uint8_t st)
{
	struct reasm *r, **rp;

	if (p->total <= p->len && !p->off) {
		write_done(e, qp, p, st);
		return;
	}
	for (rp = &e->reasm; (r = *rp); rp = &r->next)
		if (r->qp == qp && r->op_id == p->op_id && r->sqpn == p->sqpn &&
		    r->attempt == p->attempt && !memcmp(r->sgid, p->sgid, 16))
			break;
	if (!r) {
		reply(e, qp, p, ST_REMOTE_BAD_STATUS);
		return;
	}
	r->got += p->len ? p->len : 0;
	if (st && !r->status)
		r->status = st;
	if (r->got >= r->total) {
		uint8_t s = r->status;

		*rp = r->next;
		free(r);
		write_done(e, qp, p, s);
	}
}

static void on_write(struct sim_engine *e, struct sim_qp *qp, struct pkt *p)
{
	struct dest d = { .ctx = qp->ctx, .pd = qp->ex.qp_base.pd, .key = p->rkey, .addr = p->raddr + p->off };
	struct reasm *r;
	bool lose;
	uint8_t st;

	if (!qp_accepts(qp, p)) {
		reply(e, qp, p, ST_REMOTE_BAD_DEST_QPN);
		return;
	}
	st = rdma_check(qp, p, IBV_ACCESS_REMOTE_WRITE);
	if (p->total > p->len || p->off) { /* several packets: note this one's arrival */
		for (r = e->reasm; r; r = r->next)
			if (r->qp == qp && r->op_id == p->op_id && r->sqpn == p->sqpn &&
			    r->attempt == p->attempt && !memcmp(r->sgid, p->sgid, 16))
				break;
		if (!r) {
			r = calloc(1, sizeof(*r));
			if (!r) {
				reply(e, qp, p, ST_REMOTE_BAD_STATUS);
				return;
			}
			r->qp = qp;
			memcpy(r->sgid, p->sgid, 16);
			r->sqpn = p->sqpn;
			r->attempt = p->attempt;
			r->op_id = p->op_id;
			r->total = p->total;
			r->next = e->reasm;
			e->reasm = r;
		}
		if (p->off < r->max_off)
			atomic_fetch_add(&g_sim.st.out_of_order, 1); /* after a later packet of it */
		if (p->off > r->max_off)
			r->max_off = p->off;
	}
	/* A defect on purpose: a piece the initiator marked (EFA_SIM_LOSE_WRITE_PERMILLE) is
	 * checked and acknowledged as placed while its bytes are dropped: what a device or
	 * provider bug that loses data looks like to the application. */
	lose = (p->flags & F_LOSE) && st == ST_OK;
	if (lose) {
		atomic_fetch_add(&g_sim.st.lost_pieces, 1);
		atomic_fetch_add(&g_sim.st.lost_bytes, p->len);
		if (p->off)
			atomic_fetch_add(&g_sim.st.lost_inside, 1);
		sim_log(1, "fault: QP %u dropped %u bytes at offset %llu of a %llu-byte WRITE\n",
			qp->ex.qp_base.qp_num, p->len, (unsigned long long)p->off,
			(unsigned long long)p->total);
	}
	land(e, qp, p, st || lose ? NULL : &d, st, NULL);
}

static void on_read_req(struct sim_engine *e, struct sim_qp *qp, struct pkt *p)
{
	uint64_t size = pkt_size(qp->ctx), npkt, i, off = 0;
	struct txpkt **v;
	uint8_t st;

	if (!qp_accepts(qp, p)) {
		reply(e, qp, p, ST_REMOTE_BAD_DEST_QPN);
		return;
	}
	st = rdma_check(qp, p, IBV_ACCESS_REMOTE_READ);
	if (st || !p->total) {
		reply(e, qp, p, st);
		return;
	}
	npkt = (p->total + size - 1) / size;
	v = malloc(npkt * sizeof(*v));
	if (!v) {
		reply(e, qp, p, ST_REMOTE_BAD_STATUS);
		return;
	}
	for (i = 0; i < npkt; i++, off += size) {
		struct txpkt *t = v[i] = tx_new(qp, p->sgid, p->sqpn);

		if (!t) {
			while (i--)
				free(v[i]);
			free(v);
			reply(e, qp, p, ST_REMOTE_BAD_STATUS);
			return;
		}
		/* The response reads the region as it leaves. */
		t->src = SRC_MR;
		t->src_key = p->rkey;
		t->src_va = p->raddr + off;
		t->p.type = P_READ_RESP;
		t->p.op_id = p->op_id;
		t->p.attempt = p->attempt;
		t->p.total = p->total;
		t->p.off = off;
		t->p.len = (uint32_t)(p->total - off < size ? p->total - off : size);
	}
	tx_enqueue_shuffled(e, v, npkt);
	free(v);
}

static void on_answer(struct sim_engine *e, struct pkt *p)
{
	struct sim_op *op = op_find(e, p->op_id);

	saw_responder(e, p->sgid, p->sqpn);
	if (!op || op->attempt != p->attempt || op->dqpn != p->sqpn || memcmp(op->dgid.raw, p->sgid, 16))
		return; /* a late answer to an operation already completed or resent */
	if (p->type == P_READ_RESP) {
		struct dest d = { .ctx = op->qp->ctx, .pd = op->qp->ex.qp_base.pd, .sge = op->sge,
				  .nsge = op->nsge, .off = p->off };

		op->deadline = sim_now_ns() + (uint64_t)g_sim.f.timeout_ms * 1000000;
		land(e, op->qp, p, &d, ST_OK, NULL);
		return;
	}
	if (p->status == ST_REMOTE_RNR && op->rnr_left) {
		if (op->rnr_left != 7)
			op->rnr_left--;
		op->attempt++;
		op->resend_at = sim_now_ns() + (uint64_t)g_sim.f.rnr_delay_us * 1000;
		op->deadline = op->resend_at + (uint64_t)g_sim.f.timeout_ms * 1000000;
		op->waiting_resend = true;
		op->wnext = e->resend;
		e->resend = op;
		return;
	}
	op_complete(e, op, p->status);
}

/* The second step of a placement, then what the packet completes (`dying`: its QP is
 * being destroyed and answers what reached it). */
static void later_run(struct sim_engine *e, struct later *l, bool dying)
{
	struct sim_qp *qp = l->qp;
	struct pkt *p = &l->p;

	if (!dying && !atomic_load(&qp->alive))
		return;
	switch (p->type) {
	case P_WRITE: {
		struct dest d = { .ctx = qp->ctx, .pd = qp->ex.qp_base.pd, .key = p->rkey,
				  .addr = p->raddr + p->off };

		if (!l->placed) {
			place(e, &d, p->data, p->len, 2, in_order_128(qp));
			atomic_fetch_add(&g_sim.st.late_pieces, 1);
		}
		write_piece_done(e, qp, p, l->status);
		break;
	}
	case P_SEND: {
		struct dest d = { .ctx = qp->ctx, .pd = qp->ex.qp_base.pd, .sge = l->w.sge, .nsge = l->w.nsge };
		struct sim_cqe c;

		if (!l->placed) {
			place(e, &d, p->data, p->len, 2, in_order_128(qp));
			atomic_fetch_add(&g_sim.st.late_pieces, 1);
		}
		recv_cqe(qp, p, &c, IBV_WC_RECV);
		c.wr_id = l->w.wr_id;
		c.byte_len = p->len;
		c.status = l->status;
		sim_cq_push((struct sim_cq *)qp->ex.qp_base.recv_cq, &c);
		reply(e, qp, p,
		      l->status == ST_OK ? ST_OK
		      : l->status == ST_LOCAL_BAD_LENGTH ? ST_REMOTE_BAD_LENGTH : ST_REMOTE_BAD_STATUS);
		break;
	}
	case P_READ_RESP: {
		struct sim_op *op = op_find(e, p->op_id);

		if (!op || op->attempt != p->attempt)
			return;
		if (!l->placed) {
			struct dest d = { .ctx = qp->ctx, .pd = qp->ex.qp_base.pd, .sge = op->sge,
					  .nsge = op->nsge, .off = p->off };

			place(e, &d, p->data, p->len, 2, in_order_128(qp));
			atomic_fetch_add(&g_sim.st.late_pieces, 1);
		}
		op->got += p->len;
		if (op->got >= op->len)
			op_complete(e, op, ST_OK);
		break;
	}
	}
}

static void run_later(struct sim_engine *e, uint64_t now)
{
	while (e->nheap && e->heap[0]->due <= now) {
		struct later *l = heap_pop(e);

		later_run(e, l, false);
		free(l);
	}
}

static void on_packet(struct sim_engine *e, struct sim_qp *qp, struct pkt *p, size_t n)
{
	sim_log(3, "QP %u: packet type %u from QP %u op %llu attempt %u len %u off %llu total %llu status %u\n",
		qp->ex.qp_base.qp_num, p->type, p->sqpn, (unsigned long long)p->op_id, p->attempt, p->len,
		(unsigned long long)p->off, (unsigned long long)p->total, p->status);
	if (n < sizeof(*p) || p->magic != MAGIC || n != sizeof(*p) + p->len ||
	    p->dqpn != qp->ex.qp_base.qp_num) {
		sim_log(0, "QP %u: dropped a malformed packet\n", qp->ex.qp_base.qp_num);
		return;
	}
	switch (p->type) {
	case P_SEND:
		on_send(e, qp, p);
		break;
	case P_WRITE:
		on_write(e, qp, p);
		break;
	case P_READ_REQ:
		on_read_req(e, qp, p);
		break;
	case P_READ_RESP:
	case P_ACK:
		on_answer(e, p);
		break;
	}
}

/* ---- the loop ---- */

static void tx_fail(struct sim_engine *e, struct txpkt *t, uint8_t status)
{
	struct sim_op *op;

	if (t->p.type == P_ACK || t->p.type == P_READ_RESP)
		return; /* an answer to a peer that is gone */
	op = op_find(e, t->p.op_id);
	if (op && op->attempt == t->p.attempt)
		op_complete(e, op, status);
}

/* Whether a GID is one of the fabric's devices (whose host is therefore up): the layout
 * of the simulator's GIDs, on any host. */
static bool known_gid(const uint8_t *gid)
{
	int i;

	for (i = 0; i < g_sim.ndev; i++)
		if (!memcmp(g_sim.devs[i].gid.raw, gid, 6) && !memcmp(g_sim.devs[i].gid.raw + 8, gid + 8, 8))
			return true;
	return false;
}

/*
 * The wire form of `t` in e->txbuf, its payload read now from where it comes from; its
 * size, or 0 when the packet no longer has a reason to leave (its operation ended).
 */
static size_t tx_build(struct sim_engine *e, struct txpkt *t)
{
	struct pkt *w = (struct pkt *)e->txbuf;

	*w = t->p;
	if (t->src == SRC_OP) {
		struct sim_op *op = op_find(e, t->p.op_id);
		int st;

		if (!op || op->attempt != t->p.attempt)
			return 0; /* completed, failed or resent meanwhile */
		if (op->inl)
			memcpy(w->data, op->inline_data + t->p.off, t->p.len);
		else if ((st = sge_read(t->from->ctx, t->from->ex.qp_base.pd, op->sge, op->nsge, t->p.off,
					w->data, t->p.len))) {
			op_complete(e, op, (uint8_t)st); /* deregistered while in flight */
			return 0;
		}
	} else if (t->src == SRC_MR) {
		struct sim_ctx *ctx = t->from->ctx;
		struct sim_mr *mr;

		pthread_rwlock_rdlock(&g_sim.dma_lock);
		pthread_rwlock_rdlock(&ctx->mr_lock);
		mr = mr_for(ctx, t->src_key, t->from->ex.qp_base.pd, t->src_va, t->p.len, IBV_ACCESS_REMOTE_READ);
		if (mr)
			sim_dma_get(mr, mr_va(mr, t->src_va), w->data, t->p.len);
		pthread_rwlock_unlock(&ctx->mr_lock);
		pthread_rwlock_unlock(&g_sim.dma_lock);
		if (!mr) { /* deregistered while the READ was answered: fail it */
			w->type = P_ACK;
			w->status = ST_REMOTE_BAD_ADDRESS;
			w->len = 0;
		}
	} else {
		w->len = 0;
	}
	return sizeof(*w) + w->len;
}

/* Send what is ready; returns how long to wait before trying again (ns), 0 for no wait. */
static uint64_t transmit(struct sim_engine *e)
{
	unsigned window = g_sim.f.reorder > 1 ? g_sim.f.reorder : 1;
	uint64_t now = sim_now_ns(), wait = UINT64_MAX;
	unsigned budget = 4096;

	while (e->tx_head && budget--) {
		struct txpkt *ready[64], *t;
		unsigned n = 0, scanned = 0, k;
		size_t size;

		if (window > 64)
			window = 64;
		for (t = e->tx_head; t && n < window && scanned < 4 * window + 64; t = t->next, scanned++) {
			if (t->ready_at <= now)
				ready[n++] = t;
			else if (t->ready_at - now < wait)
				wait = t->ready_at - now;
		}
		if (!n)
			break;
		k = n == 1 ? 0 : (unsigned)(rnd(e) % n);
		t = ready[k];
		if (atomic_load(&g_sim.dead)) {
			tx_unlink(e, t);
			free(t);
			continue;
		}
		size = tx_build(e, t);
		if (!size) {
			tx_unlink(e, t);
			free(t);
			continue;
		}
		if (sendto(t->from->fd, e->txbuf, size, MSG_DONTWAIT, (struct sockaddr *)&t->to, t->tolen) < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
				/* the receiver's queue is full: retry this one shortly (reading it again) */
				t->ready_at = now + 100000;
				if (wait > 100000)
					wait = 100000;
				if (n == 1 && t == e->tx_head && !t->next)
					break;
				continue;
			}
			tx_unlink(e, t);
			/* no such QP: the peer process is gone (or never was) */
			tx_fail(e, t, known_gid(t->to_gid)
					      ? ST_REMOTE_BAD_DEST_QPN : ST_LOCAL_UNREACH_REMOTE);
			free(t);
			continue;
		}
		tx_unlink(e, t);
		free(t);
		atomic_fetch_add(&g_sim.st.packets, 1);
		if (k)
			atomic_fetch_add(&g_sim.st.reordered, 1); /* it passed k older ready packets */
		if (g_sim.f.die_after && atomic_fetch_add(&g_sim.packets_sent, 1) + 1 >= g_sim.f.die_after &&
		    !atomic_exchange(&g_sim.dead, true)) {
			atomic_store(&g_sim.st.silent, 1);
			sim_log(0, "fault: this process's devices go silent after %u packets\n",
				g_sim.f.die_after);
		}
	}
	if (e->tx_head && wait == UINT64_MAX)
		wait = 0;
	return wait;
}

/* Ops with no answer for too long fail: the peer is unresponsive or unreachable. */
static void sweep(struct sim_engine *e, uint64_t now)
{
	unsigned i;

	for (i = 0; i < HASH; i++) {
		struct sim_op *op = e->ops[i], *next;

		for (; op; op = next) {
			next = op->next;
			if (now > op->deadline && !op->waiting_resend)
				op_complete(e, op, responded(e, op->dgid.raw, op->dqpn) ? ST_LOCAL_UNRESP_REMOTE
											: ST_LOCAL_UNREACH_REMOTE);
		}
	}
}

/*
 * A QP being destroyed: what already reached it is handled and answered, and its answers
 * leave now, as the device acknowledges arrivals whatever the process does next; then its
 * socket closes, and later packets find no QP (REMOTE_ERROR_BAD_DEST_QPN at their sender).
 */
static void farewell(struct sim_engine *e, struct sim_qp *qp)
{
	uint64_t give_up = sim_now_ns() + 200000000ull;
	struct txpkt *t, *tn;
	ssize_t n;
	unsigned i;

	while ((n = recv(qp->fd, e->rxbuf, sizeof(struct pkt) + MAXPKT, MSG_DONTWAIT)) >= 0)
		if (!atomic_load(&g_sim.dead))
			on_packet(e, qp, (struct pkt *)e->rxbuf, (size_t)n);
	/* Its placements finish now (they answer their senders). */
	for (i = 0; i < e->nheap;) {
		if (e->heap[i]->qp == qp) {
			struct later *l = e->heap[i];

			e->heap[i] = e->heap[--e->nheap];
			later_run(e, l, true);
			free(l);
		} else {
			i++;
		}
	}
	for (i = e->nheap / 2 + 1; i-- > 0;)
		heap_down(e, i);
	for (t = e->tx_head; t; t = tn) {
		size_t size;

		tn = t->next;
		if (t->from != qp || (t->p.type != P_ACK && t->p.type != P_READ_RESP))
			continue;
		size = tx_build(e, t);
		while (size && !atomic_load(&g_sim.dead) &&
		       sendto(qp->fd, e->txbuf, size, MSG_DONTWAIT, (struct sockaddr *)&t->to, t->tolen) < 0 &&
		       (errno == EAGAIN || errno == ENOBUFS) && sim_now_ns() < give_up)
			usleep(100);
		tx_unlink(e, t);
		free(t);
	}
	close(qp->fd);
	qp->fd = -1;
}

/* Flush and drop everything that belongs to queue pairs being destroyed. */
static void purge_dead(struct sim_engine *e)
{
	struct txpkt *t, *tn;
	struct reasm *r, **rp;
	struct sim_op **pp;
	unsigned i;

	for (i = 1; i < e->npfd; i++)
		if (!atomic_load(&e->pqp[i]->alive) && e->pqp[i]->fd >= 0)
			farewell(e, e->pqp[i]);

	for (t = e->tx_head; t; t = tn) {
		tn = t->next;
		if (!atomic_load(&t->from->alive)) {
			tx_unlink(e, t);
			free(t);
		}
	}
	for (rp = &e->reasm; (r = *rp);) {
		if (!atomic_load(&r->qp->alive)) {
			*rp = r->next;
			free(r);
		} else {
			rp = &r->next;
		}
	}
	heap_purge(e);
	for (pp = &e->resend; *pp;) {
		if (!atomic_load(&(*pp)->qp->alive))
			*pp = (*pp)->wnext;
		else
			pp = &(*pp)->wnext;
	}
	for (i = 0; i < HASH; i++)
		for (pp = &e->ops[i]; *pp;) {
			struct sim_op *op = *pp;

			if (!atomic_load(&op->qp->alive)) {
				*pp = op->next;
				e->nops--;
				op_flush(op);
			} else {
				pp = &op->next;
			}
		}
}

static int rebuild_pollfds(struct sim_ctx *ctx, struct sim_engine *e)
{
	struct sim_qp *qp;
	unsigned n = 1;

	pthread_mutex_lock(&ctx->qp_lock);
	for (qp = ctx->qps; qp; qp = qp->next)
		n++;
	free(e->pfd);
	free(e->pqp);
	e->pfd = calloc(n, sizeof(*e->pfd));
	e->pqp = calloc(n, sizeof(*e->pqp));
	if (!e->pfd || !e->pqp) {
		pthread_mutex_unlock(&ctx->qp_lock);
		e->npfd = 0;
		return -1;
	}
	e->pfd[0].fd = ctx->wake_fd;
	e->pfd[0].events = POLLIN;
	n = 1;
	for (qp = ctx->qps; qp; qp = qp->next) {
		e->pfd[n].fd = qp->fd;
		e->pfd[n].events = POLLIN;
		e->pqp[n++] = qp;
	}
	e->npfd = n;
	e->qp_gen = atomic_load(&ctx->qp_gen);
	pthread_mutex_unlock(&ctx->qp_lock);
	return 0;
}

static void *engine_main(void *arg)
{
	struct sim_ctx *ctx = arg;
	struct sim_engine *e = ctx->eng;

	while (!atomic_load(&ctx->stop)) {
		struct sim_op *op, *next;
		uint64_t now, wait;
		unsigned i;
		struct timespec ts;

		atomic_fetch_add(&ctx->epoch, 1);
		if (e->qp_gen != atomic_load(&ctx->qp_gen) || !e->pfd) {
			/* Keep the old table until the dead QPs said farewell. */
			purge_dead(e);
			if (rebuild_pollfds(ctx, e)) {
				usleep(1000);
				continue;
			}
		}
		/* new work requests */
		pthread_mutex_lock(&ctx->newq_lock);
		op = ctx->newq_head;
		ctx->newq_head = ctx->newq_tail = NULL;
		pthread_mutex_unlock(&ctx->newq_lock);
		for (; op; op = next) {
			next = op->next;
			op->next = NULL;
			if (!atomic_load(&op->qp->alive)) {
				op_flush(op);
				continue;
			}
			op_start(e, op);
		}
		/* resends after RNR */
		now = sim_now_ns();
		{
			struct sim_op **pp = &e->resend;

			while (*pp) {
				op = *pp;
				if (op->resend_at <= now) {
					*pp = op->wnext;
					op->waiting_resend = false;
					op_transmit(e, op);
				} else {
					pp = &op->wnext;
				}
			}
		}
		/* second steps of placements that are due */
		run_later(e, now);
		if (now - e->last_sweep > 10000000ull) {
			e->last_sweep = now;
			sweep(e, now);
		}
		wait = transmit(e);
		for (op = e->resend; op; op = op->wnext) {
			uint64_t d = op->resend_at > now ? op->resend_at - now : 0;

			if (d < wait)
				wait = d;
		}
		if (e->nheap) {
			uint64_t d = e->heap[0]->due > now ? e->heap[0]->due - now : 0;

			if (d < wait)
				wait = d;
		}
		/* Wake for the timeout sweep while operations are out; sleep longer when idle. */
		if (wait > (e->nops ? 10000000ull : 200000000ull))
			wait = e->nops ? 10000000ull : 200000000ull;
		ts.tv_sec = (time_t)(wait / 1000000000ull);
		ts.tv_nsec = (long)(wait % 1000000000ull);
		if (ppoll(e->pfd, e->npfd, &ts, NULL) <= 0)
			continue;
		if (e->pfd[0].revents & POLLIN) {
			uint64_t v;

			if (read(ctx->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				sim_log(0, "wake: %s\n", strerror(errno));
		}
		for (i = 1; i < e->npfd; i++) {
			unsigned burst;

			if (!(e->pfd[i].revents & POLLIN))
				continue;
			for (burst = 0; burst < 64; burst++) {
				ssize_t n = recv(e->pfd[i].fd, e->rxbuf, sizeof(struct pkt) + MAXPKT, MSG_DONTWAIT);

				if (n < 0)
					break;
				if (atomic_load(&g_sim.dead))
					continue;
				if (!atomic_load(&e->pqp[i]->alive))
					continue;
				on_packet(e, e->pqp[i], (struct pkt *)e->rxbuf, (size_t)n);
			}
		}
	}
	return NULL;
}

void sim_engine_wake(struct sim_ctx *ctx)
{
	uint64_t one = 1;

	if (write(ctx->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		sim_log(0, "wake: %s\n", strerror(errno));
}

bool sim_engine_quiesce(struct sim_ctx *ctx)
{
	unsigned e0 = atomic_load(&ctx->epoch);
	uint64_t deadline = sim_now_ns() + 5000000000ull;

	if (pthread_equal(pthread_self(), ctx->thread))
		return true;
	while ((int)(atomic_load(&ctx->epoch) - e0) < 2) {
		if (sim_now_ns() > deadline) {
			sim_log(0, "the progress engine did not come round in 5 s\n");
			return false;
		}
		sim_engine_wake(ctx);
		usleep(200);
	}
	return true;
}

int sim_engine_start(struct sim_ctx *ctx)
{
	struct sim_engine *e = calloc(1, sizeof(*e));

	if (!e)
		return -1;
	e->rxbuf = malloc(sizeof(struct pkt) + MAXPKT);
	e->txbuf = malloc(sizeof(struct pkt) + MAXPKT);
	ctx->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!e->rxbuf || !e->txbuf || ctx->wake_fd < 0) {
		free(e->rxbuf);
		free(e->txbuf);
		free(e);
		if (ctx->wake_fd >= 0)
			close(ctx->wake_fd);
		errno = ENOMEM;
		return -1;
	}
	/* Seeded: the same seed gives the same sequence of decisions for a device. */
	e->rng = (g_sim.f.seed + 1) * 0x9e3779b97f4a7c15ull ^
		 ((uint64_t)ctx->dev->index << 32) ^ atomic_fetch_add(&ctx_counter, 1);
	if (!e->rng)
		e->rng = 1;
	ctx->eng = e;
	if (pthread_create(&ctx->thread, NULL, engine_main, ctx)) {
		close(ctx->wake_fd);
		free(e->rxbuf);
		free(e->txbuf);
		free(e);
		errno = EAGAIN;
		return -1;
	}
	ctx->thread_started = true;
	return 0;
}

bool sim_engine_stop(struct sim_ctx *ctx)
{
	struct sim_engine *e = ctx->eng;
	struct timespec ts;
	unsigned i;

	if (!ctx->thread_started)
		return true;
	atomic_store(&ctx->stop, true);
	sim_engine_wake(ctx);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	if (pthread_timedjoin_np(ctx->thread, NULL, &ts)) {
		sim_log(0, "the progress engine did not stop in 5 s; leaving it\n");
		pthread_detach(ctx->thread);
		return false;
	}
	while (e->tx_head) {
		struct txpkt *t = e->tx_head;

		tx_unlink(e, t);
		free(t);
	}
	while (e->reasm) {
		struct reasm *r = e->reasm;

		e->reasm = r->next;
		free(r);
	}
	for (i = 0; i < e->nheap; i++)
		free(e->heap[i]);
	free(e->heap);
	for (i = 0; i < HASH; i++)
		while (e->ops[i]) {
			struct sim_op *op = e->ops[i];

			e->ops[i] = op->next;
			free(op);
		}
	close(ctx->wake_fd);
	free(e->pfd);
	free(e->pqp);
	free(e->rxbuf);
	free(e->txbuf);
	free(e);
	ctx->eng = NULL;
	return true;
}
