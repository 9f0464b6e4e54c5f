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

/// Live discovery leaves out hwloc's GPU and display components (`topo::SKIPPED_COMPONENTS`):
/// a child process discovers with `HWLOC_COMPONENTS_VERBOSE=1`, and hwloc's own report on its
/// stderr must show every one of them that hwloc registered left out, and none enabled.
/// Where no plugin of theirs is installed there is nothing to leave out; `TOPO_EXPECT_SKIPPED`
/// (ci/topo-parsers.sh, after installing libhwloc-plugins: `opencl,gl`) names components that
/// must have been registered, so that run cannot pass without showing it.
#[test]
fn discovery_leaves_out_gpu_and_display_components() {
    const NAME: &str = "discovery_leaves_out_gpu_and_display_components";
    if std::env::var_os("TOPO_CHILD_DISCOVER").is_some() {
        topo::discover().expect("live discovery");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env("TOPO_CHILD_DISCOVER", "1")
        .env("HWLOC_COMPONENTS_VERBOSE", "1")
        .env_remove("HWLOC_COMPONENTS")
        .output()
        .expect("running the test binary again");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {err}");
    assert!(
        err.contains("Enabling discovery component `linux'"),
        "hwloc's verbose report is not on the child's stderr: {err}"
    );
    let expected = std::env::var("TOPO_EXPECT_SKIPPED").unwrap_or_default();
    for name in expected.split(',').filter(|s| !s.is_empty()) {
        assert!(
            topo::SKIPPED_COMPONENTS.contains(&name),
            "TOPO_EXPECT_SKIPPED names {name}, which discovery does not leave out"
        );
        assert!(
            err.contains(&format!("Registered discovery component `{name}'")),
            "TOPO_EXPECT_SKIPPED: hwloc did not register {name} (its plugin missing?): {err}"
        );
    }
    let mut left_out = Vec::new();
    for name in topo::SKIPPED_COMPONENTS {
        assert!(
            !err.contains(&format!("Enabling discovery component `{name}'")),
            "hwloc enabled {name}: {err}"
        );
        if err.contains(&format!("Registered discovery component `{name}'")) {
            assert!(
                err.contains(&format!("Blacklisting component `{name}`")),
                "hwloc registered {name} and did not report leaving it out: {err}"
            );
            left_out.push(*name);
        }
    }
    println!("left out, of those hwloc registered here: {left_out:?}");
}
