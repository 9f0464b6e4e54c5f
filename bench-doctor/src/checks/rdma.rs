//! RDMA checks: the devices, their links and rates, their count against the instance type,
//! the memlock limit registration needs, and the libfabric this process loaded.

use super::{check, short_list};
use crate::lf;
use crate::report::{Check, Status};
use crate::sys::{Facts, Limit};

pub(crate) fn rdma_devices(f: &Facts) -> Check {
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

pub(crate) fn rdma_links(f: &Facts) -> Vec<Check> {
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

pub(crate) fn rdma_count(f: &Facts) -> Check {
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

pub(crate) fn memlock(f: &Facts) -> Check {
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

pub(crate) fn libfabric(f: &Facts, lf: Option<&lf::Libfabric>) -> Vec<Check> {
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
    let mut out = if f.has_efa() && !efa {
        vec![check(
            "libfabric",
            Status::Fail,
            format!("{s}; no efa provider on an EFA host"),
            Some("install the EFA software (efa_installer.sh) and run with LD_LIBRARY_PATH=/opt/amazon/efa/lib"),
        )]
    } else {
        vec![check("libfabric", Status::Ok, s, None)]
    };
    // The backend's probe may know more than the doctor asks (as UCX's does).
    out.extend(crate::finding_checks(&l.findings));
    out
}
