// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim-inorder128: whether libfabric's efa provider grants 128-byte in-order WRITEs
 * (fi_setopt FI_OPT_EFA_WRITE_IN_ORDER_ALIGNED_128_BYTES, what aws-ofi-nccl asks for before
 * it lets NCCL use LL128) on each fabric of the first efa device.
 *
 *   efa-sim-inorder128 [--expect yes|no]
 *
 * Prints "FABRIC: yes" (granted) or "FABRIC: no (ERROR)" per fabric; with --expect, exits 0
 * when every fabric answered as expected. The provider grants it where rdma-core's
 * ibv_query_qp_data_in_order() reports IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES, i.e.
 * where the device file gives the device data_polling_128 (p5).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>

static int try_fabric(const char *fabric, bool *granted)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	struct fid_fabric *fab = NULL;
	struct fid_domain *dom = NULL;
	struct fid_ep *ep = NULL;
	struct fid_av *av = NULL;
	struct fid_cq *cq = NULL;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA };
	bool on = true;
	int ret;

	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
	hints->caps = FI_MSG | FI_RMA;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup("efa");
	hints->fabric_attr->name = strdup(fabric);
	ret = fi_getinfo(FI_VERSION(2, 0), NULL, NULL, 0, hints, &info);
	if (!ret)
		ret = fi_fabric(info->fabric_attr, &fab, NULL);
	if (!ret)
		ret = fi_domain(fab, info, &dom, NULL);
	if (!ret)
		ret = fi_endpoint(dom, info, &ep, NULL);
	if (!ret)
		ret = fi_av_open(dom, &av_attr, &av, NULL);
	if (!ret)
		ret = fi_cq_open(dom, &cq_attr, &cq, NULL);
	if (!ret)
		ret = fi_ep_bind(ep, &av->fid, 0);
	if (!ret)
		ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
	if (!ret)
		ret = fi_enable(ep);
	if (ret) {
		fprintf(stderr, "%s: opening an endpoint: %s\n", fabric, fi_strerror(-ret));
		return ret;
	}
	ret = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_EFA_WRITE_IN_ORDER_ALIGNED_128_BYTES, &on,
			sizeof(on));
	*granted = !ret;
	printf("%s: %s", fabric, ret ? "no" : "yes");
	if (ret)
		printf(" (%s)", fi_strerror(-ret));
	printf("\n");
	fi_close(&ep->fid);
	fi_close(&cq->fid);
	fi_close(&av->fid);
	fi_close(&dom->fid);
	fi_close(&fab->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	return 0;
}

int main(int argc, char **argv)
{
	const char *fabrics[] = { "efa-direct", "efa" };
	const char *expect = argc == 3 && !strcmp(argv[1], "--expect") ? argv[2] : NULL;
	int bad = 0;
	size_t i;

	for (i = 0; i < 2; i++) {
		bool granted = false;

		if (try_fabric(fabrics[i], &granted))
			return 2;
		if (expect && granted != !strcmp(expect, "yes"))
			bad = 1;
	}
	return bad;
}
