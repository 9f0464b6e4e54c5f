/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * efa-sim: a user-space stand-in for rdma-core's EFA device (libibverbs.so.1 and
 * libefa.so.1), so that libfabric's unmodified efa provider runs without hardware.
 * See README.md for what it models and what it does not.
 */
#ifndef EFA_SIM_H
#define EFA_SIM_H

#include <infiniband/verbs.h>
#include <infiniband/efadv.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

/* EFA completion status codes (rdma-core efa_io_defs.h, libfabric efa_errno.h). */
enum {
	ST_OK = 0,
	ST_FLUSHED = 1,
	ST_LOCAL_QP_INTERNAL = 2,
	ST_LOCAL_UNSUPPORTED_OP = 3,
	ST_LOCAL_INVALID_AH = 4,
	ST_LOCAL_INVALID_LKEY = 5,
	ST_LOCAL_BAD_LENGTH = 6,
	ST_REMOTE_BAD_ADDRESS = 7,
	ST_REMOTE_ABORT = 8,
	ST_REMOTE_BAD_DEST_QPN = 9,
	ST_REMOTE_RNR = 10,
	ST_REMOTE_BAD_LENGTH = 11,
	ST_REMOTE_BAD_STATUS = 12,
	ST_LOCAL_UNRESP_REMOTE = 13,
	ST_REMOTE_UNKNOWN_PEER = 14,
	ST_LOCAL_UNREACH_REMOTE = 15,
};

/* Device capability bits as the device reports them (efadv_device_attr.device_caps). */
#define SIM_CAPS_ALL                                                                      \
	(EFADV_DEVICE_ATTR_CAPS_RDMA_READ | EFADV_DEVICE_ATTR_CAPS_RNR_RETRY |             \
	 EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID | EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE |          \
	 EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV)
/*
 * The kernel's EFA_QUERY_DEVICE_CAPS_DATA_POLLING_128, which rdma-core reports through
 * ibv_query_qp_data_in_order() only (efadv has no bit for it): each 128-byte aligned block
 * of a WRITE lands in order and once. Kept in device_caps above the efadv bits.
 */
#define SIM_CAP_DATA_POLLING_128 (1u << 31)

/* Attributes of one device, from the device file. */
struct sim_attr {
	uint32_t vendor_id, vendor_part_id, hw_ver;
	char fw_ver[64];
	uint64_t max_mr_size;
	int max_qp, max_qp_wr, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_ah;
	uint32_t max_sq_wr, max_rq_wr;
	uint16_t max_sq_sge, max_rq_sge, inline_buf_size;
	uint32_t device_caps, max_rdma_size;
	uint32_t max_msg_sz;
	uint8_t active_speed, active_width;
	int numa_node;
};

/* Fault knobs: from the device file, overridden by EFA_SIM_* variables. */
struct sim_faults {
	uint64_t seed;
	unsigned reorder;       /* window: each packet leaves at a random place among this many */
	unsigned delay_us;      /* each packet waits a random 0..delay_us before it leaves */
	unsigned rnr_permille;  /* arrivals that need a receive answered RNR though one is posted */
	unsigned die_after;     /* after this many packets sent, this process's devices go silent */
	unsigned timeout_ms;    /* an operation without any answer for this long fails */
	unsigned rnr_delay_us;  /* device RNR retry interval */
	unsigned lose_write_permille; /* WRITEs without immediate acknowledged but not placed: a
				       * device defect, for checks that must catch it */
	/* How strict the device is (defaults: as the hardware). */
	unsigned pkt_size;      /* bytes of payload a packet carries (0: the device's MTU) */
	unsigned pin;           /* registration pins the pages (0: the engine follows the mapping) */
};

struct sim_dev {
	struct ibv_device ibdev; /* first: ibv_device pointers are sim_dev pointers */
	char pci[32];            /* dddd:bb:dd.f */
	char path[256];          /* the PCI bridges above it, "dddd:bb:dd.f/..." from the root port */
	union ibv_gid gid;
	uint64_t guid;
	struct sim_attr a;
	int index;
	_Atomic uint64_t *keys; /* the device's key counter, shared by the fabric's processes */
	uint64_t key_seed;
};

/*
 * What the device did, per process, printed at exit (sim_stats_write): each fault knob's
 * effect next to its setting, so a script can tell a knob that was on from one that acted.
 */
struct sim_stats {
	atomic_ullong packets;       /* packets sent */
	atomic_ullong reordered;     /* packets that left ahead of an older ready one (reorder) */
	atomic_ullong delayed;       /* packets held back by a non-zero delay (delay_us) */
	atomic_ullong rnr_injected;  /* arrivals answered RNR by the knob (rnr_permille) */
	atomic_ullong writes_lost;   /* WRITEs marked lost at the initiator (lose_write_permille) */
	atomic_ullong lost_pieces;   /* pieces of them whose bytes the target dropped */
	atomic_ullong lost_bytes;
	atomic_ullong lost_inside;   /* lost pieces that did not start at the WRITE's first byte */
	atomic_ullong silent;        /* 1 once this process's devices went silent (die_after) */
	/* what the device did where it is stricter than a copy at post would be */
	atomic_ullong out_of_order;  /* WRITE packets that arrived after a later packet of theirs */
	atomic_ullong late_pieces;   /* packets whose second placement step came later */
	atomic_ullong pinned;        /* pages registration moved onto pinned memory */
	atomic_ullong dma_unmapped;  /* DMA bytes to/from pinned pages the process no longer maps */
	atomic_ullong bad_key;       /* accesses refused: no such key, or a key of another PD */
	atomic_ullong pd_mismatch;   /*   of which the key was valid but in another PD */
	atomic_ullong cq_overrun;    /* completions written over unpolled ones (CQ too small) */
	atomic_ullong flushed;       /* work requests flushed by ibv_destroy_qp */
	atomic_ullong stale_cqe;     /* polls that met a destroyed QP's completion (EINVAL) */
	atomic_ullong gpu_mrs;       /* registrations of GPU memory (gpu.c) */
	atomic_ullong gpu_dmabuf;    /*   of which dmabufs (ibv_reg_dmabuf_mr) */
	atomic_ullong gpu_put;       /* bytes the device wrote into GPU memory (CUDA copies) */
	atomic_ullong gpu_get;       /* bytes the device read out of GPU memory */
};

/* A PCI function of the device file that is not a simulated NIC (a GPU): for sysfs. */
struct sim_pcifn {
	char addr[16];
	uint32_t cls, vendor, device;
	int numa;
	char bridges[256];
};

struct sim_global {
	struct sim_dev *devs;
	int ndev;
	struct sim_pcifn *pcis;
	int npci;
	struct sim_faults f;
	char ns[17];  /* hex id of this simulated "fabric" (same SYSFS_PATH, same fabric) */
	int log;
	atomic_uint packets_sent;
	atomic_bool dead;
	atomic_bool opened; /* a device was opened: sim_stats_write reports at exit */
	struct sim_stats st;
	unsigned host;      /* EFA_SIM_HOST: which simulated host this process is on */
	char sysfs[4096];   /* the real path of SYSFS_PATH */
	/* DMA (read lock) against registration moving pages onto pinned memory (write lock) */
	pthread_rwlock_t dma_lock;
};
extern struct sim_global g_sim;

int sim_init(void); /* once; 0 or an errno */
uint32_t sim_next_key(struct sim_dev *d);
void sim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t sim_now_ns(void);

struct sim_ctx;

struct sim_pd {
	struct ibv_pd pd;
};

/*
 * A piece of a registered range: either on memory the registration pinned (`pinned`, a
 * mapping of its own that stays while the region lives, whatever the process does to its
 * own mapping, as the device's DMA to pinned pages does), or reached through the
 * process's mapping (partial pages at the ends of a range, stacks).
 */
struct sim_seg {
	uint64_t va, len;
	uint8_t *pinned;
};

struct sim_mr {
	struct ibv_mr mr;
	uint64_t iova;
	int access;
	int nseg;
	struct sim_seg *seg;
	bool gpu;     /* CUDA device memory (gpu.c): mr.addr is its device address */
	void *cuctx;  /* its CUcontext */
};

struct sim_ah {
	struct ibv_ah ah;
	union ibv_gid gid;
	uint16_t ahn;
};

struct sim_cqe {
	uint64_t wr_id;
	uint32_t qp_num, byte_len, src_qp, imm;
	uint16_t slid;
	uint8_t status;
	uint8_t opcode; /* enum ibv_wc_opcode as the device reports it */
	uint8_t phase;  /* the lap of the ring it was written in (see verbs.c) */
	bool recv, unsolicited, has_imm;
	union ibv_gid sgid;
};

struct sim_cq {
	struct ibv_cq_ex ex; /* first: ibv_cq and ibv_cq_ex pointers are sim_cq pointers */
	struct efadv_cq dv;
	struct sim_ctx *ctx;
	pthread_mutex_t lock; /* held from start_poll to end_poll, and to add entries */
	struct sim_cqe *ring;
	uint32_t cap;         /* a power of two */
	uint64_t prod, cons;  /* the device's and the reader's index */
	int nqp;              /* send and receive queues of live QPs that complete here */
	struct sim_qp *cur_qp;
	bool have_cur;
	bool armed;
	bool overflow_warned;
};

struct sim_rwqe {
	uint64_t wr_id;
	int nsge;
	struct ibv_sge sge[4];
};

struct sim_qp {
	struct ibv_qp_ex ex; /* first: ibv_qp and ibv_qp_ex pointers are sim_qp pointers */
	struct sim_ctx *ctx;
	struct sim_qp *next;
	atomic_bool alive;      /* false once ibv_destroy_qp has begun */
	int fd;                 /* this QP's datagram socket */
	uint32_t qkey;
	uint8_t rnr_retry;
	enum ibv_qp_state kstate; /* the state as the kernel knows it (ibv_modify_qp's checks) */
	bool srd, unsolicited_write_recv;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
	atomic_uint sq_outstanding; /* posted send WQEs whose completion is not yet polled */
	/* work-request session (wr_start .. wr_complete), under sq_lock */
	pthread_mutex_t sq_lock;
	int wr_err;
	struct sim_op *pending_head, *pending_tail, *cur;
	unsigned npending;
	/* receive queue */
	pthread_mutex_t rq_lock;
	struct sim_rwqe *rq;
	uint32_t rq_head, rq_count;
};

struct sim_comp_channel {
	struct ibv_comp_channel ch;
	int wfd; /* write end of the pipe whose read end is ch.fd */
};

/* An operation posted to a send queue, owned by the progress engine once posted. */
struct sim_op {
	struct sim_op *next;      /* pending list, then the engine's hash chain */
	struct sim_qp *qp;
	uint64_t wr_id, id;
	uint8_t kind;             /* OP_SEND, OP_WRITE, OP_READ */
	bool has_imm, inl;
	uint32_t imm;
	int nsge;
	struct ibv_sge sge[4];
	uint64_t len;
	union ibv_gid dgid;
	bool have_addr;
	uint32_t dqpn, dqkey, rkey;
	uint64_t raddr;
	/* engine state */
	uint32_t attempt, rnr_left;
	uint64_t got, deadline, resend_at;
	bool waiting_resend;
	struct sim_op *wnext; /* list of ops waiting for an RNR resend */
	uint8_t inline_data[];
};
enum { OP_SEND = 1, OP_WRITE, OP_READ };

struct sim_ctx {
	struct verbs_context vctx; /* ends with the ibv_context the application sees */
	struct sim_dev *dev;
	pthread_t thread;
	bool thread_started;
	int wake_fd; /* eventfd */
	atomic_bool stop;
	atomic_uint epoch; /* bumped at each engine loop; a destroy waits for it */
	/* new operations from wr_complete */
	pthread_mutex_t newq_lock;
	struct sim_op *newq_head, *newq_tail;
	/* queue pairs */
	pthread_mutex_t qp_lock;
	struct sim_qp *qps;
	atomic_uint qp_gen;
	/* memory regions: an open-addressing table by key (keys are unique per device) */
	pthread_rwlock_t mr_lock;
	struct sim_mr **mrs;
	uint32_t mrs_cap, mrs_used, nmr;
	/* address handles */
	pthread_mutex_t ah_lock;
	struct sim_ah **ahs;
	uint32_t nah;
	/* engine-private state lives in engine.c */
	struct sim_engine *eng;
};

static inline struct sim_ctx *to_ctx(struct ibv_context *c)
{
	return (struct sim_ctx *)((char *)c - offsetof(struct sim_ctx, vctx.context));
}

/* engine.c */
int sim_engine_start(struct sim_ctx *ctx);
bool sim_engine_stop(struct sim_ctx *ctx);
void sim_engine_wake(struct sim_ctx *ctx);
bool sim_engine_quiesce(struct sim_ctx *ctx);
int sim_qp_bind(struct sim_qp *qp);
void sim_cq_push(struct sim_cq *cq, const struct sim_cqe *e);

/* verbs.c */
struct sim_mr *sim_mr_lookup_locked(struct sim_ctx *ctx, uint32_t key, struct ibv_pd *pd);
struct sim_qp *sim_qp_by_num(struct sim_ctx *ctx, uint32_t qpn);

/* pin.c: registration's view of memory, and the device's DMA into it */
int sim_pin(struct sim_mr *mr, void *addr, size_t len, bool write, bool remote);
void sim_unpin(struct sim_mr *mr);
/*
 * A batch of DMA writes to pages reached through the process's mapping (one syscall);
 * pinned pages are copied at once. `ordered` (both kinds of page): the device's 128-byte
 * in-order capability, so the last 8 bytes of each 128-byte aligned block (an LL128
 * poller's flag) become visible only after the block's other bytes.
 * A plain copy does not promise that: glibc's memcpy of 128 bytes with 32-byte vectors
 * stores bytes 96-127 before 64-95, and the kernel's string copy orders no store inside it.
 */
struct sim_dma {
	struct iovec *l, *r;
	unsigned n, max;
	uint64_t bytes, short_bytes;
	bool ordered;
};
void sim_dma_put(struct sim_dma *d, struct sim_mr *mr, uint64_t va, const uint8_t *src, uint64_t n);
void sim_dma_flush(struct sim_dma *d);
uint64_t sim_dma_get(struct sim_mr *mr, uint64_t va, uint8_t *dst, uint64_t n);
int sim_ah_for_gid(struct sim_ctx *ctx, const union ibv_gid *gid, struct ibv_pd *pd);

/* gpu.c: GPU memory (CUDA device pointers and dmabufs), moved with CUDA copies */
int sim_gpu_reg_va(struct sim_mr *mr, uint64_t va, size_t len, bool *is_gpu);
int sim_gpu_reg_dmabuf(struct sim_mr *mr, int fd, uint64_t offset, size_t len, uint64_t iova);
int sim_gpu_put(struct sim_mr *mr, uint64_t va, const uint8_t *src, uint64_t n);
int sim_gpu_get(struct sim_mr *mr, uint64_t va, uint8_t *dst, uint64_t n);

/* The efadv functions, exported privately for libefa.so.1. */
int efasim_query_device(struct ibv_context *ibvctx, struct efadv_device_attr *attr,
			uint32_t inlen);
struct ibv_qp *efasim_create_qp_ex(struct ibv_context *ibvctx, struct ibv_qp_init_attr_ex *attr,
				   struct efadv_qp_init_attr *efa_attr, uint32_t inlen);
struct ibv_qp *efasim_create_driver_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr,
				       uint32_t driver_qp_type);
int efasim_query_ah(struct ibv_ah *ah, struct efadv_ah_attr *attr, uint32_t inlen);
struct ibv_cq_ex *efasim_create_cq(struct ibv_context *ibvctx, struct ibv_cq_init_attr_ex *attr,
				   struct efadv_cq_init_attr *efa_attr, uint32_t inlen);
struct efadv_cq *efasim_cq_from_ibv_cq_ex(struct ibv_cq_ex *cq);
int efasim_query_mr(struct ibv_mr *mr, struct efadv_mr_attr *attr, uint32_t inlen);

#endif
