/*
 * rs_fi.h: the C side of libfabric-sys.
 *
 * libfabric implements most of its API as `static inline` functions in its headers (they
 * jump through the ops tables of each fid), so there are no symbols to link against. These
 * wrappers are real functions that Rust can call. They also hide every struct whose fields
 * moved between libfabric 1.x and 2.x (fi_mr_attr's mr_iov/dmabuf union and device union,
 * fi_domain_attr's data_progress/progress union, fid_nic's link attributes): Rust only sees
 * the flat `rs_fi_info_view` below and plain arguments, so the Rust side does not depend on
 * the libfabric version it was built against.
 */
#ifndef RS_FI_H
#define RS_FI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* ---- versions ---------------------------------------------------------------------- */

/* FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) of the headers this was compiled with. */
uint32_t rs_fi_header_version(void);
/* Whether the headers know FI_MR_DMABUF (libfabric >= 1.20). */
int rs_fi_have_mr_dmabuf(void);

/* ---- fi_info: hints and a flat, version-independent view ---------------------------- */

/*
 * Allocate hints for an FI_EP_RDM endpoint: caps, mode and mr_mode as given, at least
 * `cq_data_size` bytes of remote CQ data, the threading model given (enum fi_threading),
 * FI_AV_TABLE, tx/rx sizes where non-zero. NULL on allocation failure. Free with
 * fi_freeinfo.
 */
struct fi_info *rs_fi_rdm_hints(uint64_t caps, uint64_t mode, uint64_t mr_mode,
				size_t cq_data_size, size_t tx_size, size_t rx_size,
				int threading);

struct rs_fi_info_view {
	const char *prov_name;   /* fabric_attr->prov_name, e.g. "tcp;ofi_rxm" */
	const char *fabric_name; /* fabric_attr->name */
	const char *domain_name; /* domain_attr->name */
	uint64_t caps;
	uint64_t mode;
	uint64_t mr_mode;
	uint32_t addr_format;
	uint32_t prov_version;
	size_t src_addrlen;
	size_t max_msg_size;  /* ep_attr->max_msg_size */
	size_t tx_size;       /* tx_attr->size */
	size_t rx_size;       /* rx_attr->size */
	size_t inject_size;   /* tx_attr->inject_size */
	size_t cq_data_size;  /* domain_attr->cq_data_size */
	size_t mr_key_size;   /* domain_attr->mr_key_size */
	uint64_t link_speed;  /* nic->link_attr->speed in bit/s; 0 where unknown */
	int ep_type;          /* ep_attr->type */
	int threading;        /* domain_attr->threading (enum fi_threading) */
	uint32_t api_version; /* fabric_attr->api_version */
	uint64_t rx_mode;     /* rx_attr->mode */
	/* nic->bus_attr when it is a PCI function (has_pci = 1): what NICs are matched by. */
	int has_pci;
	uint16_t pci_domain;
	uint8_t pci_bus;
	uint8_t pci_device;
	uint8_t pci_function;
	const char *nic_name; /* nic->device_attr->name, e.g. "rdmap79s0"; NULL where absent */
	const char *nic_firmware; /* nic->device_attr->firmware; NULL where absent */
};

/* Fill `out` from `info`; missing sub-structs read as zero / NULL. */
void rs_fi_info_view(const struct fi_info *info, struct rs_fi_info_view *out);
/* info->next */
struct fi_info *rs_fi_info_next(const struct fi_info *info);

/* ---- object creation ------------------------------------------------------------------ */

int rs_fi_fabric(const struct fi_info *info, struct fid_fabric **fabric);
int rs_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain);
int rs_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep);
/* A CQ of `size` entries (0: provider default) in FI_CQ_FORMAT_DATA, no wait object. */
int rs_fi_cq_open_data(struct fid_domain *domain, size_t size, struct fid_cq **cq);
/* An FI_AV_TABLE address vector for about `count` peers. */
int rs_fi_av_open_table(struct fid_domain *domain, size_t count, struct fid_av **av);
int rs_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int rs_fi_enable(struct fid_ep *ep);
int rs_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int rs_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr,
		    uint64_t flags);
int rs_fi_close(struct fid *fid);
int rs_fi_setopt(struct fid *fid, int level, int optname, const void *optval, size_t optlen);

/*
 * Endpoint options (level FI_OPT_ENDPOINT) by their ABI numbers, which are stable across
 * releases: headers before 1.18 lack the names, while the library loaded at run time may
 * know them. A provider that does not know an option answers -FI_ENOPROTOOPT.
 */
#define RS_FI_OPT_CUDA_API_PERMITTED 10      /* bool, libfabric >= 1.18 */
#define RS_FI_OPT_SHARED_MEMORY_PERMITTED 11 /* bool, libfabric >= 1.18 */
#define RS_FI_OPT_MAX_MSG_SIZE 12            /* size_t, libfabric >= 1.20 */
#define RS_FI_OPT_MAX_RMA_SIZE 14            /* size_t, libfabric >= 1.20 */
/* efa's own (fi_ext.h): -(0xefa << 16) + n */
#define RS_FI_OPT_EFA_EMULATED_WRITE (-(0xefa << 16) + 2) /* bool */
#define RS_FI_OPT_EFA_USE_DEVICE_RDMA (-(0xefa << 16) + 4) /* bool */
/* fi_setopt(ep, FI_OPT_ENDPOINT, optname, &(bool)value, sizeof(bool)). */
int rs_fi_ep_setopt_bool(struct fid_ep *ep, int optname, int value);
/* fi_getopt of a bool option into *value (0 or 1). */
int rs_fi_ep_getopt_bool(struct fid_ep *ep, int optname, int *value);
/* fi_getopt of a size_t option. */
int rs_fi_ep_getopt_size(struct fid_ep *ep, int optname, size_t *value);

/* fid pointers of the typed objects (their embedded `struct fid`). */
struct fid *rs_fi_fabric_fid(struct fid_fabric *f);
struct fid *rs_fi_domain_fid(struct fid_domain *d);
struct fid *rs_fi_ep_fid(struct fid_ep *ep);
struct fid *rs_fi_cq_fid(struct fid_cq *cq);
struct fid *rs_fi_av_fid(struct fid_av *av);
struct fid *rs_fi_mr_fid(struct fid_mr *mr);

/* ---- memory registration -------------------------------------------------------------- */

/* Host memory: fi_mr_reg. */
int rs_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
		 uint64_t requested_key, uint64_t flags, struct fid_mr **mr);
/* Device memory by address: fi_mr_regattr with iface (enum fi_hmem_iface) and device id. */
int rs_fi_mr_regattr_hmem(struct fid_domain *domain, const void *buf, size_t len,
			  uint64_t access, uint64_t requested_key, int iface, int device,
			  uint64_t flags, struct fid_mr **mr);
/*
 * Device memory by dmabuf fd: fi_mr_regattr with FI_MR_DMABUF. `base_addr` is the virtual
 * address the region is known by (the device pointer); the region is [offset, offset+len) of
 * the dmabuf. Returns -FI_ENOSYS when the headers predate FI_MR_DMABUF.
 */
int rs_fi_mr_regattr_dmabuf(struct fid_domain *domain, int fd, uint64_t offset, size_t len,
			    void *base_addr, uint64_t access, uint64_t requested_key, int iface,
			    int device, uint64_t flags, struct fid_mr **mr);
void *rs_fi_mr_desc(struct fid_mr *mr);
uint64_t rs_fi_mr_key(struct fid_mr *mr);
int rs_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int rs_fi_mr_enable(struct fid_mr *mr);

/* ---- data transfer (hot path: no allocation, no syscall of their own) ------------------- */

ssize_t rs_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		   fi_addr_t dest, void *context);
ssize_t rs_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src,
		   void *context);
/*
 * One-iov fi_writemsg: `flags` as fi_writemsg takes them (FI_COMPLETION, FI_MORE,
 * FI_REMOTE_CQ_DATA with `data`, ...).
 */
ssize_t rs_fi_writemsg1(struct fid_ep *ep, const void *buf, size_t len, void *desc,
			fi_addr_t dest, uint64_t raddr, uint64_t rkey, uint64_t data,
			void *context, uint64_t flags);
ssize_t rs_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		    fi_addr_t dest, uint64_t raddr, uint64_t rkey, void *context);
ssize_t rs_fi_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
			uint64_t data, fi_addr_t dest, uint64_t raddr, uint64_t rkey,
			void *context);

/* ---- completions ---------------------------------------------------------------------- */

ssize_t rs_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t rs_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *rs_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
			      char *buf, size_t len);

#endif /* RS_FI_H */
