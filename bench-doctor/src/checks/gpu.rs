//! GPU checks: the GPUs on the bus and their driver, and the paths GPU memory can register
//! with a NIC (peer memory, dmabuf, libfabric's FI_HMEM).

use super::check;
use crate::lf;
use crate::report::{Check, Status};
use crate::sys::{self, Facts};

pub(crate) fn gpus(f: &Facts) -> Check {
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

pub(crate) fn gpu_memory(f: &Facts, lf: Option<&lf::Libfabric>) -> Vec<Check> {
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
