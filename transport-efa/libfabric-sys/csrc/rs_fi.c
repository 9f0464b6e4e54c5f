/*
 * rs_fi.c: real functions around libfabric's static inline API, for Rust.
 * See rs_fi.h. Everything here compiles against libfabric 1.17 and 2.x headers.
 */
#include <stdbool.h>
#include <string.h>

#include "rs_fi.h"

uint32_t rs_fi_header_version(void)
{
	return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

int rs_fi_have_mr_dmabuf(void)
{
#ifdef FI_MR_DMABUF
	return 1;
#else
	return 0;
#endif
}

struct fi_info *rs_fi_rdm_hints(uint64_t caps, uint64_t mode, uint64_t mr_mode,
				size_t cq_data_size, size_t tx_size, size_t rx_size,
				int threading)
{
	struct fi_info *hints = fi_allocinfo();

	if (!hints)
		return NULL;
	hints->caps = caps;
	hints->mode = mode;
	hints->addr_format = FI_FORMAT_UNSPEC;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = (int)mr_mode;
	hints->domain_attr->cq_data_size = cq_data_size;
	hints->domain_attr->threading = (enum fi_threading)threading;
	hints->domain_attr->av_type = FI_AV_TABLE;
	if (tx_size)
		hints->tx_attr->size = tx_size;
	if (rx_size)
		hints->rx_attr->size = rx_size;
	return hints;
}

void rs_fi_info_view(const struct fi_info *info, struct rs_fi_info_view *out)
{
	memset(out, 0, sizeof(*out));
	if (!info)
		return;
	out->caps = info->caps;
	out->mode = info->mode;
	out->addr_format = info->addr_format;
	out->src_addrlen = info->src_addrlen;
	if (info->fabric_attr) {
		out->prov_name = info->fabric_attr->prov_name;
		out->fabric_name = info->fabric_attr->name;
		out->prov_version = info->fabric_attr->prov_version;
		out->api_version = info->fabric_attr->api_version;
	}
	if (info->domain_attr) {
		out->domain_name = info->domain_attr->name;
		out->threading = (int)info->domain_attr->threading;
		out->mr_mode = (uint64_t)(unsigned int)info->domain_attr->mr_mode;
		out->cq_data_size = info->domain_attr->cq_data_size;
		out->mr_key_size = info->domain_attr->mr_key_size;
	}
	if (info->ep_attr) {
		out->max_msg_size = info->ep_attr->max_msg_size;
		out->ep_type = (int)info->ep_attr->type;
	}
	if (info->tx_attr) {
		out->tx_size = info->tx_attr->size;
		out->inject_size = info->tx_attr->inject_size;
	}
	if (info->rx_attr) {
		out->rx_size = info->rx_attr->size;
		out->rx_mode = info->rx_attr->mode;
	}
	if (info->nic && info->nic->link_attr)
		out->link_speed = (uint64_t)info->nic->link_attr->speed;
	if (info->nic && info->nic->device_attr) {
		out->nic_name = info->nic->device_attr->name;
		out->nic_firmware = info->nic->device_attr->firmware;
	}
	if (info->nic && info->nic->bus_attr && info->nic->bus_attr->bus_type == FI_BUS_PCI) {
		out->has_pci = 1;
		out->pci_domain = info->nic->bus_attr->attr.pci.domain_id;
		out->pci_bus = info->nic->bus_attr->attr.pci.bus_id;
		out->pci_device = info->nic->bus_attr->attr.pci.device_id;
		out->pci_function = info->nic->bus_attr->attr.pci.function_id;
	}
}

struct fi_info *rs_fi_info_next(const struct fi_info *info)
{
	return info ? info->next : NULL;
}

int rs_fi_fabric(const struct fi_info *info, struct fid_fabric **fabric)
{
	return fi_fabric(info->fabric_attr, fabric, NULL);
}

int rs_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain)
{
	return fi_domain(fabric, info, domain, NULL);
}

int rs_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep)
{
	return fi_endpoint(domain, info, ep, NULL);
}

int rs_fi_cq_open_data(struct fid_domain *domain, size_t size, struct fid_cq **cq)
{
	struct fi_cq_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.size = size;
	attr.format = FI_CQ_FORMAT_DATA;
	attr.wait_obj = FI_WAIT_NONE;
	return fi_cq_open(domain, &attr, cq, NULL);
}

int rs_fi_av_open_table(struct fid_domain *domain, size_t count, struct fid_av **av)
{
	struct fi_av_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.type = FI_AV_TABLE;
	attr.count = count;
	return fi_av_open(domain, &attr, av, NULL);
}

int rs_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags)
{
	return fi_ep_bind(ep, bfid, flags);
}

int rs_fi_enable(struct fid_ep *ep)
{
	return fi_enable(ep);
}

int rs_fi_getname(struct fid *fid, void *addr, size_t *addrlen)
{
	return fi_getname(fid, addr, addrlen);
}

int rs_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr,
		    uint64_t flags)
{
	return fi_av_insert(av, addr, count, fi_addr, flags, NULL);
}

int rs_fi_close(struct fid *fid)
{
	return fi_close(fid);
}

int rs_fi_setopt(struct fid *fid, int level, int optname, const void *optval, size_t optlen)
{
	return fi_setopt(fid, level, optname, optval, optlen);
}

int rs_fi_ep_setopt_bool(struct fid_ep *ep, int optname, int value)
{
	bool v = value != 0;

	return fi_setopt(&ep->fid, FI_OPT_ENDPOINT, optname, &v, sizeof(v));
}

int rs_fi_ep_getopt_bool(struct fid_ep *ep, int optname, int *value)
{
	bool v = false;
	size_t len = sizeof(v);
	int ret = fi_getopt(&ep->fid, FI_OPT_ENDPOINT, optname, &v, &len);

	if (ret == 0)
		*value = v ? 1 : 0;
	return ret;
}

int rs_fi_ep_getopt_size(struct fid_ep *ep, int optname, size_t *value)
{
	size_t v = 0;
	size_t len = sizeof(v);
	int ret = fi_getopt(&ep->fid, FI_OPT_ENDPOINT, optname, &v, &len);

	if (ret == 0)
		*value = v;
	return ret;
}

struct fid *rs_fi_fabric_fid(struct fid_fabric *f) { return &f->fid; }
struct fid *rs_fi_domain_fid(struct fid_domain *d) { return &d->fid; }
struct fid *rs_fi_ep_fid(struct fid_ep *ep) { return &ep->fid; }
struct fid *rs_fi_cq_fid(struct fid_cq *cq) { return &cq->fid; }
struct fid *rs_fi_av_fid(struct fid_av *av) { return &av->fid; }
struct fid *rs_fi_mr_fid(struct fid_mr *mr) { return &mr->fid; }

int rs_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
		 uint64_t requested_key, uint64_t flags, struct fid_mr **mr)
{
	return fi_mr_reg(domain, buf, len, access, 0, requested_key, flags, mr, NULL);
}

/* Access, key and the device memory's interface and device: what both attr forms share. */
static void rs_mr_attr_common(struct fi_mr_attr *attr, uint64_t access, uint64_t requested_key,
			      int iface, int device)
{
	attr->iov_count = 1;
	attr->access = access;
	attr->requested_key = requested_key;
	attr->iface = (enum fi_hmem_iface)iface;
	switch (attr->iface) {
	case FI_HMEM_CUDA:
		attr->device.cuda = device;
		break;
	case FI_HMEM_ZE:
		attr->device.ze = device;
		break;
	case FI_HMEM_NEURON:
		attr->device.neuron = device;
		break;
	case FI_HMEM_SYNAPSEAI:
		attr->device.synapseai = device;
		break;
	default:
		attr->device.reserved = 0;
		break;
	}
}

int rs_fi_mr_regattr_hmem(struct fid_domain *domain, const void *buf, size_t len,
			  uint64_t access, uint64_t requested_key, int iface, int device,
			  uint64_t flags, struct fid_mr **mr)
{
	struct fi_mr_attr attr;
	struct iovec iov;

	memset(&attr, 0, sizeof(attr));
	iov.iov_base = (void *)buf;
	iov.iov_len = len;
	/* In 2.x mr_iov sits in an anonymous union with dmabuf; the name is the same. */
	attr.mr_iov = &iov;
	rs_mr_attr_common(&attr, access, requested_key, iface, device);
	return fi_mr_regattr(domain, &attr, flags, mr);
}

int rs_fi_mr_regattr_dmabuf(struct fid_domain *domain, int fd, uint64_t offset, size_t len,
			    void *base_addr, uint64_t access, uint64_t requested_key, int iface,
			    int device, uint64_t flags, struct fid_mr **mr)
{
#ifdef FI_MR_DMABUF
	struct fi_mr_attr attr;
	struct fi_mr_dmabuf dmabuf;

	memset(&attr, 0, sizeof(attr));
	memset(&dmabuf, 0, sizeof(dmabuf));
	dmabuf.fd = fd;
	dmabuf.offset = offset;
	dmabuf.len = len;
	dmabuf.base_addr = base_addr;
	attr.dmabuf = &dmabuf;
	rs_mr_attr_common(&attr, access, requested_key, iface, device);
	return fi_mr_regattr(domain, &attr, flags | FI_MR_DMABUF, mr);
#else
	(void)domain; (void)fd; (void)offset; (void)len; (void)base_addr; (void)access;
	(void)requested_key; (void)iface; (void)device; (void)flags; (void)mr;
	return -FI_ENOSYS;
#endif
}

void *rs_fi_mr_desc(struct fid_mr *mr)
{
	return fi_mr_desc(mr);
}

uint64_t rs_fi_mr_key(struct fid_mr *mr)
{
	return fi_mr_key(mr);
}

int rs_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags)
{
	return fi_mr_bind(mr, bfid, flags);
}

int rs_fi_mr_enable(struct fid_mr *mr)
{
	return fi_mr_enable(mr);
}

ssize_t rs_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		   fi_addr_t dest, void *context)
{
	return fi_send(ep, buf, len, desc, dest, context);
}

ssize_t rs_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src,
		   void *context)
{
	return fi_recv(ep, buf, len, desc, src, context);
}

ssize_t rs_fi_writemsg1(struct fid_ep *ep, const void *buf, size_t len, void *desc,
			fi_addr_t dest, uint64_t raddr, uint64_t rkey, uint64_t data,
			void *context, uint64_t flags)
{
	struct iovec iov;
	struct fi_rma_iov rma;
	struct fi_msg_rma msg;
	void *descs[1];

	iov.iov_base = (void *)buf;
	iov.iov_len = len;
	rma.addr = raddr;
	rma.len = len;
	rma.key = rkey;
	descs[0] = desc;
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.desc = descs;
	msg.iov_count = 1;
	msg.addr = dest;
	msg.rma_iov = &rma;
	msg.rma_iov_count = 1;
	msg.context = context;
	msg.data = data;
	return fi_writemsg(ep, &msg, flags);
}

ssize_t rs_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		    fi_addr_t dest, uint64_t raddr, uint64_t rkey, void *context)
{
	return fi_write(ep, buf, len, desc, dest, raddr, rkey, context);
}

ssize_t rs_fi_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
			uint64_t data, fi_addr_t dest, uint64_t raddr, uint64_t rkey,
			void *context)
{
	return fi_writedata(ep, buf, len, desc, data, dest, raddr, rkey, context);
}

ssize_t rs_fi_cq_read(struct fid_cq *cq, void *buf, size_t count)
{
	return fi_cq_read(cq, buf, count);
}

ssize_t rs_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{
	return fi_cq_readerr(cq, buf, flags);
}

const char *rs_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
			      char *buf, size_t len)
{
	return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}
