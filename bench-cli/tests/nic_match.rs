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
        hints: Some(from_topology(&t)),
        ..SideCfg::default()
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
            // The same NIC under a name no domain carries (a renamed device): only its PCI
            // address can find it. With its own name the name fallback (`rdmap79s0` is
            // `rdmap79s0-rdm`) would find the domains even if the PCI match were broken.
            let renamed = transport_core::NicDesc {
                device: Some(format!("renamed-{}", d.device.as_deref().unwrap_or("?"))),
                ..d.clone()
            };
            let by_pci = match_nic(&offer, &renamed).unwrap_or_else(|e| {
                panic!(
                    "{}: GPU {ordinal} NIC {j} by PCI {pci}: {e}",
                    path.display()
                )
            });
            assert_eq!(by_pci, hits, "by PCI address alone");
            assert!(
                match_nic(
                    &offer,
                    &transport_core::NicDesc {
                        pci: None,
                        ..renamed.clone()
                    }
                )
                .is_err(),
                "the wrong name alone matches: it would not test the PCI match"
            );
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

/// Where `../shared/topologies/hwloc` exists, every dump named here must be in it: a renamed
/// or missing dump fails instead of leaving the test to pass having checked none.
#[test]
fn every_endpoint_of_the_real_aws_dumps_finds_its_own_efa_domain() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/topologies/hwloc");
    if !dir.is_dir() {
        transport_core::skip::note(
            "no ../shared/topologies",
            &format!("{} not present", dir.display()),
        );
        return;
    }
    let mut ran = 0;
    let mut missing = Vec::new();
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
            missing.push(file);
        }
    }
    eprintln!("{ran} real topologies checked");
    assert!(
        missing.is_empty() && ran == 3,
        "{} has no {missing:?}: {ran} of 3 real topologies checked",
        dir.display()
    );
}
