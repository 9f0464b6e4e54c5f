//! Live discovery on whatever machine runs the tests (CI has no GPU and no
//! RDMA device; it must still work).

#[test]
fn discover_works_here() {
    let t = match topo::discover() {
        Ok(t) => t,
        Err(e) => panic!("live discovery failed: {e}"),
    };
    println!("{}", t.render_table());
    assert!(
        !t.numa_groups().is_empty(),
        "every machine has at least one NUMA node with cores"
    );
    assert!(t.numa_groups().iter().any(|g| !g.cores.is_empty()));
    for (i, g) in t.gpus().iter().enumerate() {
        assert!(i == 0 || t.gpus()[i - 1].index < g.index, "sorted by index");
    }
    let json = t.to_json_pretty();
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert!(v["gpus"].is_array() && v["unassigned_nics"].is_array());
}
