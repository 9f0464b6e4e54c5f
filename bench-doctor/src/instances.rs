//! The per-instance line-rate table (`bench-doctor/data/instances.toml`, compiled in): what
//! `--expect NAME` gates against and what `rdma-bench doctor` counts NICs against.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The table as shipped.
const TABLE: &str = include_str!("../data/instances.toml");

/// One instance type or NIC profile.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// What `--expect` takes: `p5`, `p5en`, `p6-b200`, `cx7-400`...
    pub name: String,
    /// DMI product names of this type (empty for a NIC profile).
    pub products: Vec<String>,
    pub description: String,
    /// GPUs per node; 0 where not fixed.
    pub gpus: u32,
    /// `efa` or `mlx5`.
    pub nic_driver: String,
    /// RDMA devices per node; 0: one per GPU.
    pub nics: u32,
    /// Line rate of one device, Gbit/s.
    pub nic_gbps: f64,
    /// Default pass threshold, percent of line rate.
    pub min_pct: f64,
}

impl Instance {
    /// NICs per GPU as the table says (fractional where GPUs share one: p4d 0.5).
    pub fn nics_per_gpu(&self) -> f64 {
        if self.nics == 0 || self.gpus == 0 {
            1.0
        } else {
            f64::from(self.nics) / f64::from(self.gpus)
        }
    }
    /// Line rate of the whole node, where the NIC count is fixed.
    pub fn node_gbps(&self) -> Option<f64> {
        (self.nics > 0).then(|| f64::from(self.nics) * self.nic_gbps)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    instance: Vec<Instance>,
}

/// Parse a table in the shipped format, checking every entry.
pub fn parse(text: &str) -> Result<Vec<Instance>> {
    let f: File =
        toml::from_str(text).map_err(|e| Error::Unavailable(format!("instance table: {e}")))?;
    for i in &f.instance {
        let bad = |what: &str| {
            Err(Error::Unavailable(format!(
                "instance table: entry {}: {what}",
                i.name
            )))
        };
        if i.name.is_empty() {
            return bad("empty name");
        }
        if !(i.nic_gbps.is_finite() && i.nic_gbps > 0.0) {
            return bad("nic_gbps must be more than 0");
        }
        if !(i.min_pct > 0.0 && i.min_pct <= 100.0) {
            return bad("min_pct must be in (0, 100]");
        }
        if i.nic_driver != "efa" && i.nic_driver != "mlx5" {
            return bad("nic_driver must be efa or mlx5");
        }
    }
    Ok(f.instance)
}

/// The shipped table (parsed once; a test checks that it parses).
pub fn all() -> &'static [Instance] {
    static ALL: OnceLock<Vec<Instance>> = OnceLock::new();
    ALL.get_or_init(|| parse(TABLE).unwrap_or_default())
}

/// The entry `--expect NAME` names, or a usage error listing the known names.
pub fn by_name(name: &str) -> Result<&'static Instance> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_suffix(".48xlarge").unwrap_or(&n);
    let n = n.strip_suffix(".24xlarge").unwrap_or(n);
    all()
        .iter()
        .find(|i| i.name == n || i.products.iter().any(|p| p == name))
        .ok_or_else(|| {
            Error::Usage(format!(
                "--expect {name}: unknown instance type; known: {}",
                names().join(", ")
            ))
        })
}

/// The entry whose DMI product name is `product` (`p5.48xlarge`).
pub fn by_product(product: &str) -> Option<&'static Instance> {
    let p = product.trim();
    all()
        .iter()
        .find(|i| i.products.iter().any(|x| x.eq_ignore_ascii_case(p)))
}

/// This machine's instance type, from its DMI product name
/// (`/sys/class/dmi/id/product_name`, read under `$RDMA_BENCH_SYSFS_ROOT` where that is set,
/// as tests do); `None` off EC2 or for a type not in the table.
pub fn local() -> Option<&'static Instance> {
    let root = std::env::var_os("RDMA_BENCH_SYSFS_ROOT").unwrap_or_default();
    let path = std::path::Path::new(&root).join("sys/class/dmi/id/product_name");
    let path = if root.is_empty() {
        std::path::PathBuf::from("/sys/class/dmi/id/product_name")
    } else {
        path
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|p| by_product(&p))
}

/// Endpoints per GPU when `--nics-per-gpu` is not given: on a known instance type whose NICs
/// the run uses (`nic_driver`, the driver of the NICs the run goes over: `efa` for libfabric's
/// efa provider, `mlx5` for ConnectX through verbs, `None` for shm, tcp or Soft-RoCE), that
/// type's NICs per GPU, rounded up (p5: 4, p5en: 2, p6-b200: 1; p4d's GPUs share one NIC per
/// two: 1); otherwise 1. A p5 run that opened one endpoint per GPU used 8 of its 32 EFAs.
pub fn default_nics_per_gpu(instance: Option<&Instance>, nic_driver: Option<&str>) -> usize {
    let Some(i) = instance else {
        return 1;
    };
    if nic_driver == Some(i.nic_driver.as_str()) {
        (i.nics_per_gpu().ceil() as usize).max(1)
    } else {
        1
    }
}

/// Every name `--expect` takes.
pub fn names() -> Vec<&'static str> {
    all().iter().map(|i| i.name.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_table_parses_with_the_issue_figures() {
        let all = parse(TABLE).expect("the shipped table parses");
        let get = |n: &str| all.iter().find(|i| i.name == n).expect(n);
        let p5 = get("p5");
        assert_eq!((p5.nics, p5.nic_gbps, p5.gpus), (32, 100.0, 8));
        assert_eq!(p5.nics_per_gpu(), 4.0);
        assert_eq!(p5.node_gbps(), Some(3200.0));
        let en = get("p5en");
        assert_eq!((en.nics, en.nic_gbps, en.nics_per_gpu()), (16, 200.0, 2.0));
        let b = get("p6-b200");
        assert_eq!((b.nics, b.nic_gbps, b.nics_per_gpu()), (8, 400.0, 1.0));
        let p4 = get("p4d");
        assert_eq!((p4.nics, p4.nic_gbps, p4.nics_per_gpu()), (4, 100.0, 0.5));
        let cx = get("cx7-400");
        assert_eq!((cx.nic_driver.as_str(), cx.nic_gbps), ("mlx5", 400.0));
        assert_eq!(cx.node_gbps(), None);
        assert_eq!(super::all().len(), all.len());
    }

    #[test]
    fn lookups() {
        assert_eq!(by_name("p5").unwrap().name, "p5");
        assert_eq!(by_name("P5EN").unwrap().name, "p5en");
        assert_eq!(by_name("p5.48xlarge").unwrap().name, "p5");
        assert_eq!(by_name("p4de.24xlarge").unwrap().name, "p4d");
        let e = by_name("p9").unwrap_err().to_string();
        assert!(e.contains("known: p5"), "{e}");
        assert_eq!(by_product("p6-b200.48xlarge").unwrap().name, "p6-b200");
        assert!(by_product("m5.large").is_none());
    }

    /// On a known instance type the default endpoints per GPU are its NICs per GPU, where
    /// the run goes over those NICs; everywhere else 1 (the old default everywhere).
    /// (`bench_core::config::Backend::nic_driver` says which driver a backend and provider
    /// use: efa for the efa provider or none named, mlx5 for verbs, none for shm or tcp.)
    #[test]
    fn default_nics_per_gpu_follows_the_instance() {
        let n = |name: &str, d| default_nics_per_gpu(Some(by_name(name).unwrap()), d);
        assert_eq!(n("p5", Some("efa")), 4);
        assert_eq!(n("p5en", Some("efa")), 2);
        assert_eq!(n("p6-b200", Some("efa")), 1);
        assert_eq!(n("p4d", Some("efa")), 1);
        assert_eq!(n("p5", None), 1, "shm uses no NIC");
        assert_eq!(n("p5", Some("mlx5")), 1, "no ConnectX on a p5");
        assert_eq!(n("cx7-400", Some("mlx5")), 1);
        assert_eq!(default_nics_per_gpu(None, Some("efa")), 1);
    }

    #[test]
    fn bad_tables_are_refused() {
        let t = "[[instance]]\nname='x'\nproducts=[]\ndescription=''\ngpus=0\nnic_driver='efa'\nnics=0\nnic_gbps=0.0\nmin_pct=90.0\n";
        assert!(parse(t).unwrap_err().to_string().contains("nic_gbps"));
        assert!(parse("[[instance]]\nname='x'\nbogus=1\n").is_err());
    }
}
