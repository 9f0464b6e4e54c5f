//! The one list of the doctor's checks: every id a check may report, what it looks at and
//! what to do when it is not ok. `rdma-bench doctor --list-checks [--markdown]` prints it,
//! README.md's doctor table is its markdown (a test compares the two), and a test runs
//! every fixture node and fails on an id missing here.

use std::fmt::Write as _;

/// One check of the doctor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckInfo {
    /// The id the report shows (`env.RULE` stands for every rule of [`crate::env`]).
    pub id: &'static str,
    /// What it checks, and where it reads it.
    pub checks: &'static str,
    /// What to do when it warns or fails.
    pub fix: &'static str,
}

const fn c(id: &'static str, checks: &'static str, fix: &'static str) -> CheckInfo {
    CheckInfo { id, checks, fix }
}

/// Every check, in the order the doctor reports them.
pub const CHECKS: &[CheckInfo] = &[
    c(
        "instance",
        "the instance type or ConnectX host, from `/sys/class/dmi/id/{product_name,sys_vendor}` and `bench-doctor/data/instances.toml`",
        "never fails; an unknown type skips the per-instance checks",
    ),
    c(
        "gpus",
        "the GPUs on `/sys/bus/pci/devices` against the instance's count, and that the NVIDIA driver is loaded",
        "a GPU missing: `dmesg` for Xid 79 / AER errors, reboot or replace the node; no driver: `modprobe nvidia`",
    ),
    c(
        "rdma.devices",
        "RDMA devices in `/sys/class/infiniband`",
        "load the NIC's RDMA driver (`modprobe efa` / `mlx5_ib`), or benchmark with `--provider shm` or `tcp`",
    ),
    c(
        "rdma.links",
        "every port's `state` and `phys_state` is ACTIVE / LinkUp",
        "check the cable and port (`ibstat`, `rdma link`), the subnet manager or switch; on EFA stop and start the instance",
    ),
    c(
        "rdma.rate",
        "every port's `rate` against the instance type's NIC speed",
        "the link trained down: reseat or replace the cable or transceiver, check the switch port's speed",
    ),
    c(
        "rdma.count",
        "the EFA or mlx5 device count against the instance type (ConnectX: against the GPUs)",
        "a device is missing: `dmesg | grep -i efa`, reload the driver, or stop and start the instance",
    ),
    c(
        "memlock",
        "Max locked memory in `/proc/self/limits` (RDMA pins every registered buffer)",
        "`* - memlock unlimited` in /etc/security/limits.conf (Slurm: PropagateResourceLimits; containers: `--ulimit memlock=-1`)",
    ),
    c(
        "libfabric",
        "the libfabric this process loaded: version, path, providers (efa on an EFA host)",
        "install the EFA software (efa_installer.sh) and run with `LD_LIBRARY_PATH=/opt/amazon/efa/lib`",
    ),
    c(
        "gpu.memory",
        "shown alone where there is no GPU: GPU memory registration does not apply",
        "none",
    ),
    c(
        "gpu.peermem",
        "a peer memory module in `/proc/modules` (nvidia_peermem, efa_nv_peermem)",
        "`modprobe nvidia_peermem` (ConnectX) or install efa_nv_peermem (EFA), or rely on dmabuf",
    ),
    c(
        "gpu.dmabuf",
        "dmabuf export: Linux >= 5.12 and NVIDIA's open kernel module (`/proc/driver/nvidia/version`); whether the NIC driver takes it shows only at registration",
        "use the NVIDIA open kernel modules on Linux >= 5.12, or load a peermem module",
    ),
    c(
        "libfabric.hmem",
        "with GPUs: the loaded libfabric opens an `FI_HMEM` endpoint and names `libcuda.so`",
        "use the EFA installer's libfabric (/opt/amazon/efa, built with CUDA), or the verbs backend for GPU memory",
    ),
    c(
        "gpu.path",
        "the path GPU memory will register through: peer memory, dmabuf, or none",
        "load nvidia_peermem / efa_nv_peermem, or move to the NVIDIA open kernel modules (dmabuf)",
    ),
    c(
        "pcie.links",
        "every GPU's and RDMA NIC's `current_link_{speed,width}` against `max_link_*` (a GPU below top speed is normal at idle)",
        "none: where a link is short, `pcie.width` or `pcie.speed` replaces it",
    ),
    c(
        "pcie.width",
        "a GPU or NIC link narrower than it can be",
        "a degraded link: reseat the card or riser, or replace the node (`lspci -vv | grep LnkSta`)",
    ),
    c(
        "pcie.speed",
        "a NIC link below its top speed",
        "the link trained down: check `lspci -vv` LnkSta and the slot; reseat or replace",
    ),
    c(
        "iommu",
        "IOMMU groups in `/sys/kernel/iommu_groups` and `iommu=pt` in `/proc/cmdline`",
        "add `iommu=pt` to the kernel command line (GRUB_CMDLINE_LINUX) and reboot",
    ),
    c(
        "pcie.acs",
        "ACS P2P redirect on the bridges between GPUs and NICs (extended config space, root only)",
        "run doctor as root or `sudo lspci -vvv | grep -i ACSCtl`; disable the redirect (BIOS, or `setpci`) for GPUDirect RDMA",
    ),
    c(
        "numa.nic",
        "every GPU has its nearest NICs on its NUMA node (hwloc, `--topology FILE.xml`, or sysfs `numa_node` with `--root`)",
        "use the NIC nearest each GPU (`rdma-bench topo`); check the BIOS NUMA settings and that no NIC is missing",
    ),
    c(
        "env",
        "shown alone where no `FI_*` or `NCCL_*` setting conflicts with the node",
        "none",
    ),
    c(
        "env.RULE",
        "one `FI_*` / `NCCL_*` setting that conflicts with the node (the rules below)",
        "the rule's own fix",
    ),
    c(
        "LIBRARY",
        "another backend's library, as its probe reports it (version, path, what it offers); its own findings as `LIBRARY.FINDING`",
        "the finding's own fix",
    ),
];

/// Whether `id` (as a report shows it) is one of the doctor's own checks: exactly, or `env.`
/// and a rule of [`crate::env`] (a backend's probe names its checks after its library).
pub fn listed(id: &str) -> bool {
    CHECKS.iter().any(|c| c.id == id)
        || id
            .strip_prefix("env.")
            .is_some_and(|r| crate::env::RULES.iter().any(|x| x.id == r))
}

/// The list as README.md's markdown table.
pub fn markdown() -> String {
    let mut s = String::from("| check | what it checks | what to do |\n| --- | --- | --- |\n");
    for c in CHECKS {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} |",
            c.id,
            c.checks.replace('|', "\\|"),
            c.fix.replace('|', "\\|")
        );
    }
    s
}

/// The list for a terminal: id, what it checks, and the fix on the next line.
pub fn text() -> String {
    let w = CHECKS.iter().map(|c| c.id.len()).max().unwrap_or(0);
    let mut s = String::new();
    for c in CHECKS {
        let _ = writeln!(s, "{:<w$}  {}", c.id, c.checks);
        if c.fix != "none" {
            let _ = writeln!(s, "{:<w$}  fix: {}", "", c.fix);
        }
    }
    s
}
