/* Real functions for the verbs calls that rdma-core only offers as static inline functions or
 * macros: Rust cannot call those, so build.rs compiles this file with cc and links it in. */
#include "wrapper.h"

int ibvs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

int ibvs_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

int ibvs_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_srq_recv(srq, wr, bad_wr);
}

int ibvs_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

int ibvs_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

/* ibv_query_port is a macro over ___ibv_query_port (extended port attributes). */
int ibvs_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr)
{
	return ibv_query_port(context, port_num, port_attr);
}

int ibvs_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags)
{
	return ibv_query_gid_ex(context, port_num, gid_index, entry, flags);
}

/* ibv_reg_mr is a macro: where `access` may hold a bit of IBV_ACCESS_OPTIONAL_RANGE
 * (IBV_ACCESS_RELAXED_ORDERING), or is not a compile-time constant as here, it calls
 * ibv_reg_mr_iova2 (IBVERBS_1.8, rdma-core 28+), which clears the optional bits where the kernel
 * lacks IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS, so the kernel never refuses them; with the
 * support, they reach the kernel and a driver without the feature ignores them. The plain
 * ibv_reg_mr symbol of rdma-core 28-31 passed them on unchecked. Called directly here so the
 * route does not hang on how the compiler folds the macro's __builtin_constant_p. */
struct ibv_mr *ibvs_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

/* ibv_get_device_list is a macro (it also registers statically linked providers). */
struct ibv_device **ibvs_get_device_list(int *num_devices)
{
	return ibv_get_device_list(num_devices);
}
