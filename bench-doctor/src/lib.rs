//! `rdma-bench doctor`: a pre-flight check of the node. Every check says ok, warn, fail (or
//! skip, where it does not apply or cannot be read), with the fix in one line. Exit status:
//! 0 all ok, 1 warnings, 2 a failure.
//!
//! Everything is read from files under a root (`/`, or `--root DIR` with a copy or a fixture
//! tree), except what only this process can know: the libfabric it loaded (skipped under
//! `--root`) and, without `--topology`, hwloc's view of the live machine.

#![forbid(unsafe_code)]

pub mod env;
pub mod error;
pub mod instances;
pub mod lf;
mod report;
pub mod sys;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

pub use crate::error::{Error, Result};
pub use crate::report::{render, Check, Report, Status};
use report::exit_code;
use sys::{Facts, Limit, Sys};

/// What the doctor reads and how it prints (`rdma-bench doctor`'s flags).
#[derive(Debug, Clone, Default)]
pub struct DoctorCfg {
    /// Print one JSON object instead of the table.
    pub json: bool,
    /// Read sysfs and procfs under this directory instead of / (a copy of another node's
    /// files, or a test fixture); libfabric, which is this process's, is then not checked.
    pub root: Option<PathBuf>,
    /// Take the GPU/NIC/NUMA layout from an hwloc XML export instead of this machine.
    pub topology: Option<PathBuf>,
}

fn check(id: &str, status: Status, summary: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        id: id.into(),
        status,
        summary: summary.into(),
        fix: fix.map(str::to_string),
    }
}

/// Everything doctor judges, injectable for tests.
pub struct Inputs {
    pub root: PathBuf,
    pub env: Vec<(String, String)>,
    /// GPU/NIC grouping from `topo`; `None` falls back to sysfs NUMA nodes.
    pub topology: Option<topo::Topology>,
    /// The loaded libfabric; `None` skips those checks.
    pub libfabric: Option<lf::Libfabric>,
}

/// Run every check.
pub fn run(inp: &Inputs) -> Report {
    let sys = Sys::new(&inp.root);
    let f = sys::gather(&sys);
    let mut c = vec![instance(&f), gpus(&f)];
    c.push(rdma_devices(&f));
    c.extend(rdma_links(&f));
    c.push(rdma_count(&f));
    c.push(memlock(&f));
    c.extend(libfabric(&f, inp.libfabric.as_ref()));
    c.extend(gpu_memory(&f, inp.libfabric.as_ref()));
    c.extend(pcie_links(&f));
    c.push(iommu(&f));
    c.push(acs(&sys, &f));
    c.extend(numa(&f, inp.topology.as_ref()));
    c.extend(env::checks(&env::Ctx {
        env: env::Env(&inp.env),
        facts: &f,
        libfabric: inp.libfabric.as_ref().and_then(|l| {
            let (a, b) = l.version.split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        }),
    }));
    let mut r = Report {
        root: inp.root.display().to_string(),
        product: f.product.clone(),
        vendor: f.vendor.clone(),
        instance: f.instance.map(|i| i.name.clone()),
        checks: c,
        exit_code: 0,
    };
    r.exit_code = exit_code(r.worst());
    r
}

// ---------------------------------------------------------------------------------------
// The checks

fn instance(f: &Facts) -> Check {
    let what = match (&f.product, &f.vendor) {
        (Some(p), Some(v)) => format!("{p} ({v})"),
        (Some(p), None) => p.clone(),
        _ => "no DMI product name".into(),
    };
    let s = match f.instance {
        Some(i) => format!("{what}: {}, {}", i.name, i.description),
        None if f.has_mlx5() => {
            let fast = f
                .nics_of("mlx5")
                .iter()
                .flat_map(|d| d.ports.iter())
                .any(|p| p.gbps().is_some_and(|g| g >= 400.0));
            format!(
                "{what}: ConnectX host ({} mlx5 device(s){})",
                f.nics_of("mlx5").len(),
                if fast {
                    ", 400 Gbit/s ports: gate with --expect cx7-400"
                } else {
                    ""
                }
            )
        }
        None => format!("{what}: not in the instance table; per-instance checks skipped"),
    };
    check("instance", Status::Ok, s, None)
}

fn gpus(f: &Facts) -> Check {
    let g = f.gpus();
    let nvidia = g.iter().any(|d| d.vendor == "0x10de");
    if let Some(i) = f.instance.filter(|i| i.gpus > 0) {
        if g.len() != i.gpus as usize {
            return check(
                "gpus",
                Status::Fail,
                format!("{} GPU(s) on PCI, {} has {}", g.len(), i.name, i.gpus),
                Some("a GPU is missing from the bus: check `dmesg` for Xid 79 / AER errors, then reboot or replace the node"),
            );
        }
    }
    if g.is_empty() {
        return check("gpus", Status::Ok, "no GPU: host memory only", None);
    }
    if nvidia && f.nvidia.is_none() && !f.module("nvidia") {
        return check(
            "gpus",
            Status::Warn,
            format!(
                "{} NVIDIA GPU(s) but the nvidia driver is not loaded",
                g.len()
            ),
            Some("install or load the NVIDIA driver (modprobe nvidia)"),
        );
    }
    let drv = f.nvidia.as_deref().map(nvidia_short).unwrap_or_default();
    check(
        "gpus",
        Status::Ok,
        format!(
            "{} GPU(s){}",
            g.len(),
            if drv.is_empty() {
                String::new()
            } else {
                format!("; {drv}")
            }
        ),
        None,
    )
}

/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07 ...` ->
/// `NVIDIA driver 550.90.07, open kernel module`.
fn nvidia_short(v: &str) -> String {
    let ver = v
        .split_whitespace()
        .find(|t| {
            t.split('.').count() >= 2
                && t.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .unwrap_or("?");
    let kind = if v.contains("Open Kernel Module") {
        "open kernel module"
    } else {
        "proprietary kernel module"
    };
    format!("NVIDIA driver {ver}, {kind}")
}

fn rdma_devices(f: &Facts) -> Check {
    if f.ib.is_empty() {
        let expected = f.instance.is_some();
        return check(
            "rdma.devices",
            if expected { Status::Fail } else { Status::Warn },
            if expected {
                "no RDMA device in /sys/class/infiniband on an RDMA instance type".to_string()
            } else {
                "no RDMA device in /sys/class/infiniband: only the shm and tcp providers can run here".to_string()
            },
            Some(if f.has_efa() || expected {
                "load the EFA driver (modprobe efa; install the EFA software if absent)"
            } else {
                "load the NIC's RDMA driver (modprobe efa / mlx5_ib), or benchmark with --provider shm|tcp"
            }),
        );
    }
    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
    for d in &f.ib {
        *kinds.entry(d.kind.as_str()).or_default() += 1;
    }
    let k: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    check(
        "rdma.devices",
        Status::Ok,
        format!("{} RDMA device(s): {}", f.ib.len(), k.join(", ")),
        None,
    )
}

fn rdma_links(f: &Facts) -> Vec<Check> {
    if f.ib.is_empty() {
        return vec![];
    }
    let mut down = Vec::new();
    let mut slow = Vec::new();
    let want = f.instance.map(|i| (i.nic_driver.as_str(), i.nic_gbps));
    let mut rates = std::collections::BTreeSet::new();
    for d in &f.ib {
        if d.ports.is_empty() {
            down.push(format!("{} (no port)", d.name));
        }
        for p in &d.ports {
            if !p.active() || !p.link_up() {
                down.push(format!(
                    "{}/{}: {} {}",
                    d.name,
                    p.num,
                    p.state.as_deref().unwrap_or("state unknown"),
                    p.phys_state.as_deref().unwrap_or("")
                ));
            }
            if let Some(r) = p.rate.as_deref() {
                rates.insert(r.to_string());
            }
            if let (Some((kind, gbps)), Some(got)) = (want, p.gbps()) {
                if d.kind == kind && got + 0.5 < gbps {
                    slow.push(format!("{}/{} at {got} Gb/s", d.name, p.num));
                }
            }
        }
    }
    let mut out = Vec::new();
    if down.is_empty() {
        out.push(check(
            "rdma.links",
            Status::Ok,
            format!(
                "every port ACTIVE / LinkUp; rates: {}",
                rates.into_iter().collect::<Vec<_>>().join(", ")
            ),
            None,
        ));
    } else {
        out.push(check(
            "rdma.links",
            Status::Fail,
            format!("{} port(s) not up: {}", down.len(), short_list(&down)),
            Some("check the cable/port (ibstat, `rdma link`), then the subnet manager or switch; on EFA, stop and start the instance"),
        ));
    }
    if !slow.is_empty() {
        let (k, g) = want.unwrap_or(("", 0.0));
        out.push(check(
            "rdma.rate",
            Status::Warn,
            format!(
                "{} port(s) below the {g} Gb/s of a {k} device here: {}",
                slow.len(),
                short_list(&slow)
            ),
            Some("the link trained down: reseat or replace the cable/transceiver, check the switch port speed"),
        ));
    }
    out
}

fn short_list(v: &[String]) -> String {
    if v.len() <= 4 {
        v.join("; ")
    } else {
        format!("{}; and {} more", v[..4].join("; "), v.len() - 4)
    }
}

fn rdma_count(f: &Facts) -> Check {
    let g = f.gpus().len();
    if let Some(i) = f.instance.filter(|i| i.nics > 0) {
        let have = f.nics_of(&i.nic_driver).len();
        let want = i.nics as usize;
        let per = if g > 0 {
            format!(" for {g} GPU(s)")
        } else {
            String::new()
        };
        return match have.cmp(&want) {
            std::cmp::Ordering::Equal => check(
                "rdma.count",
                Status::Ok,
                format!("{have} {} device(s){per}, as {} has", i.nic_driver, i.name),
                None,
            ),
            std::cmp::Ordering::Less => check(
                "rdma.count",
                Status::Fail,
                format!(
                    "{have} of {want} {} devices{per} ({} has {} per GPU): the missing ones' GPUs lose bandwidth",
                    i.nic_driver,
                    i.name,
                    i.nics_per_gpu()
                ),
                Some("a device is missing: check `dmesg | grep -i efa`, reload the driver, or stop/start the instance"),
            ),
            std::cmp::Ordering::Greater => check(
                "rdma.count",
                Status::Warn,
                format!("{have} {} devices, more than the {want} of {}", i.nic_driver, i.name),
                Some("check that the DMI product name matches this hardware"),
            ),
        };
    }
    let mlx = f.nics_of("mlx5").len();
    if mlx > 0 && g > 0 {
        return if mlx >= g {
            check(
                "rdma.count",
                Status::Ok,
                format!("{mlx} ConnectX device(s) for {g} GPU(s)"),
                None,
            )
        } else {
            check(
                "rdma.count",
                Status::Warn,
                format!("{mlx} ConnectX device(s) for {g} GPU(s): GPUs share NICs"),
                Some("expected on some designs; otherwise check `lspci | grep Mellanox` for a missing NIC"),
            )
        };
    }
    check(
        "rdma.count",
        Status::Skip,
        "no known instance type or ConnectX NICs with GPUs to count against",
        None,
    )
}

fn memlock(f: &Facts) -> Check {
    const GIB: u64 = 1 << 30;
    let rdma = !f.ib.is_empty();
    match f.memlock {
        None => check(
            "memlock",
            Status::Skip,
            "cannot read Max locked memory from /proc/self/limits",
            None,
        ),
        Some(Limit::Unlimited) => check("memlock", Status::Ok, "ulimit -l unlimited", None),
        Some(Limit::Bytes(b)) => {
            let status = if !rdma || b >= GIB {
                Status::Warn
            } else {
                Status::Fail
            };
            check(
                "memlock",
                status,
                format!(
                    "ulimit -l is {} KiB: RDMA pins every registered buffer{}",
                    b / 1024,
                    if rdma {
                        ", and registration fails past the limit"
                    } else {
                        ""
                    }
                ),
                Some("set `* - memlock unlimited` in /etc/security/limits.conf (Slurm: PropagateResourceLimits, containers: --ulimit memlock=-1)"),
            )
        }
    }
}

fn libfabric(f: &Facts, lf: Option<&lf::Libfabric>) -> Vec<Check> {
    let Some(l) = lf else {
        return vec![check(
            "libfabric",
            Status::Skip,
            "not checked: --root reads another machine's files, libfabric is this process's (or this build has no efa backend)",
            None,
        )];
    };
    let efa = l.providers.iter().any(|p| p == "efa");
    let s = format!(
        "libfabric {} ({}), providers: {}; FI_HMEM on {}: {}, CUDA in the library: {}",
        l.version,
        l.library.as_deref().unwrap_or("library path unknown"),
        l.providers.join(", "),
        l.hmem_provider.as_deref().unwrap_or("-"),
        if l.hmem { "yes" } else { "no" },
        match l.cuda {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        }
    );
    if f.has_efa() && !efa {
        return vec![check(
            "libfabric",
            Status::Fail,
            format!("{s}; no efa provider on an EFA host"),
            Some("install the EFA software (efa_installer.sh) and run with LD_LIBRARY_PATH=/opt/amazon/efa/lib"),
        )];
    }
    vec![check("libfabric", Status::Ok, s, None)]
}

fn gpu_memory(f: &Facts, lf: Option<&lf::Libfabric>) -> Vec<Check> {
    let gpus = f.gpus();
    if gpus.is_empty() {
        return vec![check(
            "gpu.memory",
            Status::Skip,
            "no GPU: GPU memory registration does not apply",
            None,
        )];
    }
    let mut out = Vec::new();
    let rdma = !f.ib.is_empty();
    // Peer memory: the kernel module that lets the NIC driver pin GPU pages.
    let peermem: Vec<&str> = ["nvidia_peermem", "efa_nv_peermem", "nv_peer_mem"]
        .into_iter()
        .filter(|m| f.module(m))
        .collect();
    out.push(if peermem.is_empty() {
        check(
            "gpu.peermem",
            if rdma { Status::Warn } else { Status::Skip },
            "no nvidia_peermem / efa_nv_peermem module loaded",
            rdma.then_some("modprobe nvidia_peermem (ConnectX) or install efa_nv_peermem (EFA), or rely on dmabuf"),
        )
    } else {
        check(
            "gpu.peermem",
            Status::Ok,
            format!("{} loaded", peermem.join(", ")),
            None,
        )
    });
    // dmabuf: Linux >= 5.12 exports, NVIDIA's open kernel modules export GPU memory.
    let kernel = f.kernel.as_deref().and_then(sys::kernel_version);
    let open = f
        .nvidia
        .as_deref()
        .map(|v| v.contains("Open Kernel Module"));
    let (dmabuf, why) = match (kernel, open) {
        (Some(k), _) if k < (5, 12) => (false, format!("kernel {}.{} is older than 5.12", k.0, k.1)),
        (_, Some(false)) => (false, "the NVIDIA driver is the proprietary kernel module (dmabuf export needs the open modules, r515+)".into()),
        (_, None) => (false, "no NVIDIA driver version in /proc/driver/nvidia/version".into()),
        (None, Some(true)) => (true, "NVIDIA open kernel module (kernel version unknown)".into()),
        (Some(k), Some(true)) => (true, format!("kernel {}.{} and the NVIDIA open kernel module", k.0, k.1)),
    };
    out.push(check(
        "gpu.dmabuf",
        if dmabuf {
            Status::Ok
        } else if rdma && peermem.is_empty() {
            Status::Warn
        } else {
            Status::Skip
        },
        format!(
            "dmabuf {}: {why}; whether the NIC driver takes it shows only at registration",
            if dmabuf { "possible" } else { "not available" }
        ),
        (!dmabuf).then_some(
            "use the NVIDIA open kernel modules on Linux >= 5.12, or load a peermem module",
        ),
    ));
    // libfabric's own CUDA support.
    if let Some(l) = lf {
        let p = l.hmem_provider.as_deref().unwrap_or("?");
        let ok = l.hmem && l.cuda == Some(true);
        let s = format!(
            "libfabric {}: FI_HMEM on {p} {}, CUDA in the library {}",
            l.version,
            if l.hmem { "yes" } else { "no" },
            match l.cuda {
                Some(true) => "yes",
                Some(false) => "no (it never names libcuda.so)",
                None => "unknown",
            }
        );
        out.push(if ok {
            check("libfabric.hmem", Status::Ok, s, None)
        } else {
            check(
                "libfabric.hmem",
                if f.has_efa() { Status::Fail } else { Status::Warn },
                format!("{s}: --mem cuda over libfabric will fail"),
                Some("use the EFA installer's libfabric (/opt/amazon/efa, built with CUDA), or the verbs backend for GPU memory"),
            )
        });
    }
    // The path that will be used.
    out.push(if !rdma {
        check(
            "gpu.path",
            Status::Skip,
            "no RDMA NIC: nothing registers GPU memory with a NIC here",
            None,
        )
    } else if !peermem.is_empty() {
        check(
            "gpu.path",
            Status::Ok,
            format!("GPU memory registers through peer memory ({})", peermem[0]),
            None,
        )
    } else if dmabuf {
        check(
            "gpu.path",
            Status::Ok,
            "GPU memory registers through dmabuf",
            None,
        )
    } else {
        check(
            "gpu.path",
            Status::Fail,
            "GPU memory registration will fail: no peermem module and no dmabuf",
            Some("load nvidia_peermem / efa_nv_peermem, or move to the NVIDIA open kernel modules (dmabuf)"),
        )
    });
    out
}

fn pcie_links(f: &Facts) -> Vec<Check> {
    let nic_pci: Vec<(&str, &str)> =
        f.ib.iter()
            .filter_map(|d| d.pci.as_deref().map(|p| (d.name.as_str(), p)))
            .collect();
    let mut devs: Vec<(String, bool, &sys::PciDev)> = f
        .gpus()
        .into_iter()
        .map(|d| (format!("GPU {}", d.addr), true, d))
        .collect();
    for (name, addr) in &nic_pci {
        if let Some(d) = f.pci.get(*addr) {
            devs.push((format!("{name} {addr}"), false, d));
        }
    }
    if devs.is_empty() {
        return vec![check(
            "pcie.links",
            Status::Skip,
            "no GPU or RDMA NIC on PCI",
            None,
        )];
    }
    let (mut narrow, mut slow, mut idle, mut unknown) = (vec![], vec![], vec![], 0);
    for (name, gpu, d) in &devs {
        let (Some(cw), Some(mw)) = (d.cur_width, d.max_width) else {
            unknown += 1;
            continue;
        };
        if cw < mw {
            narrow.push(format!("{name} x{cw} of x{mw}"));
        }
        let cs = d.cur_speed.as_deref().and_then(sys::gts);
        let ms = d.max_speed.as_deref().and_then(sys::gts);
        if let (Some(c), Some(m)) = (cs, ms) {
            if c + 0.01 < m {
                let s = format!("{name} {c} of {m} GT/s");
                if *gpu {
                    idle.push(s);
                } else {
                    slow.push(s);
                }
            }
        }
    }
    let mut out = Vec::new();
    let n = devs.len() - unknown;
    if !narrow.is_empty() {
        out.push(check(
            "pcie.width",
            Status::Fail,
            format!("{} link(s) narrower than they can be: {}", narrow.len(), short_list(&narrow)),
            Some("a degraded PCIe link: reseat the card/riser or replace the node (`lspci -vv | grep LnkSta`)"),
        ));
    }
    if !slow.is_empty() {
        out.push(check(
            "pcie.speed",
            Status::Warn,
            format!(
                "{} NIC link(s) below their top speed: {}",
                slow.len(),
                short_list(&slow)
            ),
            Some("the link trained down: check `lspci -vv` LnkSta and the slot; reseat or replace"),
        ));
    }
    if out.is_empty() {
        let mut s = format!("{n} GPU/NIC link(s) at full width");
        if !idle.is_empty() {
            let _ = write!(
                s,
                "; {} GPU link(s) below top speed, normal while idle (GPUs slow the link to save power; judge under load)",
                idle.len()
            );
        }
        if unknown > 0 {
            let _ = write!(
                s,
                "; {unknown} without link attributes (virtual functions?)"
            );
        }
        out.push(check(
            "pcie.links",
            if n == 0 { Status::Skip } else { Status::Ok },
            s,
            None,
        ));
    }
    out
}

fn iommu(f: &Facts) -> Check {
    let cmd = f.cmdline.split_whitespace().collect::<Vec<_>>();
    let pt = cmd.contains(&"iommu=pt");
    let forced = cmd
        .iter()
        .find(|a| a.starts_with("intel_iommu=on") || a.starts_with("amd_iommu=on"));
    if f.iommu_groups == 0 {
        return check(
            "iommu",
            Status::Ok,
            "IOMMU off (no IOMMU groups): peer-to-peer is not translated",
            None,
        );
    }
    if pt {
        return check(
            "iommu",
            Status::Ok,
            format!(
                "IOMMU on in passthrough mode (iommu=pt), {} group(s)",
                f.iommu_groups
            ),
            None,
        );
    }
    check(
        "iommu",
        Status::Warn,
        format!(
            "IOMMU on in translated mode ({} group(s){}, no iommu=pt): GPU-NIC peer-to-peer goes through the IOMMU (slow or blocked)",
            f.iommu_groups,
            forced.map(|a| format!(", {a}")).unwrap_or_default()
        ),
        Some("add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX) and reboot"),
    )
}

/// PCIe extended capability id of ACS.
const ACS_CAP: u16 = 0x000d;

/// The ACS control register of a device's config space, where the file holds the
/// extended capabilities (root reads 4096 bytes; others get 64).
pub fn acs_ctrl(config: &[u8]) -> Option<u16> {
    if config.len() < 0x104 {
        return None;
    }
    let rd32 = |o: usize| -> Option<u32> {
        config
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut off = 0x100usize;
    for _ in 0..64 {
        let h = rd32(off)?;
        if h == 0 || h == 0xffff_ffff {
            return None;
        }
        if (h & 0xffff) as u16 == ACS_CAP {
            let c = config.get(off + 6..off + 8)?;
            return Some(u16::from_le_bytes([c[0], c[1]]));
        }
        let next = (h >> 20) as usize & 0xffc;
        if next < 0x100 {
            return None;
        }
        off = next;
    }
    None
}

fn acs(sys: &Sys, f: &Facts) -> Check {
    if f.gpus().is_empty() || f.ib.is_empty() {
        return check(
            "pcie.acs",
            Status::Skip,
            "no GPU-to-NIC peer-to-peer on this host",
            None,
        );
    }
    let bridges: Vec<&sys::PciDev> = f.pci.values().filter(|d| d.is_bridge()).collect();
    let mut read = 0;
    let mut redirect = Vec::new();
    for b in &bridges {
        let Some(cfg) = sys.bytes(&format!("/sys/bus/pci/devices/{}/config", b.addr)) else {
            continue;
        };
        if cfg.len() < 0x104 {
            continue;
        }
        read += 1;
        if let Some(ctl) = acs_ctrl(&cfg) {
            // Bit 2: P2P Request Redirect, bit 3: P2P Completion Redirect.
            if ctl & 0b1100 != 0 {
                redirect.push(b.addr.clone());
            }
        }
    }
    if bridges.is_empty() {
        return check(
            "pcie.acs",
            Status::Skip,
            "no PCIe bridge listed: nothing between GPU and NIC to redirect peer-to-peer",
            None,
        );
    }
    if read == 0 {
        return check(
            "pcie.acs",
            Status::Skip,
            format!(
                "ACS control of {} bridge(s) not readable: it sits in PCIe extended config space, which only root can read",
                bridges.len()
            ),
            Some("run doctor as root, or `sudo lspci -vvv | grep -i ACSCtl` (ReqRedir+/CmpltRedir+ on a switch port blocks direct P2P)"),
        );
    }
    if redirect.is_empty() {
        return check(
            "pcie.acs",
            Status::Ok,
            format!("no P2P redirect in the ACS control of {read} bridge(s)"),
            None,
        );
    }
    check(
        "pcie.acs",
        Status::Warn,
        format!(
            "ACS redirects peer-to-peer to the root complex on {} bridge(s): {}",
            redirect.len(),
            short_list(&redirect)
        ),
        Some("disable ACS P2P redirect on the PCIe switch ports (BIOS, or `setpci -s BDF ECAP_ACS+6.w=0`) for GPUDirect RDMA"),
    )
}

fn numa(f: &Facts, topo: Option<&topo::Topology>) -> Vec<Check> {
    if let Some(t) = topo.filter(|t| !t.gpus().is_empty()) {
        return vec![numa_topo(f, t)];
    }
    // Fallback: sysfs NUMA nodes of the GPUs and RDMA NICs.
    let gpus = f.gpus();
    if gpus.is_empty() {
        return vec![check(
            "numa.nic",
            Status::Skip,
            "no GPU: nearest-NIC placement does not apply",
            None,
        )];
    }
    if f.ib.is_empty() {
        return vec![check(
            "numa.nic",
            Status::Skip,
            "no RDMA NIC to place next to the GPUs",
            None,
        )];
    }
    let nic_numa: Vec<Option<u32>> =
        f.ib.iter()
            .map(|d| {
                d.pci
                    .as_ref()
                    .and_then(|a| f.pci.get(a))
                    .and_then(|p| p.numa)
            })
            .collect();
    let mut far = Vec::new();
    for g in &gpus {
        let Some(n) = g.numa else { continue };
        if !nic_numa.contains(&Some(n)) {
            far.push(format!("GPU {} (NUMA {n})", g.addr));
        }
    }
    if far.is_empty() {
        check_vec(
            "numa.nic",
            Status::Ok,
            format!(
                "every GPU has an RDMA NIC on its NUMA node ({} GPU(s), from sysfs)",
                gpus.len()
            ),
            None,
        )
    } else {
        check_vec(
            "numa.nic",
            Status::Warn,
            format!("no RDMA NIC on the NUMA node of {}: traffic crosses the CPU interconnect", short_list(&far)),
            Some("use the NIC nearest each GPU (`rdma-bench topo`); check BIOS NUMA settings and that no NIC is missing"),
        )
    }
}

fn check_vec(id: &str, s: Status, m: String, fix: Option<&str>) -> Vec<Check> {
    vec![check(id, s, m, fix)]
}

fn numa_topo(f: &Facts, t: &topo::Topology) -> Check {
    let nic_numa = |name: &str| {
        t.numa_groups()
            .iter()
            .find(|g| g.nics.iter().any(|n| n.name == name))
            .and_then(|g| g.numa)
    };
    let want = f.instance.map(|i| i.nics_per_gpu()).unwrap_or(0.0);
    let (mut none, mut cross, mut few) = (vec![], vec![], vec![]);
    for g in t.gpus() {
        if g.nics.is_empty() {
            none.push(format!("GPU {}", g.index));
            continue;
        }
        let same = g
            .nics
            .iter()
            .filter(|n| g.numa.is_none() || nic_numa(&n.name) == g.numa)
            .count();
        if same == 0 {
            cross.push(format!(
                "GPU {} (NUMA {}) -> {}",
                g.index,
                g.numa.map_or("-".into(), |n| n.to_string()),
                g.nic_names().join(",")
            ));
        }
        if (g.nics.len() as f64) + 1e-9 < want.floor().max(1.0) && want >= 1.0 {
            few.push(format!("GPU {}: {} of {want}", g.index, g.nics.len()));
        }
    }
    let n = t.gpus().len();
    let any_nic = !t.all_nics().is_empty();
    if !any_nic {
        return check(
            "numa.nic",
            Status::Skip,
            format!("{n} GPU(s), no RDMA NIC in the topology"),
            None,
        );
    }
    if !none.is_empty() {
        return check(
            "numa.nic",
            Status::Fail,
            format!("no RDMA NIC near {} (topo)", short_list(&none)),
            Some("a NIC is missing or unassigned: compare `rdma-bench topo` with the instance layout"),
        );
    }
    if !cross.is_empty() {
        return check(
            "numa.nic",
            Status::Warn,
            format!("cross-NUMA NIC: {}", short_list(&cross)),
            Some("pin each GPU's traffic to NICs on its NUMA node (`rdma-bench topo` lists them)"),
        );
    }
    if !few.is_empty() {
        return check(
            "numa.nic",
            Status::Warn,
            format!(
                "GPUs with fewer NICs than the instance has per GPU: {}",
                short_list(&few)
            ),
            Some("a NIC is missing: see rdma.count"),
        );
    }
    let per: Vec<usize> = t.gpus().iter().map(|g| g.nics.len()).collect();
    check(
        "numa.nic",
        Status::Ok,
        format!(
            "each of {n} GPU(s) has its nearest NIC(s) on its NUMA node ({} per GPU, topo)",
            per.iter().min().copied().unwrap_or(0)
        ),
        None,
    )
}

// ---------------------------------------------------------------------------------------
// The command

fn collect_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("FI_") || k.starts_with("NCCL_"))
        .collect()
}

/// Gather the inputs `a` asks for: this machine, or files under `--root`.
pub fn inputs(a: &DoctorCfg) -> Result<Inputs> {
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    if !sys::is_dir(&root) {
        return Err(Error::Usage(format!(
            "--root {}: not a directory",
            root.display()
        )));
    }
    let topology = match (&a.topology, &a.root) {
        (Some(x), _) => {
            Some(topo::from_xml(x).map_err(|e| Error::Usage(format!("--topology: {e}")))?)
        }
        // Live: hwloc's view; a failure leaves the sysfs fallback.
        (None, None) => topo::discover().ok(),
        (None, Some(_)) => None,
    };
    Ok(Inputs {
        root,
        env: collect_env(),
        topology,
        libfabric: if a.root.is_some() { None } else { lf::probe() },
    })
}

/// `rdma-bench doctor`: print the verdict, exit 0/1/2.
pub fn main(a: &DoctorCfg) -> ExitCode {
    let inp = match inputs(a) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("rdma-bench: error: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let r = run(&inp);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", render(&r));
    }
    ExitCode::from(r.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acs_control_is_found_in_the_extended_capability_list() {
        let mut cfg = vec![0u8; 4096];
        // 0x100: AER (id 1), next at 0x148; 0x148: ACS (id 0xd), next 0.
        cfg[0x100..0x104].copy_from_slice(&(1u32 | (0x148 << 20)).to_le_bytes());
        cfg[0x148..0x14c].copy_from_slice(&(ACS_CAP as u32 | (1 << 16)).to_le_bytes());
        cfg[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        assert_eq!(acs_ctrl(&cfg), Some(0x1d));
        assert_eq!(acs_ctrl(&cfg[..64]), None);
        let mut no = vec![0u8; 4096];
        no[0x100..0x104].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(acs_ctrl(&no), None);
    }
}
