// SPDX-License-Identifier: MIT OR Apache-2.0
/* efa-sim: libefa.so.1, the efadv entry points, forwarded to the simulated device. */
#include "sim.h"

struct ibv_qp *efadv_create_driver_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr,
				      uint32_t driver_qp_type)
{
	return efasim_create_driver_qp(pd, attr, driver_qp_type);
}

struct ibv_qp *efadv_create_qp_ex(struct ibv_context *ibvctx, struct ibv_qp_init_attr_ex *attr_ex,
				  struct efadv_qp_init_attr *efa_attr, uint32_t inlen)
{
	return efasim_create_qp_ex(ibvctx, attr_ex, efa_attr, inlen);
}

int efadv_query_device(struct ibv_context *ibvctx, struct efadv_device_attr *attr, uint32_t inlen)
{
	return efasim_query_device(ibvctx, attr, inlen);
}

int efadv_query_ah(struct ibv_ah *ibvah, struct efadv_ah_attr *attr, uint32_t inlen)
{
	return efasim_query_ah(ibvah, attr, inlen);
}

struct ibv_cq_ex *efadv_create_cq(struct ibv_context *ibvctx, struct ibv_cq_init_attr_ex *attr_ex,
				  struct efadv_cq_init_attr *efa_attr, uint32_t inlen)
{
	return efasim_create_cq(ibvctx, attr_ex, efa_attr, inlen);
}

struct efadv_cq *efadv_cq_from_ibv_cq_ex(struct ibv_cq_ex *ibvcqx)
{
	return efasim_cq_from_ibv_cq_ex(ibvcqx);
}

/* Exported as a function too (EFA_1.2), besides the inline in efadv.h. */
#undef efadv_wc_read_sgid
int efasim_wc_read_sgid(struct efadv_cq *cq, union ibv_gid *sgid) __asm__("efadv_wc_read_sgid");
int efasim_wc_read_sgid(struct efadv_cq *cq, union ibv_gid *sgid)
{
	return cq->wc_read_sgid(cq, sgid);
}

int efadv_query_mr(struct ibv_mr *ibvmr, struct efadv_mr_attr *attr, uint32_t inlen)
{
	return efasim_query_mr(ibvmr, attr, inlen);
}
