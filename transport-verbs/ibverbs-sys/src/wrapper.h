/* What bindgen sees: rdma-core's verbs API plus the project's wrappers (wrappers.c). */
#include <infiniband/verbs.h>

/* The static inline (or macro) verbs calls, as real functions compiled by build.rs. */
int ibvs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int ibvs_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int ibvs_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int ibvs_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int ibvs_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int ibvs_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr);
int ibvs_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                      struct ibv_gid_entry *entry, uint32_t flags);
/* ibv_reg_mr_iova2 with iova = addr: optional access bits (relaxed ordering) as rdma-core means. */
struct ibv_mr *ibvs_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
struct ibv_device **ibvs_get_device_list(int *num_devices);
