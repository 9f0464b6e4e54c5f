//! Sanity checks on real hwloc dumps, when the shared collection is present
//! (`../shared/topologies/hwloc` beside the workspace root). Skipped, with a
//! note, when it is absent: the dumps are not part of this repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use topo::Topology;

fn dumps_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/topologies/hwloc");
    dir.is_dir().then_some(dir)
}

/// Number of NVIDIA/AMD display-class PCI functions, read straight from the
/// XML text (`pci_type="0302 [10de:2330] ..."`), independently of hwloc.
fn count_gpus_in_text(xml: &str) -> usize {
    let mut count = 0;
    for (pos, _) in xml.match_indices("pci_type=\"") {
        let rest = &xml[pos + "pci_type=\"".len()..];
        let (Some(class), Some(vendor)) = (rest.get(0..4), rest.get(6..10)) else {
            continue;
        };
        if matches!(class, "0300" | "0302" | "0380") && matches!(vendor, "10de" | "1002") {
            count += 1;
        }
    }
    count
}

/// `version="3.0"` or later on the `<topology>` element.
fn is_hwloc3(xml: &str) -> bool {
    xml.find("<topology").is_some_and(|i| {
        let tag = &xml[i..];
        let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
        tag.contains("version=\"3.") || tag.contains("version='3.")
    })
}

fn load_all() -> Option<BTreeMap<String, Topology>> {
    let Some(dir) = dumps_dir() else {
        println!("note: ../shared/topologies/hwloc not found; real-dump checks skipped");
        return None;
    };
    let mut out = BTreeMap::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("readable dump dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "xml"))
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text =
            String::from_utf8_lossy(&std::fs::read(&path).expect("readable dump")).into_owned();
        match topo::from_xml(&path) {
            Ok(t) => {
                let expected = count_gpus_in_text(&text);
                assert_eq!(t.gpus().len(), expected, "{name}: GPU count");
                sanity(&name, &t);
                println!(
                    "{name}: {} GPUs, {} RDMA NICs",
                    t.gpus().len(),
                    t.all_nics().len()
                );
                out.insert(name, t);
            }
            Err(e) if is_hwloc3(&text) => {
                // hwloc 2.9 cannot read the 3.x format; the error must say so.
                assert!(e.to_string().contains("version 3"), "{name}: {e}");
                println!("{name}: skipped (hwloc 3.x format): {e}");
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    Some(out)
}

fn sanity(name: &str, t: &Topology) {
    let mut indices = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut pcis = BTreeSet::new();
    for g in t.gpus() {
        assert!(indices.insert(g.index), "{name}: index {} twice", g.index);
        assert!(pcis.insert(g.pci.clone()), "{name}: GPU {} twice", g.pci);
        assert_eq!(g.pci.len(), 12, "{name}: bus id form {}", g.pci);
        assert_eq!(g.pci, g.pci.to_lowercase());
        for c in &g.cores {
            assert!(cores.insert(*c), "{name}: core {c} given twice");
        }
    }
    assert_eq!(indices.len(), t.gpus().len());
    if let Some(max) = indices.last() {
        assert_eq!(*max + 1, t.gpus().len(), "{name}: indices are 0..n");
    }
    let assigned: BTreeSet<&str> = t
        .gpus()
        .iter()
        .flat_map(|g| g.nics.iter().map(|n| n.name.as_str()))
        .collect();
    for n in t.unassigned_nics() {
        assert!(!assigned.contains(n.name.as_str()), "{name}: {}", n.name);
    }
    // Serializes and renders.
    assert!(serde_json::to_string(t).is_ok());
    assert!(!t.render_table().is_empty());
}

fn find<'a>(all: &'a BTreeMap<String, Topology>, prefix: &str) -> Option<&'a Topology> {
    let hit = all
        .iter()
        .find(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v);
    if hit.is_none() {
        println!("note: no dump named {prefix}*; its check is skipped");
    }
    hit
}

fn efa_names(t: &Topology, gpu: usize) -> Vec<String> {
    t.gpus()[gpu]
        .nics
        .iter()
        .filter(|n| n.name.starts_with("rdmap"))
        .map(|n| n.name.clone())
        .collect()
}

#[test]
fn real_dumps() {
    let Some(all) = load_all() else {
        return;
    };

    if let Some(t) = find(&all, "aws-p5.48xlarge") {
        assert_eq!(t.gpus().len(), 8);
        let mut seen = BTreeSet::new();
        for (i, g) in t.gpus().iter().enumerate() {
            assert_eq!(g.nics.len(), 4, "p5 GPU {i}");
            assert_eq!(efa_names(t, i).len(), 4, "p5 GPU {i}: only EFA");
            for n in &g.nics {
                assert!(seen.insert(n.name.clone()), "p5: {} shared", n.name);
            }
        }
        assert_eq!(
            efa_names(t, 0),
            ["rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"]
        );
        assert_eq!(t.gpus()[0].pci, "0000:53:00.0");
        assert!(t.unassigned_nics().is_empty());
    }

    if let Some(t) = find(&all, "aws-p5en.48xlarge") {
        assert_eq!(t.gpus().len(), 8);
        let mut seen = BTreeSet::new();
        for (i, g) in t.gpus().iter().enumerate() {
            assert_eq!(g.nics.len(), 2, "p5en GPU {i}");
            assert_eq!(efa_names(t, i).len(), 2);
            for n in &g.nics {
                assert!(seen.insert(n.name.clone()), "p5en: {} shared", n.name);
            }
        }
        assert_eq!(efa_names(t, 0), ["rdmap85s0", "rdmap86s0"]);
        assert_eq!(efa_names(t, 1), ["rdmap87s0", "rdmap88s0"]);
    }

    if let Some(t) = find(&all, "aws-p4d.24xlarge") {
        assert_eq!(t.gpus().len(), 8);
        let mut users: BTreeMap<String, usize> = BTreeMap::new();
        for (i, g) in t.gpus().iter().enumerate() {
            assert_eq!(g.nics.len(), 1, "p4d GPU {i}");
            *users.entry(g.nics[0].name.clone()).or_default() += 1;
        }
        assert_eq!(users.len(), 4, "p4d: 4 EFA in use: {users:?}");
        assert!(
            users.values().all(|&n| n == 2),
            "p4d: 2 GPUs per EFA: {users:?}"
        );
    }

    if let Some(t) = find(&all, "aws-p6-b200.48xlarge") {
        assert_eq!(t.gpus().len(), 8);
        let mut seen = BTreeSet::new();
        for i in 0..8 {
            let efa = efa_names(t, i);
            assert_eq!(efa.len(), 1, "p6-b200 GPU {i}: {efa:?}");
            assert!(seen.insert(efa[0].clone()));
        }
        // The two ConnectX-7 on the third switch go one to each of its GPUs.
        let ib: Vec<usize> = (0..8)
            .map(|i| t.gpus()[i].nics.len() - efa_names(t, i).len())
            .collect();
        assert_eq!(ib, [0, 0, 0, 0, 1, 1, 0, 0]);
    }

    if let Some(t) = find(&all, "dell-xe8640") {
        // cuda2 (cb:00.0) has no NIC on its switch or NUMA node.
        let g = t
            .gpus()
            .iter()
            .find(|g| g.pci == "0000:cb:00.0")
            .expect("GPU cb");
        assert!(g.nics.is_empty());
    }
}
