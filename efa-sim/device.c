// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * efa-sim: devices. The device file, the private sysfs tree the efa provider reads, the
 * device list, opening a device and the queries (ibv_query_device/port/gid, efadv).
 *
 * One file: what a device is (read once, under init_once, from the device file and the
 * environment into g_sim) and everything that reports it (the sysfs tree, the device list,
 * the queries) sit together, so an attribute's parsing and each place that reports it are
 * read and changed as one.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

struct sim_global g_sim;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_err;

void sim_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (level > g_sim.log)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "efa-sim[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

uint64_t sim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Values a 0xefa1 device reports (the defaults; a device file may change any). */
static void default_attr(struct sim_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->vendor_id = 0x1d0f;
	a->vendor_part_id = 0xefa1;
	a->hw_ver = 0xefa1;
	snprintf(a->fw_ver, sizeof(a->fw_ver), "0.0.0.0");
	a->max_mr_size = 103079215104ull;
	a->max_qp = 256;
	a->max_qp_wr = 4096;
	a->max_sge = 2;
	a->max_sge_rd = 1;
	a->max_cq = 512;
	a->max_cqe = 32768;
	a->max_mr = 262144;
	a->max_pd = 256;
	a->max_ah = 1024;
	a->max_sq_wr = 4096;
	a->max_rq_wr = 32768;
	a->max_sq_sge = 2;
	a->max_rq_sge = 3;
	a->inline_buf_size = 32;
	a->device_caps = SIM_CAPS_ALL;
	a->max_rdma_size = 1u << 30;
	a->max_msg_sz = 8928;
	a->active_speed = 32;
	a->active_width = 2;
	a->numa_node = -1;
}

static const struct {
	const char *name;
	uint32_t bit;
} cap_names[] = {
	{ "rdma_read", EFADV_DEVICE_ATTR_CAPS_RDMA_READ },
	{ "rnr_retry", EFADV_DEVICE_ATTR_CAPS_RNR_RETRY },
	{ "cq_with_sgid", EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID },
	{ "rdma_write", EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE },
	{ "unsolicited_write_recv", EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV },
	{ "data_polling_128", SIM_CAP_DATA_POLLING_128 },
};

static int parse_u64(const char *v, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(v, &end, 0);
	return (errno || end == v || *end) ? EINVAL : 0;
}

static int parse_gid(const char *v, union ibv_gid *gid)
{
	unsigned b[16];
	int i;

	/* 32 hex digits, optionally with ':' separators */
	for (i = 0; i < 16; i++) {
		while (*v == ':')
			v++;
		if (sscanf(v, "%2x", &b[i]) != 1 || !isxdigit((unsigned char)v[0]) ||
		    !isxdigit((unsigned char)v[1]))
			return EINVAL;
		gid->raw[i] = (uint8_t)b[i];
		v += 2;
	}
	return *v ? EINVAL : 0;
}

/* One "key value" setting, for the attributes or the fault knobs. */
static int set_key(struct sim_attr *a, struct sim_faults *f, const char *key, const char *val)
{
	uint64_t n = 0;

	if (!strcmp(key, "caps")) {
		char buf[256], *tok, *save;

		snprintf(buf, sizeof(buf), "%s", val);
		a->device_caps = 0;
		for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
			size_t i;

			for (i = 0; i < sizeof(cap_names) / sizeof(cap_names[0]); i++)
				if (!strcmp(tok, cap_names[i].name))
					break;
			if (i == sizeof(cap_names) / sizeof(cap_names[0]))
				return EINVAL;
			a->device_caps |= cap_names[i].bit;
		}
		return 0;
	}
	if (!strcmp(key, "fw_ver")) {
		snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", val);
		return 0;
	}
	if (!strcmp(key, "numa")) {
		a->numa_node = atoi(val);
		return 0;
	}
	if (parse_u64(val, &n))
		return EINVAL;
#define U(k, field)                                                                        \
	if (!strcmp(key, k)) {                                                             \
		field = n;                                                                 \
		return 0;                                                                  \
	}
	U("vendor_id", a->vendor_id)
	U("vendor_part_id", a->vendor_part_id)
	U("hw_ver", a->hw_ver)
	U("max_mr_size", a->max_mr_size)
	U("max_qp", a->max_qp)
	U("max_qp_wr", a->max_qp_wr)
	U("max_sge", a->max_sge)
	U("max_sge_rd", a->max_sge_rd)
	U("max_cq", a->max_cq)
	U("max_cqe", a->max_cqe)
	U("max_mr", a->max_mr)
	U("max_pd", a->max_pd)
	U("max_ah", a->max_ah)
	U("max_sq_wr", a->max_sq_wr)
	U("max_rq_wr", a->max_rq_wr)
	U("max_sq_sge", a->max_sq_sge)
	U("max_rq_sge", a->max_rq_sge)
	U("inline_buf_size", a->inline_buf_size)
	U("max_rdma_size", a->max_rdma_size)
	U("max_msg_sz", a->max_msg_sz)
	U("active_speed", a->active_speed)
	U("active_width", a->active_width)
	U("seed", f->seed)
	U("reorder", f->reorder)
	U("delay_us", f->delay_us)
	U("rnr_permille", f->rnr_permille)
	U("die_after", f->die_after)
	U("timeout_ms", f->timeout_ms)
	U("rnr_delay_us", f->rnr_delay_us)
	U("lose_write_permille", f->lose_write_permille)
	U("pkt_size", f->pkt_size)
	U("pin", f->pin)
#undef U
	return EINVAL;
}

static int add_device(const char *name, const char *pci, const struct sim_attr *a)
{
	struct sim_dev *d, *devs;
	unsigned dom, bus, dev, fn;

	if (sscanf(pci, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 || strlen(name) >= IBV_SYSFS_NAME_MAX)
		return EINVAL;
	devs = realloc(g_sim.devs, (g_sim.ndev + 1) * sizeof(*devs));
	if (!devs)
		return ENOMEM;
	g_sim.devs = devs;
	d = &devs[g_sim.ndev];
	memset(d, 0, sizeof(*d));
	d->index = g_sim.ndev++;
	d->a = *a;
	snprintf(d->pci, sizeof(d->pci), "%04x:%02x:%02x.%x", dom, bus, dev, fn);
	snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
	/* A link-local GID made from the PCI address, unique on this simulated host. */
	d->gid.raw[0] = 0xfe;
	d->gid.raw[1] = 0x80;
	/* EFA_SIM_HOST: the same NICs (names, PCI addresses) on another host, another GID. */
	d->gid.raw[6] = (uint8_t)(g_sim.host >> 8);
	d->gid.raw[7] = (uint8_t)g_sim.host;
	d->gid.raw[8] = 0x0e;
	d->gid.raw[9] = 0xfa;
	d->gid.raw[10] = (uint8_t)(dom >> 8);
	d->gid.raw[11] = (uint8_t)dom;
	d->gid.raw[12] = (uint8_t)bus;
	d->gid.raw[13] = (uint8_t)dev;
	d->gid.raw[14] = (uint8_t)fn;
	d->gid.raw[15] = (uint8_t)(d->index + 1);
	memcpy(&d->guid, &d->gid.raw[8], 8);
	return 0;
}

/* "a/b/c": PCI addresses, root port first. */
static int parse_bridges(const char *v, char *out, size_t cap)
{
	char buf[512], *tok, *save;
	unsigned a, b, c, d;

	if (strlen(v) >= cap || strlen(v) >= sizeof(buf))
		return EINVAL;
	snprintf(buf, sizeof(buf), "%s", v);
	for (tok = strtok_r(buf, "/", &save); tok; tok = strtok_r(NULL, "/", &save))
		if (strlen(tok) != 12 || sscanf(tok, "%4x:%2x:%2x.%1x", &a, &b, &c, &d) != 4)
			return EINVAL;
	snprintf(out, cap, "%s", v);
	return 0;
}

/* "pci ADDR class=C vendor=V device=D numa=N bridges=..." : a PCI function that is not a
 * simulated NIC (a GPU), for the sysfs tree. */
static int add_pci(char **tok, int n, int numa)
{
	struct sim_pcifn *f, *v;
	unsigned a, b, c, d;
	int i, err = 0;

	if (strlen(tok[0]) != 12 || sscanf(tok[0], "%4x:%2x:%2x.%1x", &a, &b, &c, &d) != 4)
		return EINVAL;
	v = realloc(g_sim.pcis, (size_t)(g_sim.npci + 1) * sizeof(*v));
	if (!v)
		return ENOMEM;
	g_sim.pcis = v;
	f = &v[g_sim.npci];
	memset(f, 0, sizeof(*f));
	snprintf(f->addr, sizeof(f->addr), "%s", tok[0]);
	f->numa = numa;
	for (i = 1; i < n && !err; i++) {
		char *eq = strchr(tok[i], '=');
		uint64_t x = 0;

		if (!eq)
			return EINVAL;
		if (!strncmp(tok[i], "bridges=", 8)) {
			err = parse_bridges(eq + 1, f->bridges, sizeof(f->bridges));
			continue;
		}
		if (!strncmp(tok[i], "numa=", 5)) {
			f->numa = atoi(eq + 1);
			continue;
		}
		if (parse_u64(eq + 1, &x))
			return EINVAL;
		if (!strncmp(tok[i], "class=", 6))
			f->cls = (uint32_t)x;
		else if (!strncmp(tok[i], "vendor=", 7))
			f->vendor = (uint32_t)x;
		else if (!strncmp(tok[i], "device=", 7))
			f->device = (uint32_t)x;
		else
			return EINVAL;
	}
	if (!err)
		g_sim.npci++;
	return err;
}

static int load_file(const char *path)
{
	struct sim_attr global;
	FILE *fp;
	char line[1024];
	int lineno = 0, err = 0;

	default_attr(&global);
	fp = fopen(path, "r");
	if (!fp) {
		fprintf(stderr, "efa-sim: cannot open device file %s: %s\n", path, strerror(errno));
		return errno;
	}
	while (fgets(line, sizeof(line), fp)) {
		char *toks[64], *save, *t, *hash;
		int n = 0;

		lineno++;
		hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		for (t = strtok_r(line, " \t\r\n", &save); t && n < 64; t = strtok_r(NULL, " \t\r\n", &save))
			toks[n++] = t;
		if (!n)
			continue;
		if (!strcmp(toks[0], "device")) {
			struct sim_attr a = global;
			int i;

			if (n < 3) {
				err = EINVAL;
				break;
			}
			for (i = 3; i < n && !err; i++) {
				char *eq = strchr(toks[i], '=');

				if (!eq) {
					err = EINVAL;
					break;
				}
				if (!strncmp(toks[i], "gid=", 4) || !strncmp(toks[i], "bridges=", 8))
					continue; /* applied below, to the device */
				*eq = 0;
				err = set_key(&a, &g_sim.f, toks[i], eq + 1);
				*eq = '=';
			}
			if (!err)
				err = add_device(toks[1], toks[2], &a);
			for (i = 3; i < n && !err; i++) {
				struct sim_dev *d = &g_sim.devs[g_sim.ndev - 1];

				if (!strncmp(toks[i], "gid=", 4))
					err = parse_gid(toks[i] + 4, &d->gid);
				else if (!strncmp(toks[i], "bridges=", 8))
					err = parse_bridges(toks[i] + 8, d->path, sizeof(d->path));
			}
		} else if (!strcmp(toks[0], "pci")) {
			err = n < 2 ? EINVAL : add_pci(toks + 1, n - 1, global.numa_node);
		} else {
			char val[512] = "";
			int i;

			for (i = 1; i < n; i++) {
				strncat(val, toks[i], sizeof(val) - strlen(val) - 2);
				if (i + 1 < n)
					strcat(val, " ");
			}
			err = set_key(&global, &g_sim.f, toks[0], val);
		}
		if (err)
			break;
	}
	fclose(fp);
	if (err)
		fprintf(stderr, "efa-sim: %s:%d: cannot read this line (%s)\n", path, lineno, strerror(err));
	return err;
}

static void env_u(const char *name, unsigned *v)
{
	const char *s = getenv(name);

	if (s && *s)
		*v = (unsigned)strtoul(s, NULL, 0);
}

/* mkdir -p, tolerating a concurrent creator. */
static int mkdirs(const char *path)
{
	char buf[PATH_MAX], *p;

	snprintf(buf, sizeof(buf), "%s", path);
	for (p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) && errno != EEXIST)
			return errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) && errno != EEXIST)
		return errno;
	return 0;
}

/* Write a small file atomically (write a temporary, rename), unless it exists. */
static int put_file(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX], tmp[PATH_MAX + 32];
	int fd;
	ssize_t len = (ssize_t)strlen(text);

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!access(path, F_OK))
		return 0;
	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return errno;
	if (write(fd, text, len) != len) {
		int e = errno;

		close(fd);
		unlink(tmp);
		return e ? e : EIO;
	}
	close(fd);
	if (rename(tmp, path)) {
		int e = errno;

		unlink(tmp);
		return e;
	}
	return 0;
}

static int put_link(const char *target, const char *path)
{
	if (symlink(target, path) && errno != EEXIST)
		return errno;
	return 0;
}

/* snprintf into a PATH_MAX buffer; a path that does not fit is an error. */
static int path_fmt(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int path_fmt(char *buf, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, PATH_MAX, fmt, ap);
	va_end(ap);
	return (n < 0 || n >= PATH_MAX) ? ENAMETOOLONG : 0;
}
#define PATHF(buf, ...)                                                                    \
	do {                                                                               \
		if (path_fmt(buf, __VA_ARGS__))                                            \
			return ENAMETOOLONG;                                               \
	} while (0)

/* Write the attribute files of a PCI function (kept when they exist). */
static int pci_files(const char *dir, uint32_t cls, uint32_t vendor, uint32_t device, int numa,
		     const char *speed, int width)
{
	char text[64];
	int err;

	snprintf(text, sizeof(text), "0x%06x\n", cls);
	if ((err = put_file(dir, "class", text)))
		return err;
	snprintf(text, sizeof(text), "0x%04x\n", vendor);
	if ((err = put_file(dir, "vendor", text)))
		return err;
	snprintf(text, sizeof(text), "0x%04x\n", device);
	if ((err = put_file(dir, "device", text)))
		return err;
	snprintf(text, sizeof(text), "%d\n", numa);
	if ((err = put_file(dir, "numa_node", text)))
		return err;
	if (speed) {
		snprintf(text, sizeof(text), "%s\n", speed);
		if ((err = put_file(dir, "current_link_speed", text)) ||
		    (err = put_file(dir, "max_link_speed", text)))
			return err;
		snprintf(text, sizeof(text), "%d\n", width);
		if ((err = put_file(dir, "current_link_width", text)) ||
		    (err = put_file(dir, "max_link_width", text)))
			return err;
	}
	return 0;
}

/*
 * The directory of PCI function `addr` below the bridges of `bridges` ("a/b/c", root port
 * first; empty: on the root bus), made with each bridge's own directory on the way (a PCI
 * bridge, class 0x0604, with the vendor's switch id) and a bus/pci/devices link for each.
 * `rel_root` gets the "../" path from the function's directory back to the tree's top.
 */
static int pci_dir(const char *root, const char *addr, const char *bridges, int numa, char *out,
		   char *rel_root)
{
	char chain[512], *tok, *save, path[PATH_MAX], link[PATH_MAX], rel[PATH_MAX];
	const char *first = *bridges ? bridges : addr;
	int depth = 2, err, n;

	/* The host bridge is named after the root port's domain and bus. */
	PATHF(out, "%s/devices/pci%.4s:%.2s", root, first, first + 5);
	snprintf(chain, sizeof(chain), "%s%s%s", bridges, *bridges ? "/" : "", addr);
	for (tok = strtok_r(chain, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
		bool last = !strcmp(tok, addr);

		if (strlen(out) + strlen(tok) + 2 >= PATH_MAX)
			return ENAMETOOLONG;
		strcat(out, "/");
		strcat(out, tok);
		depth++;
		if ((err = mkdirs(out)))
			return err;
		if (!last && (err = pci_files(out, 0x060400, 0x1d0f, 0x0200, numa, NULL, 0)))
			return err;
		/* bus/pci/devices/ADDR -> ../../../devices/.../ADDR */
		PATHF(link, "%s/bus/pci/devices/%s", root, tok);
		n = snprintf(rel, sizeof(rel), "../../..%s", out + strlen(root));
		if (n < 0 || (size_t)n >= sizeof(rel))
			return ENAMETOOLONG;
		if ((err = put_link(rel, link)))
			return err;
	}
	rel_root[0] = 0;
	while (depth--)
		strcat(rel_root, "../");
	(void)path;
	return 0;
}

/*
 * The sysfs tree the efa provider reads (efa_device.c, efa_prov_info.c), laid out as on
 * an EC2 instance, with the PCIe switches of the device file (bridges=) above each NIC and
 * its GPUs (pci lines), so code that walks sysfs pairs them as on the instance:
 *   class/infiniband_verbs/abi_version
 *   class/infiniband/NAME -> ../../devices/pci0000:BB/B1/.../DBDF/infiniband/NAME
 *   devices/pci0000:BB/B1/.../DBDF/{class,vendor,device,numa_node,link attributes,
 *     driver -> bus/pci/drivers/efa}
 *   devices/pci0000:BB/B1/.../DBDF/infiniband/NAME/device -> ../../../DBDF
 *   bus/pci/devices/DBDF -> ../../../devices/.../DBDF (every function, bridges included)
 */
static int make_sysfs(const char *root)
{
	char dir[PATH_MAX], path[PATH_MAX], rel[PATH_MAX];
	int i, err;

	PATHF(dir, "%s/class/infiniband_verbs", root);
	if ((err = mkdirs(dir)) || (err = put_file(dir, "abi_version", "1\n")))
		return err;
	PATHF(dir, "%s/bus/pci/drivers/efa", root);
	if ((err = mkdirs(dir)))
		return err;
	PATHF(dir, "%s/bus/pci/devices", root);
	if ((err = mkdirs(dir)))
		return err;
	PATHF(dir, "%s/class/infiniband", root);
	if ((err = mkdirs(dir)))
		return err;
	for (i = 0; i < g_sim.npci; i++) {
		struct sim_pcifn *f = &g_sim.pcis[i];
		char fdir[PATH_MAX], up[PATH_MAX];

		if ((err = pci_dir(root, f->addr, f->bridges, f->numa, fdir, up)) ||
		    (err = pci_files(fdir, f->cls, f->vendor, f->device, f->numa, "32.0 GT/s PCIe", 16)))
			return err;
	}
	for (i = 0; i < g_sim.ndev; i++) {
		struct sim_dev *d = &g_sim.devs[i];
		char pcidir[PATH_MAX], up[PATH_MAX];

		if ((err = pci_dir(root, d->pci, d->path, d->a.numa_node, pcidir, up)) ||
		    (err = pci_files(pcidir, 0x020000, d->a.vendor_id, d->a.vendor_part_id,
				     d->a.numa_node, "16.0 GT/s PCIe", 8)))
			return err;
		PATHF(dir, "%s/infiniband/%s", pcidir, d->ibdev.name);
		if ((err = mkdirs(dir)))
			return err;
		PATHF(path, "%s/driver", pcidir);
		PATHF(rel, "%sbus/pci/drivers/efa", up);
		if ((err = put_link(rel, path)))
			return err;
		PATHF(path, "%s/device", dir);
		PATHF(rel, "../../../%s", d->pci);
		if ((err = put_link(rel, path)))
			return err;
		PATHF(path, "%s/class/infiniband/%s", root, d->ibdev.name);
		PATHF(rel, "../..%s/infiniband/%s", pcidir + strlen(root), d->ibdev.name);
		if ((err = put_link(rel, path)))
			return err;
		/* What libibverbs and the provider read from struct ibv_device. */
		d->ibdev.node_type = IBV_NODE_UNSPECIFIED;
		d->ibdev.transport_type = IBV_TRANSPORT_UNSPECIFIED;
		snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", i);
		if (strlen(path) >= sizeof(d->ibdev.ibdev_path) ||
		    strlen(root) + 40 >= sizeof(d->ibdev.dev_path))
			return ENAMETOOLONG; /* ibv_device holds paths of up to 255 bytes */
		memcpy(d->ibdev.ibdev_path, path, strlen(path) + 1);
		PATHF(rel, "%s/class/infiniband_verbs/uverbs%d", root, i);
		memcpy(d->ibdev.dev_path, rel, strlen(rel) + 1);
	}
	return 0;
}

static void do_init(void)
{
	const char *file = getenv("EFA_SIM_DEVICES");
	const char *sysfs = getenv("SYSFS_PATH");
	const char *log = getenv("EFA_SIM_LOG");
	char real[PATH_MAX];
	uint64_t h = 1469598103934665603ull;
	const char *p;

	g_sim.log = log ? atoi(log) : 0;
	g_sim.f.timeout_ms = 5000;
	g_sim.f.rnr_delay_us = 50;
	g_sim.f.seed = 1;
	g_sim.f.pin = 1;
	pthread_rwlock_init(&g_sim.dma_lock, NULL);
	if (!file || !*file) {
		sim_log(1, "EFA_SIM_DEVICES is not set: no devices\n");
		init_err = ENODEV;
		return;
	}
	if (!sysfs || !*sysfs) {
		fprintf(stderr, "efa-sim: SYSFS_PATH is not set: the efa provider would read the "
				"real /sys; set it to a private folder (ci/efa-sim.sh does)\n");
		init_err = ENODEV;
		return;
	}
	env_u("EFA_SIM_HOST", &g_sim.host); /* before the devices: their GIDs carry it */
	init_err = load_file(file);
	if (init_err)
		return;
	{
		const char *s = getenv("EFA_SIM_SEED");

		if (s && *s)
			g_sim.f.seed = strtoull(s, NULL, 0);
	}
	env_u("EFA_SIM_REORDER", &g_sim.f.reorder);
	env_u("EFA_SIM_DELAY_US", &g_sim.f.delay_us);
	env_u("EFA_SIM_RNR_PERMILLE", &g_sim.f.rnr_permille);
	env_u("EFA_SIM_DIE_AFTER", &g_sim.f.die_after);
	env_u("EFA_SIM_TIMEOUT_MS", &g_sim.f.timeout_ms);
	env_u("EFA_SIM_RNR_DELAY_US", &g_sim.f.rnr_delay_us);
	env_u("EFA_SIM_LOSE_WRITE_PERMILLE", &g_sim.f.lose_write_permille);
	env_u("EFA_SIM_PKT_SIZE", &g_sim.f.pkt_size);
	env_u("EFA_SIM_PIN", &g_sim.f.pin);
	if (mkdirs(sysfs) || !realpath(sysfs, real)) {
		fprintf(stderr, "efa-sim: cannot use SYSFS_PATH=%s: %s\n", sysfs, strerror(errno));
		init_err = errno ? errno : EINVAL;
		return;
	}
	snprintf(g_sim.sysfs, sizeof(g_sim.sysfs), "%s", real);
	init_err = make_sysfs(real);
	if (init_err) {
		fprintf(stderr, "efa-sim: cannot make the sysfs tree under %s: %s\n", real,
			strerror(init_err));
		return;
	}
	/* Processes that share SYSFS_PATH (or EFA_SIM_FABRIC) share a fabric. */
	p = getenv("EFA_SIM_FABRIC");
	for (p = (p && *p) ? p : real; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	snprintf(g_sim.ns, sizeof(g_sim.ns), "%016llx", (unsigned long long)h);
	sim_log(1, "%d devices from %s; seed %llu reorder %u delay_us %u rnr_permille %u "
		   "die_after %u timeout_ms %u\n",
		g_sim.ndev, file, (unsigned long long)g_sim.f.seed, g_sim.f.reorder,
		g_sim.f.delay_us, g_sim.f.rnr_permille, g_sim.f.die_after, g_sim.f.timeout_ms);
}

/*
 * One line per process that opened a device, at exit: each fault knob as
 * name=setting:effect (the effect is what the knob did here; a knob that acts at the peer,
 * lose_write_permille, shows its dropped pieces in the target's line), then the other
 * counters. Appended to $EFA_SIM_STATS (one write(2) of one line, so processes sharing the
 * file do not mix lines), else printed on stderr at EFA_SIM_LOG >= 1. efa-sim/stats.sh sums
 * and checks them.
 */
static void sim_stats_write(void)
{
	const char *path = getenv("EFA_SIM_STATS");
	struct sim_stats *t = &g_sim.st;
	char line[1024];
	int n, fd;

	if (!atomic_load(&g_sim.opened))
		return;
#define C(x) ((unsigned long long)atomic_load(&t->x))
	n = snprintf(line, sizeof(line),
		     "efa-sim stats pid=%d packets=%llu reorder=%u:%llu delay_us=%u:%llu "
		     "rnr_permille=%u:%llu lose_write_permille=%u:%llu die_after=%u:%llu "
		     "writes_lost=%llu lost_bytes=%llu lost_inside=%llu out_of_order=%llu "
		     "late_pieces=%llu pinned_pages=%llu dma_unmapped=%llu bad_key=%llu "
		     "pd_mismatch=%llu cq_overrun=%llu flushed=%llu stale_cqe=%llu gpu_mrs=%llu "
		     "gpu_dmabuf=%llu gpu_put=%llu gpu_get=%llu\n",
		     (int)getpid(), C(packets), g_sim.f.reorder > 1 ? g_sim.f.reorder : 0,
		     C(reordered), g_sim.f.delay_us, C(delayed), g_sim.f.rnr_permille, C(rnr_injected),
		     g_sim.f.lose_write_permille, C(lost_pieces), g_sim.f.die_after, C(silent),
		     C(writes_lost), C(lost_bytes), C(lost_inside), C(out_of_order), C(late_pieces),
		     C(pinned), C(dma_unmapped), C(bad_key), C(pd_mismatch), C(cq_overrun), C(flushed),
		     C(stale_cqe), C(gpu_mrs), C(gpu_dmabuf), C(gpu_put), C(gpu_get));
#undef C
	if (n <= 0)
		return;
	if ((size_t)n >= sizeof(line))
		n = sizeof(line) - 1;
	if (path && *path) {
		fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd >= 0) {
			if (write(fd, line, (size_t)n) != n)
				fprintf(stderr, "efa-sim: writing %s: %s\n", path, strerror(errno));
			close(fd);
			return;
		}
		fprintf(stderr, "efa-sim: cannot open EFA_SIM_STATS=%s: %s\n", path, strerror(errno));
	}
	if (g_sim.log >= 1 || (path && *path))
		fputs(line, stderr);
}

__attribute__((destructor)) static void sim_fini(void)
{
	sim_stats_write();
}

int sim_init(void)
{
	pthread_once(&init_once, do_init);
	return init_err;
}

/* ---- keys ---- */

/* A bijection of 32-bit values (each step is one: xor, multiplication by an odd number,
 * xor-shift), so distinct counter values give distinct keys. */
static uint32_t key_of(uint64_t n, uint64_t seed)
{
	uint32_t x = (uint32_t)n ^ (uint32_t)seed;

	x *= 0x9e3779b1u;
	x ^= x >> 16;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	x ^= (uint32_t)(seed >> 32);
	x *= 0xc2b2ae35u;
	x ^= x >> 16;
	return x;
}

/*
 * The device's next key: its counter lives in a small file of the fabric's sysfs tree
 * (efa-sim/keys-HOST-NAME), mapped shared, so every process that opens the device draws
 * from one sequence; no key repeats on a device within the fabric. Without the file (it
 * cannot be made), the counter is this process's own, started at a random place.
 */
uint32_t sim_next_key(struct sim_dev *d)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static _Atomic uint64_t local;
	uint32_t k;

	pthread_mutex_lock(&lock);
	if (!d->keys) {
		char dir[PATH_MAX + 16], path[PATH_MAX + 300];
		int fd = -1;
		void *m = MAP_FAILED;

		d->key_seed = 0x243f6a8885a308d3ull;
		for (const char *p = g_sim.ns; *p; p++)
			d->key_seed = (d->key_seed ^ (unsigned char)*p) * 0x100000001b3ull;
		d->key_seed ^= (uint64_t)(d->index + 1) * 0x9e3779b97f4a7c15ull ^ g_sim.host;
		snprintf(dir, sizeof(dir), "%s/efa-sim", g_sim.sysfs);
		snprintf(path, sizeof(path), "%s/keys-%u-%s", dir, g_sim.host, d->ibdev.name);
		if (!mkdirs(dir))
			fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0 && !ftruncate(fd, 4096))
			m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (fd >= 0)
			close(fd);
		if (m == MAP_FAILED) {
			sim_log(0, "cannot share %s's key counter (%s): keys are this process's own\n",
				d->ibdev.name, strerror(errno));
			atomic_store(&local, (uint64_t)getpid() << 32 ^ sim_now_ns());
			d->keys = &local;
		} else {
			d->keys = m;
		}
	}
	pthread_mutex_unlock(&lock);
	do
		k = key_of(atomic_fetch_add(d->keys, 1), d->key_seed);
	while (k == 0 || k == 0xffffffffu);
	return k;
}

/* ---- the device list ---- */

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list;
	int i, n;

	n = sim_init() ? 0 : g_sim.ndev;
	list = calloc(n + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < n; i++)
		list[i] = &g_sim.devs[i].ibdev;
	if (num)
		*num = n;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	return ((struct sim_dev *)device)->guid;
}

int ibv_get_device_index(struct ibv_device *device)
{
	return ((struct sim_dev *)device)->index;
}

/* ---- contexts ---- */

static int sim_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr,
			  size_t len);
static int sim_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t size);
extern struct ibv_cq_ex *sim_create_cq_ex(struct ibv_context *c, struct ibv_cq_init_attr_ex *a);
extern struct ibv_qp *sim_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a);
extern int sim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
extern int sim_req_notify_cq(struct ibv_cq *cq, int solicited_only);
extern int sim_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
extern int sim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
extern int sim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sim_ctx *ctx;
	struct ibv_context *c;

	if (sim_init()) {
		errno = ENODEV;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->dev = (struct sim_dev *)device;
	ctx->vctx.sz = sizeof(struct verbs_context);
	ctx->vctx.query_port = sim_query_port;
	ctx->vctx.query_device_ex = sim_query_device_ex;
	ctx->vctx.create_cq_ex = sim_create_cq_ex;
	ctx->vctx.create_qp_ex = sim_create_qp_ex;
	c = &ctx->vctx.context;
	c->device = device;
	c->cmd_fd = -1;
	c->async_fd = -1;
	c->num_comp_vectors = 1;
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->ops.post_recv = sim_post_recv;
	c->ops.post_send = sim_post_send;
	c->ops.poll_cq = sim_poll_cq;
	c->ops.req_notify_cq = sim_req_notify_cq;
	c->ops.post_srq_recv = sim_post_srq_recv;
	pthread_mutex_init(&c->mutex, NULL);
	pthread_mutex_init(&ctx->newq_lock, NULL);
	pthread_mutex_init(&ctx->qp_lock, NULL);
	pthread_mutex_init(&ctx->ah_lock, NULL);
	pthread_rwlock_init(&ctx->mr_lock, NULL);
	if (sim_engine_start(ctx)) {
		int e = errno;

		free(ctx);
		errno = e ? e : ENOMEM;
		return NULL;
	}
	atomic_store(&g_sim.opened, true);
	sim_log(2, "opened %s (%s)\n", device->name, ctx->dev->pci);
	return c;
}

int ibv_close_device(struct ibv_context *c)
{
	struct sim_ctx *ctx = to_ctx(c);
	uint32_t i;

	if (!sim_engine_stop(ctx))
		return 0; /* the engine may still use the context: leave it */
	for (i = 0; i < ctx->mrs_cap; i++)
		if (ctx->mrs[i] && ctx->mrs[i] != (struct sim_mr *)1) { /* regions left registered */
			sim_unpin(ctx->mrs[i]);
			free(ctx->mrs[i]);
		}
	free(ctx->mrs);
	for (i = 0; i < ctx->nah; i++)
		free(ctx->ahs[i]);
	free(ctx->ahs);
	pthread_mutex_destroy(&ctx->newq_lock);
	pthread_mutex_destroy(&ctx->qp_lock);
	pthread_mutex_destroy(&ctx->ah_lock);
	pthread_rwlock_destroy(&ctx->mr_lock);
	pthread_mutex_destroy(&c->mutex);
	free(ctx);
	return 0;
}

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *attr)
{
	struct sim_dev *d = to_ctx(c)->dev;
	struct sim_attr *a = &d->a;

	memset(attr, 0, sizeof(*attr));
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%s", a->fw_ver);
	attr->node_guid = d->guid;
	attr->sys_image_guid = d->guid;
	attr->max_mr_size = a->max_mr_size;
	attr->page_size_cap = 0xfffff000;
	attr->vendor_id = a->vendor_id;
	attr->vendor_part_id = a->vendor_part_id;
	attr->hw_ver = a->hw_ver;
	attr->max_qp = a->max_qp;
	attr->max_qp_wr = a->max_qp_wr;
	attr->max_sge = a->max_sge;
	attr->max_sge_rd = a->max_sge_rd;
	attr->max_cq = a->max_cq;
	attr->max_cqe = a->max_cqe;
	attr->max_mr = a->max_mr;
	attr->max_pd = a->max_pd;
	attr->max_ah = a->max_ah;
	attr->max_pkeys = 1;
	attr->atomic_cap = IBV_ATOMIC_NONE;
	attr->phys_port_cnt = 1;
	return 0;
}

static int sim_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t size)
{
	(void)in;
	if (size < sizeof(attr->orig_attr))
		return EINVAL;
	memset(attr, 0, size);
	return ibv_query_device(c, &attr->orig_attr);
}

static int sim_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr,
			  size_t len)
{
	struct sim_attr *a = &to_ctx(c)->dev->a;
	struct ibv_port_attr p;

	if (port != 1)
		return EINVAL;
	memset(&p, 0, sizeof(p));
	p.state = g_sim.dead ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	p.max_mtu = IBV_MTU_4096;
	p.active_mtu = IBV_MTU_4096;
	p.gid_tbl_len = 1;
	p.max_msg_sz = a->max_msg_sz;
	p.pkey_tbl_len = 1;
	p.lmc = 1;
	p.max_vl_num = 1;
	p.active_width = a->active_width;
	p.active_speed = a->active_speed;
	p.phys_state = 5; /* LinkUp */
	p.link_layer = IBV_LINK_LAYER_UNSPECIFIED;
	memcpy(attr, &p, len < sizeof(p) ? len : sizeof(p));
	return 0;
}

/* The exported symbol; verbs.h routes ibv_query_port() to vctx->query_port instead. */
#undef ibv_query_port
int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *attr)
{
	/* The old layout is the current one without its trailing fields. */
	return sim_query_port(c, port, (struct ibv_port_attr *)attr,
			      offsetof(struct ibv_port_attr, flags) + sizeof(uint8_t));
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*gid = to_ctx(c)->dev->gid;
	return 0;
}

int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	(void)flags;
	if (port != 1 || index != 0 || entry_size < sizeof(*entry))
		return EINVAL;
	memset(entry, 0, sizeof(*entry));
	entry->gid = to_ctx(c)->dev->gid;
	entry->port_num = 1;
	entry->gid_type = IBV_GID_TYPE_IB;
	return 0;
}

int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
	(void)c;
	if (port != 1 || index != 0)
		return EINVAL;
	*pkey = 0xffff;
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, __be16 pkey)
{
	(void)c;
	return (port == 1 && pkey == 0xffff) ? 0 : -1;
}

int efasim_query_device(struct ibv_context *c, struct efadv_device_attr *attr, uint32_t inlen)
{
	struct sim_attr *a = &to_ctx(c)->dev->a;

	if (inlen < offsetof(struct efadv_device_attr, inline_buf_size) + sizeof(attr->inline_buf_size))
		return EINVAL;
	memset(attr, 0, inlen);
	attr->max_sq_wr = a->max_sq_wr;
	attr->max_rq_wr = a->max_rq_wr;
	attr->max_sq_sge = a->max_sq_sge;
	attr->max_rq_sge = a->max_rq_sge;
	attr->inline_buf_size = a->inline_buf_size;
	if (inlen >= offsetof(struct efadv_device_attr, device_caps) + sizeof(attr->device_caps))
		attr->device_caps = a->device_caps &
				    (EFADV_DEVICE_ATTR_CAPS_RNR_RETRY | EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID |
				     EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV);
	if (inlen >= offsetof(struct efadv_device_attr, max_rdma_size) + sizeof(attr->max_rdma_size)) {
		attr->max_rdma_size = a->max_rdma_size;
		attr->device_caps |= a->device_caps & (EFADV_DEVICE_ATTR_CAPS_RDMA_READ |
						       EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE);
	}
	return 0;
}

/* ---- fork support, strings ---- */

int ibv_fork_init(void)
{
	return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void)
{
	/* As on a kernel with MADV_DONTFORK-free copy-on-fork for pinned pages. */
	return IBV_FORK_UNNEEDED;
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
	};
	if ((unsigned)status < sizeof(s) / sizeof(s[0]) && s[status])
		return s[status];
	return "unknown";
}

const char *ibv_node_type_str(enum ibv_node_type t)
{
	return t == IBV_NODE_UNSPECIFIED ? "unspecified" : "unknown";
}

const char *ibv_port_state_str(enum ibv_port_state s)
{
	return s == IBV_PORT_ACTIVE ? "PORT_ACTIVE" : s == IBV_PORT_DOWN ? "PORT_DOWN" : "unknown";
}

int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *event)
{
	(void)c;
	(void)event;
	errno = EAGAIN; /* the simulated device raises no asynchronous events */
	return -1;
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event;
}
