// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim-hazards: code that breaks on EFA hardware, run against the simulated device.
 *
 * Each case is a small program with a defect that a gentle device hides (a send buffer
 * reused before its completion, a buffer polled by its last byte, a region freed while
 * registered, a key of another protection domain or process, a completion queue sized too
 * small, a QP destroyed with work in flight, a QP transition with a wrong attribute mask).
 * It prints one word: EXPOSED where the device behaved as the hardware does and the defect
 * showed, HIDDEN where the defect went unnoticed. `poll-128` (LL128-style polling of the
 * last 8 bytes of each 128-byte block) is a defect only on a device without the 128-byte
 * in-order capability: there it prints EXPOSED or HIDDEN, and on a device with it KEPT
 * (no block seen half written) or BROKEN.
 *
 *   efa-sim-hazards CASE [--expect WORD]   (exit 0 when the word is the expected one)
 *   efa-sim-hazards --list
 *
 * Run under ci/efa-sim.sh (efa-sim/hazards.sh runs every case with the environment each
 * needs). The device is driven through rdma-core's API directly: SRD QPs on two devices
 * (or two contexts of one) of one process, whose progress engines do the transfers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
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

static void die(const char *what, int err)
{
	fprintf(stderr, "efa-sim-hazards: %s: %s\n", what, strerror(err));
	exit(2);
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
	struct ibv_ah *ah; /* to the peer */
	uint32_t peer_qpn;
};

static struct ibv_device **devs;
static int ndev;

static struct ibv_context *open_dev(int i)
{
	struct ibv_context *c;

	if (!devs) {
		devs = ibv_get_device_list(&ndev);
		if (!devs || ndev < 1)
			die("no devices (run under ci/efa-sim.sh)", ENODEV);
	}
	c = ibv_open_device(devs[i % ndev]);
	if (!c)
		die("ibv_open_device", errno);
	return c;
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY };
	int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);

	if (!err) {
		a.qp_state = IBV_QPS_RTR;
		err = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
	if (!err) {
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	return err;
}

/* A side on context `ctx` (opened here from device `dev` when NULL), with its own PD unless
 * given one, its own CQ of `cqe` entries unless given one. */
static void side_open(struct side *s, int dev, struct ibv_context *ctx, struct ibv_pd *pd,
		      struct ibv_cq_ex *cq, int cqe)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = (uint32_t)cqe,
					  .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM };
	struct efadv_qp_init_attr ea = { .driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD };
	struct ibv_qp_init_attr_ex qa = { 0 };
	int err;

	memset(s, 0, sizeof(*s));
	s->ctx = ctx ? ctx : open_dev(dev);
	s->pd = pd ? pd : ibv_alloc_pd(s->ctx);
	if (!s->pd)
		die("ibv_alloc_pd", errno);
	s->cq = cq ? cq : ibv_create_cq_ex(s->ctx, &ca);
	if (!s->cq)
		die("ibv_create_cq_ex", errno);
	qa.qp_type = IBV_QPT_DRIVER;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = s->pd;
	qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(s->cq);
	qa.cap.max_send_wr = 256;
	qa.cap.max_recv_wr = 256;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
	s->qp = efadv_create_qp_ex(s->ctx, &qa, &ea, sizeof(ea));
	if (!s->qp)
		die("efadv_create_qp_ex", errno);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	err = to_rts(s->qp);
	if (err)
		die("ibv_modify_qp", err);
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid", errno);
}

/* Address handles both ways. */
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

static void *page_buf(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap", errno);
	return p;
}

static struct ibv_mr *reg(struct side *s, void *p, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(s->pd, p, len, ACC);

	if (!mr)
		die("ibv_reg_mr", errno);
	return mr;
}

static int post_write(struct side *a, struct ibv_mr *lmr, const void *src, size_t len, uint32_t rkey,
		      const void *dst, uint64_t wr_id)
{
	ibv_wr_start(a->qpx);
	a->qpx->wr_id = wr_id;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a->qpx, rkey, (uintptr_t)dst);
	ibv_wr_set_sge(a->qpx, lmr->lkey, (uintptr_t)src, (uint32_t)len);
	ibv_wr_set_ud_addr(a->qpx, a->ah, a->peer_qpn, QKEY);
	return ibv_wr_complete(a->qpx);
}

/* Poll up to `want` completions within `ms`: how many arrived, how many were errors, and
 * how many polls failed (a destroyed QP's completion). */
struct polled {
	int done, errors, poll_failed;
	enum ibv_wc_status last;
};

static struct polled poll_for(struct side *s, int want, int ms)
{
	struct ibv_poll_cq_attr pa = { 0 };
	struct polled r = { 0 };
	uint64_t end = now_ms() + (uint64_t)ms;

	while (r.done < want && now_ms() < end) {
		int err = ibv_start_poll(s->cq, &pa);

		if (err == ENOENT)
			continue;
		if (err) {
			r.poll_failed++;
			continue;
		}
		do {
			r.done++;
			if (s->cq->status != IBV_WC_SUCCESS) {
				r.errors++;
				r.last = s->cq->status;
			}
		} while (r.done < want && !(err = ibv_next_poll(s->cq)));
		ibv_end_poll(s->cq);
		if (err && err != ENOENT)
			r.poll_failed++;
	}
	return r;
}

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 7) | 1; /* never zero */
}

/* ---- the cases ---- */

/* A send buffer rewritten right after the post: the device reads it as packets leave. */
static const char *send_reuse(void)
{
	const size_t len = 1 << 20;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	struct polled r;
	size_t i;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	memset(src, 0xaa, len);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	if (post_write(&a, smr, src, len, dmr->rkey, dst, 1))
		die("post", EIO);
	memset(src, 0x55, len); /* the defect: reused before the completion */
	r = poll_for(&a, 1, 10000);
	if (r.done != 1 || r.errors)
		die("the WRITE did not complete", EIO);
	for (i = 0; i < len; i++)
		if (dst[i] == 0x55)
			return "EXPOSED";
	return "HIDDEN";
}

/* The receiver takes a buffer's last byte as the sign the whole buffer arrived. */
static const char *poll_last_byte(void)
{
	const size_t len = 48 * 1024;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	int it;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	for (it = 0; it < 50; it++) {
		volatile uint8_t *last = &dst[len - 1];
		uint64_t end = now_ms() + 10000;
		bool torn = false;
		size_t i;

		memset(dst, 0, len);
		fill(src, len, (uint8_t)it);
		if (post_write(&a, smr, src, len, dmr->rkey, dst, (uint64_t)it))
			die("post", EIO);
		while (!*last && now_ms() < end)
			;
		for (i = 0; i < len; i++)
			if (((volatile uint8_t *)dst)[i] == 0) {
				torn = true;
				break;
			}
		if (poll_for(&a, 1, 10000).done != 1)
			die("the WRITE did not complete", EIO);
		if (torn)
			return "EXPOSED";
	}
	return "HIDDEN";
}

/* LL128-style polling: the last 8 bytes of each 128-byte block are its flag. */
static const char *poll_128(void)
{
	const size_t len = 48 * 1024, nblk = len / 128;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	bool cap, torn = false;
	int it, caps;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	caps = ibv_query_qp_data_in_order(b.qp, IBV_WR_RDMA_WRITE, IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS);
	cap = caps & IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES;
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	/* A flag stored a few instructions early is seen in about one WRITE of 1000 (the
	 * simulator before e1db054: 20 WRITEs a run read BROKEN in 2% of runs, 1000 in 90%);
	 * where the device keeps the order, 1000 take 5 s. */
	for (it = 0; it < 1000 && !torn; it++) {
		uint64_t end = now_ms() + 10000;
		size_t seen = 0, k;
		bool *done = calloc(nblk, 1);

		memset(dst, 0, len);
		fill(src, len, (uint8_t)(it * 3));
		if (post_write(&a, smr, src, len, dmr->rkey, dst, (uint64_t)it))
			die("post", EIO);
		while (seen < nblk && now_ms() < end)
			for (k = 0; k < nblk; k++) {
				volatile uint8_t *blk = dst + k * 128;
				size_t j;

				if (done[k] || !blk[127])
					continue;
				done[k] = true;
				seen++;
				for (j = 0; j < 120; j++)
					if (blk[j] != src[k * 128 + j])
						torn = true;
			}
		free(done);
		if (poll_for(&a, 1, 10000).done != 1)
			die("the WRITE did not complete", EIO);
	}
	if (cap)
		return torn ? "BROKEN" : "KEPT";
	return torn ? "EXPOSED" : "HIDDEN";
}

/* A registered buffer freed, and new memory mapped at its address, while a peer writes to
 * it: the device writes to the pages it pinned, not to the new mapping. */
static const char *freed_remapped(void)
{
	const size_t len = 1 << 20;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len), *again;
	struct ibv_mr *smr, *dmr;
	struct polled r;
	size_t i;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	fill(src, len, 9);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	munmap(dst, len); /* the defect: freed while registered */
	again = mmap(dst, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != dst)
		die("mmap at the same address", errno);
	if (post_write(&a, smr, src, len, dmr->rkey, dst, 1))
		die("post", EIO);
	r = poll_for(&a, 1, 10000);
	if (r.done != 1 || r.errors)
		die("the WRITE did not complete", EIO);
	for (i = 0; i < len; i++)
		if (again[i])
			return "HIDDEN"; /* the new mapping got the bytes */
	return "EXPOSED";
}

/* A registered buffer freed while a peer writes to it: the device keeps writing to the
 * pinned pages; the process must survive and the WRITE completes. */
static const char *freed_unmapped(void)
{
	const size_t len = 1 << 20;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	struct polled r;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	fill(src, len, 5);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	munmap(dst, len);
	if (post_write(&a, smr, src, len, dmr->rkey, dst, 1))
		die("post", EIO);
	r = poll_for(&a, 1, 10000);
	/* Still here, and the device answered as it does for pinned pages. */
	return r.done == 1 && !r.errors ? "EXPOSED" : "HIDDEN";
}

/* Registering memory that is not mapped, or read-only memory for writing. */
static const char *reg_unmapped(void)
{
	struct side a;
	void *p = page_buf(1 << 16), *ro;
	struct ibv_mr *mr;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	munmap(p, 1 << 16);
	mr = ibv_reg_mr(a.pd, p, 1 << 16, ACC);
	if (mr || errno != EFAULT)
		return "HIDDEN";
	ro = mmap(NULL, 1 << 16, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	mr = ibv_reg_mr(a.pd, ro, 1 << 16, ACC);
	if (mr || errno != EFAULT)
		return "HIDDEN";
	return "EXPOSED";
}

/* A WRITE with the key of a region of another protection domain than the target QP's. */
static const char *key_other_pd(void)
{
	const size_t len = 1 << 16;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_pd *other;
	struct ibv_mr *smr, *dmr;
	struct polled r;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	other = ibv_alloc_pd(b.ctx);
	smr = reg(&a, src, len);
	dmr = ibv_reg_mr(other, dst, len, ACC);
	if (!other || !dmr)
		die("the other PD", errno);
	fill(src, len, 3);
	if (post_write(&a, smr, src, len, dmr->rkey, dst, 1))
		die("post", EIO);
	r = poll_for(&a, 1, 10000);
	return r.done == 1 && r.errors ? "EXPOSED" : "HIDDEN";
}

/* Two processes (here two contexts of one device) with the same layout: a WRITE that uses
 * its own region's key instead of the peer's. */
static const char *key_same_layout(void)
{
	const size_t len = 1 << 16;
	struct side x, y;
	uint8_t *xs = page_buf(len), *yd = page_buf(len);
	struct ibv_mr *xmr, *ymr;
	struct polled r;

	side_open(&x, 0, NULL, NULL, NULL, 64);
	side_open(&y, 0, NULL, NULL, NULL, 64); /* another context of the same device */
	link_sides(&x, &y);
	xmr = reg(&x, xs, len);
	ymr = reg(&y, yd, len);
	fill(xs, len, 11);
	if (post_write(&x, xmr, xs, len, xmr->rkey /* the defect */, yd, 1))
		die("post", EIO);
	r = poll_for(&x, 1, 10000);
	(void)ymr;
	return r.done == 1 && r.errors ? "EXPOSED" : "HIDDEN";
}

/* A completion queue of 16 entries for 64 outstanding WRITEs, polled only at the end. */
static const char *cq_too_small(void)
{
	const size_t len = 4096;
	struct side a, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	struct polled r;
	int i;

	side_open(&a, 0, NULL, NULL, NULL, 16);
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	for (i = 0; i < 64; i++)
		if (post_write(&a, smr, src, len, dmr->rkey, dst, (uint64_t)i))
			die("post", EIO);
	usleep(500000); /* every WRITE completes meanwhile */
	r = poll_for(&a, 64, 1000);
	return r.done < 64 ? "EXPOSED" : "HIDDEN";
}

/* A QP destroyed with WRITEs in flight while another QP still completes on its CQ. */
static const char *destroy_in_flight(void)
{
	const size_t len = 1 << 20;
	struct side a, a2, b;
	uint8_t *src = page_buf(len), *dst = page_buf(len);
	struct ibv_mr *smr, *dmr;
	struct polled r;
	int i;

	side_open(&a, 0, NULL, NULL, NULL, 256);
	side_open(&a2, 0, a.ctx, a.pd, a.cq, 0); /* shares a's CQ */
	side_open(&b, 1, NULL, NULL, NULL, 64);
	link_sides(&a, &b);
	smr = reg(&a, src, len);
	dmr = reg(&b, dst, len);
	for (i = 0; i < 16; i++)
		if (post_write(&a, smr, src, len, dmr->rkey, dst, (uint64_t)i))
			die("post", EIO);
	if (ibv_destroy_qp(a.qp)) /* the defect: work still in flight */
		die("ibv_destroy_qp", errno);
	r = poll_for(&a2, 1, 1000);
	return r.poll_failed ? "EXPOSED" : "HIDDEN";
}

/* QP transitions with a wrong attribute mask (RESET->INIT without the Q_Key, RTR->RTS
 * without the send PSN). */
static const char *modify_mask(void)
{
	struct side a;
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_RESET };
	int bad1, bad2;

	side_open(&a, 0, NULL, NULL, NULL, 64);
	if (ibv_modify_qp(a.qp, &at, IBV_QP_STATE))
		die("to RESET", errno);
	at.qp_state = IBV_QPS_INIT;
	at.port_num = 1;
	bad1 = ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT);
	at.qkey = QKEY;
	if (ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("to INIT", errno);
	at.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(a.qp, &at, IBV_QP_STATE))
		die("to RTR", errno);
	at.qp_state = IBV_QPS_RTS;
	bad2 = ibv_modify_qp(a.qp, &at, IBV_QP_STATE);
	return bad1 == EINVAL && bad2 == EINVAL ? "EXPOSED" : "HIDDEN";
}

static const struct {
	const char *name;
	const char *(*run)(void);
	const char *what;
} cases[] = {
	{ "send-reuse", send_reuse, "a send buffer rewritten before its WRITE completed" },
	{ "poll-last-byte", poll_last_byte, "a buffer polled by its last byte" },
	{ "poll-128", poll_128, "LL128-style polling of each 128-byte block's last 8 bytes" },
	{ "freed-remapped", freed_remapped, "a region freed and remapped while registered" },
	{ "freed-unmapped", freed_unmapped, "a region freed while registered and written to" },
	{ "reg-unmapped", reg_unmapped, "registering unmapped or read-only memory for writes" },
	{ "key-other-pd", key_other_pd, "a key of another protection domain" },
	{ "key-same-layout", key_same_layout, "a key of the wrong process with the same layout" },
	{ "cq-too-small", cq_too_small, "a completion queue sized too small" },
	{ "destroy-in-flight", destroy_in_flight, "a QP destroyed with work in flight, CQ shared" },
	{ "modify-mask", modify_mask, "QP transitions with a wrong attribute mask" },
};

int main(int argc, char **argv)
{
	const char *expect = NULL, *got;
	size_t i;

	if (argc == 2 && !strcmp(argv[1], "--list")) {
		for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			printf("%-18s %s\n", cases[i].name, cases[i].what);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[2], "--expect"))
		expect = argv[3];
	else if (argc != 2) {
		fprintf(stderr, "usage: efa-sim-hazards CASE [--expect WORD] | --list\n");
		return 2;
	}
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (!strcmp(argv[1], cases[i].name))
			break;
	if (i == sizeof(cases) / sizeof(cases[0])) {
		fprintf(stderr, "efa-sim-hazards: no case %s (--list)\n", argv[1]);
		return 2;
	}
	got = cases[i].run();
	printf("%s: %s (%s)\n", cases[i].name, got, cases[i].what);
	fflush(stdout);
	/* No cleanup: exiting is what a crashed or careless application does too. */
	exit(expect && strcmp(expect, got) ? 1 : 0);
}
