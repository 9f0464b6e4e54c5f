//! The checks, by area: [`rdma`] (devices, links, counts, memlock, libfabric), [`gpu`]
//! (GPUs and the GPU memory paths), [`pcie`] (link width and speed, IOMMU, ACS) and
//! [`numa`](mod@numa) (the NIC nearest each GPU); here the instance check and the helpers
//! they share. The `FI_*` / `NCCL_*` rules are [`crate::env`].

mod gpu;
mod numa;
mod pcie;
mod rdma;

pub use pcie::acs_ctrl;
pub(crate) use {
    gpu::{gpu_memory, gpus},
    numa::numa,
    pcie::{acs, iommu, pcie_links},
    rdma::{libfabric, memlock, rdma_count, rdma_devices, rdma_links},
};

use crate::report::{Check, Status};
use crate::sys::Facts;

fn check(id: &str, status: Status, summary: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        id: id.into(),
        status,
        summary: summary.into(),
        fix: fix.map(str::to_string),
    }
}

pub(crate) fn instance(f: &Facts) -> Check {
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

fn short_list(v: &[String]) -> String {
    if v.len() <= 4 {
        v.join("; ")
    } else {
        format!("{}; and {} more", v[..4].join("; "), v.len() - 4)
    }
}
