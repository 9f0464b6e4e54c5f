//! How rdma-bench's NIC groups reach libfabric's efa domains, on real node topologies.
//!
//! topo names an EFA NIC by its ibverbs device (`rdmap79s0`) and PCI function; the efa
//! provider offers that NIC as the domain `rdmap79s0-rdm` on two fabrics, `efa` and
//! `efa-direct`, with the PCI function in `fi_info->nic->bus_attr` (`efa_prov_info.c`: the
//! domain name is the device name plus `-rdm`, the PCI address comes from the device's sysfs
//! path). Here each node's offer is built that way from its topology, every GPU's endpoints
//! are described as rdma-bench describes them (`SideCfg::desc`, NIC groups round-robin,
//! `--nics-per-gpu` from the instance table), and each must match exactly the domains of its
//! own NIC. Before the PCI match, rdma-bench handed the efa backend the bare ibverbs name,
//! which no efa domain carries: a p5 run stopped at the first endpoint.
//!
//! Reads the committed fixtures and, when present, the real dumps in
//! `../shared/topologies/hwloc` (p5, p5en, p6-b200); skips those when absent.

#![cfg(feature = "efa")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bench_core::config::MemKind;
use bench_core::side::SideCfg;
use bench_core::topo_glue::from_topology;
use bench_doctor::instances;
use transport_core::Transport;
use transport_efa::{match_nic, DomainInfo, Endpoint, Pci};

/// What libfabric's efa provider (2.x) offers on a node with these NICs.
fn efa_offer(t: &topo::Topology) -> Vec<DomainInfo> {
    let mut out = Vec::new();
    for fabric in ["efa-direct", "efa"] {
        for nic in t.all_nics() {
            out.push(DomainInfo {
                provider: "efa".into(),
                fabric: fabric.into(),
                domain: format!("{}-rdm", nic.name),
                nic_name: nic.name.clone(),
                pci: nic
                    .pci
                    .as_deref()
                    .map(|p| p.parse::<Pci>().expect("topo's PCI address")),
            });
        }
    }
    out
}

fn check_node(path: &Path, instance: &str) {
    let t = topo::from_xml(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inst = instances::by_name(instance).expect("instance");
    let npg = instances::default_nics_per_gpu(Some(inst), (Endpoint::INFO.nic_driver)(None));
    let offer = efa_offer(&t);
    assert!(
        offer
            .iter()
            .all(|d| t.all_nics().iter().all(|n| d.domain != n.name)),
        "no efa domain carries a bare ibverbs name"
    );
    let gpus: Vec<usize> = t.gpus().iter().map(|g| g.index).collect();
    let cfg = SideCfg {
        provider: None,
        devices: Vec::new(),
        options: Vec::new(),
        real_nics: true,
        gpus: gpus.clone(),
        nics_per_gpu: npg,
        mem: MemKind::Host,
        verbose: 0,
        idle: Duration::from_secs(10),
        hints: Some(from_topology(&t)),
        facts: Default::default(),
    };
    let mut used = Vec::new();
    for (g, &ordinal) in gpus.iter().enumerate() {
        let group = &t.gpu(ordinal).expect("gpu").nics;
        let mut mine = Vec::new();
        for j in 0..npg {
            let d = cfg.desc(g, j);
            let pci = d
                .pci
                .clone()
                .expect("a topo NIC comes with its PCI address");
            let hits = match_nic(&offer, &d)
                .unwrap_or_else(|e| panic!("{}: GPU {ordinal} NIC {j}: {e}", path.display()));
            assert_eq!(hits.len(), 2, "one domain per fabric: {hits:?}");
            for &h in &hits {
                assert_eq!(offer[h].pci.map(|p| p.to_string()), Some(pci.clone()));
                assert_eq!(Some(&offer[h].nic_name), d.device.as_ref());
                assert!(group.iter().any(|n| n.name == offer[h].nic_name));
            }
            mine.push(offer[hits[0]].domain.clone());
        }
        mine.sort();
        mine.dedup();
        assert_eq!(
            mine.len(),
            npg.min(group.len()),
            "{}: GPU {ordinal}'s endpoints on distinct NICs of its own group",
            path.display()
        );
        used.extend(mine);
    }
    used.sort();
    used.dedup();
    eprintln!(
        "{}: {} GPUs x {npg} NICs -> {} distinct efa domains",
        path.display(),
        gpus.len(),
        used.len()
    );
    if inst.nics > 0 && inst.gpus as usize == gpus.len() {
        assert_eq!(used.len(), (inst.nics as usize).min(gpus.len() * npg));
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topo/tests/fixtures")
        .join(name)
}

#[test]
fn every_endpoint_of_a_p5_fixture_finds_its_own_efa_domain() {
    check_node(&fixture("p5.48xlarge.xml"), "p5");
    check_node(&fixture("p5en.48xlarge.xml"), "p5en");
}

#[test]
fn every_endpoint_of_the_real_aws_dumps_finds_its_own_efa_domain() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/topologies/hwloc");
    let mut ran = 0;
    for (file, instance) in [
        ("aws-p5.48xlarge.8xH100-32xEFA.nixl.hwloc2.xml", "p5"),
        ("aws-p5en.48xlarge.8xH200-16xEFA.nixl.hwloc2.xml", "p5en"),
        (
            "aws-p6-b200.48xlarge.8xB200-8xEFA.nixl.hwloc2.xml",
            "p6-b200",
        ),
    ] {
        let p = dir.join(file);
        if p.exists() {
            check_node(&p, instance);
            ran += 1;
        } else {
            eprintln!("SKIPPED: {} not present", p.display());
        }
    }
    eprintln!("{ran} real topologies checked");
}
