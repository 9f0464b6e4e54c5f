//! Grouping checks on the hand-written hwloc XML fixtures (tests/fixtures/).

use serde_json::json;
use std::collections::BTreeSet;
use std::path::PathBuf;
use topo::{GpuGroup, Topology};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load(name: &str) -> Topology {
    match topo::from_xml(fixture(name)) {
        Ok(t) => t,
        Err(e) => panic!("fixture {name} failed to load: {e}"),
    }
}

fn nic_names(g: &GpuGroup) -> Vec<String> {
    g.nics.iter().map(|n| n.name.clone()).collect()
}

/// Every NIC is either assigned to some GPU or unassigned, never both.
fn check_partition(t: &Topology) {
    let assigned: BTreeSet<&str> = t
        .gpus()
        .iter()
        .flat_map(|g| g.nics.iter().map(|n| n.name.as_str()))
        .collect();
    for n in t.unassigned_nics() {
        assert!(
            !assigned.contains(n.name.as_str()),
            "{} both assigned and unassigned",
            n.name
        );
    }
    let in_numa: usize = t.numa_groups().iter().map(|g| g.nics.len()).sum();
    assert_eq!(
        in_numa,
        t.all_nics().len(),
        "numa_groups list every NIC once"
    );
    // Cores of different GPUs never overlap.
    let mut seen = BTreeSet::new();
    for g in t.gpus() {
        for c in &g.cores {
            assert!(seen.insert(*c), "core {c} given to two GPUs");
        }
    }
}

#[test]
fn p5_eight_gpus_with_their_own_four_efa_and_no_ena() {
    let t = load("p5.48xlarge.xml");
    check_partition(&t);
    assert_eq!(t.gpus().len(), 8);
    let buses = ["53", "64", "75", "86", "97", "a8", "b9", "ca"];
    let mut all = BTreeSet::new();
    for (i, g) in t.gpus().iter().enumerate() {
        assert_eq!(g.index, i);
        assert_eq!(g.pci, format!("0000:{}:00.0", buses[i]));
        assert_eq!(g.numa, Some(if i < 4 { 0 } else { 1 }));
        assert_eq!(g.nics.len(), 4, "GPU {i}: {:?}", nic_names(g));
        for n in &g.nics {
            assert!(n.name.starts_with("rdmap"), "not an EFA: {}", n.name);
            assert!(all.insert(n.name.clone()), "{} given twice", n.name);
        }
        // One PU per core (the SMT siblings 16.. are not listed), 2 per GPU.
        assert_eq!(g.cores, vec![2 * i, 2 * i + 1]);
    }
    assert!(t.unassigned_nics().is_empty());
    let v = serde_json::to_value(&t).expect("serializes");
    assert_eq!(
        v["gpus"][0],
        json!({"index":0,"pci":"0000:53:00.0","numa":0,
            "nics":[{"name":"rdmap79s0","pci":"0000:4f:00.0"},
                    {"name":"rdmap80s0","pci":"0000:50:00.0"},
                    {"name":"rdmap81s0","pci":"0000:51:00.0"},
                    {"name":"rdmap82s0","pci":"0000:52:00.0"}],
            "cores":[0,1]})
    );
    assert_eq!(v["unassigned_nics"], json!([]));
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
}

#[test]
fn p5en_two_gpus_split_four_efa_two_each() {
    let t = load("p5en.48xlarge.xml");
    check_partition(&t);
    assert_eq!(t.gpus().len(), 8);
    let g0 = &t.gpus()[0];
    let g1 = &t.gpus()[1];
    assert_eq!(g0.pci, "0000:59:00.0");
    assert_eq!(g1.pci, "0000:5a:00.0");
    assert_eq!(nic_names(g0), ["rdmap85s0", "rdmap86s0"]);
    assert_eq!(nic_names(g1), ["rdmap87s0", "rdmap88s0"]);
    let mut all = BTreeSet::new();
    for g in t.gpus() {
        assert_eq!(g.nics.len(), 2);
        for n in &g.nics {
            assert!(all.insert(n.name.clone()));
        }
    }
    assert_eq!(all.len(), 16);
    assert!(t.unassigned_nics().is_empty());
}

#[test]
fn dgx_one_connectx_per_gpu_storage_nics_unassigned() {
    let t = load("dgx-h100-like.xml");
    check_partition(&t);
    assert_eq!(t.gpus().len(), 8);
    let got: Vec<Vec<String>> = t.gpus().iter().map(nic_names).collect();
    // Grouping follows the PCI tree, not the names (mlx5_3 sits before mlx5_2).
    let want = [
        "mlx5_0", "mlx5_1", "mlx5_3", "mlx5_2", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
    ];
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g, &[w.to_string()]);
    }
    assert_eq!(t.gpus()[2].nics[0].pci.as_deref(), Some("0000:25:00.0"));
    let un: Vec<&str> = t
        .unassigned_nics()
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(un, ["mlx5_8", "mlx5_9"]);
    assert_eq!(t.gpus()[7].cores, vec![14, 15]);
}

#[test]
fn p4d_host_bridge_only_gpus_share_efa() {
    let t = load("p4d.24xlarge.xml");
    check_partition(&t);
    assert_eq!(t.gpus().len(), 8);
    let want = [
        "rdmap16s27",
        "rdmap16s27",
        "rdmap32s27",
        "rdmap32s27",
        "rdmap144s27",
        "rdmap144s27",
        "rdmap160s27",
        "rdmap160s27",
    ];
    for (g, w) in t.gpus().iter().zip(want) {
        assert_eq!(nic_names(g), [w], "GPU {}", g.pci);
        assert_eq!(g.cores, vec![g.index]);
    }
    assert!(t.unassigned_nics().is_empty());
    // The Amazon VGA function (vendor 1d0f, class 0300) is not a GPU.
    assert!(t.gpus().iter().all(|g| g.pci != "0000:00:03.0"));
}

#[test]
fn cpu_only_box_groups_nics_by_numa() {
    let t = load("cpu-only.xml");
    check_partition(&t);
    assert!(t.gpus().is_empty());
    let v = serde_json::to_value(&t).expect("serializes");
    assert_eq!(v["gpus"], json!([]));
    assert_eq!(
        v["numa_groups"],
        json!([
            {"numa":0,"nics":[{"name":"mlx5_0","pci":"0000:01:00.0"}],"cores":[0,1]},
            {"numa":1,"nics":[{"name":"mlx5_1","pci":"0000:81:00.0"},
                              {"name":"mlx5_2","pci":"0000:81:00.1"}],"cores":[2,3]},
            {"numa":null,"nics":[{"name":"rxe0","pci":null}],"cores":[0,1,2,3]}
        ])
    );
    // Without GPUs every NIC is unassigned; the plain Ethernet port is no NIC.
    let un: Vec<&str> = t
        .unassigned_nics()
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(un, ["mlx5_0", "mlx5_1", "mlx5_2", "rxe0"]);
    let table = t.render_table();
    assert!(table.contains("No GPUs found."), "{table}");
    assert!(table.contains("1     mlx5_1,mlx5_2  2-3"), "{table}");
}

#[test]
fn gpu_without_nic_has_empty_list() {
    let t = load("gpu-no-nic.xml");
    check_partition(&t);
    assert_eq!(t.gpus().len(), 2);
    assert_eq!(nic_names(&t.gpus()[0]), ["mlx5_0"]);
    let lonely = &t.gpus()[1];
    assert_eq!(lonely.pci, "0000:93:00.0");
    assert_eq!(lonely.numa, Some(1));
    assert!(lonely.nics.is_empty());
    assert_eq!(lonely.cores, vec![4, 5, 6, 7]);
    let v = serde_json::to_value(&t).expect("serializes");
    assert_eq!(v["gpus"][1]["nics"], json!([]));
    assert!(t
        .render_table()
        .contains("1    0000:93:00.0  1     -       4-7"));
}

#[test]
fn hwloc_1x_export_loads_and_groups() {
    let t = load("legacy-hwloc1.xml");
    check_partition(&t);
    type Row = (String, Option<u32>, Vec<String>, Vec<usize>);
    let got: Vec<Row> = t
        .gpus()
        .iter()
        .map(|g| (g.pci.clone(), g.numa, nic_names(g), g.cores.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            // Two P100 behind one PLX switch share its single ConnectX-5.
            (
                "0000:04:00.0".into(),
                Some(0),
                vec!["mlx5_0".into()],
                vec![0, 1]
            ),
            (
                "0000:07:00.0".into(),
                Some(0),
                vec!["mlx5_0".into()],
                vec![2, 3]
            ),
            // AMD MI50 (class 0380): no shared bridge, NUMA fallback.
            (
                "0000:81:00.0".into(),
                Some(1),
                vec!["mlx5_1".into()],
                vec![4, 5, 6, 7]
            ),
        ]
    );
}

#[test]
fn trimmed_cpu_hierarchy_uses_cpusets() {
    let t = load("trimmed-no-pu.xml");
    assert_eq!(t.gpus().len(), 1);
    assert_eq!(nic_names(&t.gpus()[0]), ["rdmap70s0"]);
    assert_eq!(t.gpus()[0].cores, (0..8).collect::<Vec<_>>());
    assert_eq!(t.warnings().len(), 1, "{:?}", t.warnings());
}

#[test]
fn same_input_same_output() {
    for name in [
        "p5en.48xlarge.xml",
        "dgx-h100-like.xml",
        "legacy-hwloc1.xml",
    ] {
        assert_eq!(load(name), load(name));
    }
}

#[test]
fn from_xml_str_matches_from_xml() {
    let text = std::fs::read_to_string(fixture("p4d.24xlarge.xml")).expect("fixture readable");
    let t = topo::from_xml_str(&text).expect("loads from memory");
    assert_eq!(t, load("p4d.24xlarge.xml"));
}

/// A NUMA node or PU whose os_index no hwloc bitmap holds is refused with words that name it
/// (before, a debug build's hwloc check aborted the process, and a release build panicked in
/// the bitmap query).
#[test]
fn an_index_past_hwlocs_bitmaps_is_refused() {
    let text = std::fs::read_to_string(fixture("cpu-only.xml")).expect("fixture readable");
    for (from, to) in [
        (
            r#"<object type="NUMANode" os_index="1""#,
            r#"<object type="NUMANode" os_index="3000000000""#,
        ),
        (
            r#"<object type="PU" os_index="4""#,
            r#"<object type="PU" os_index="2147483648""#,
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let e = topo::from_xml_str(&text.replacen(from, to, 1))
            .expect_err("an index past the bitmaps")
            .to_string();
        assert!(e.contains("os_index") && e.contains("2147483647"), "{e}");
    }
}
