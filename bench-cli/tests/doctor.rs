//! `rdma-bench doctor` against fixture trees written by this file (a healthy p5, a p5 with a
//! missing EFA and a link at x8, a ConnectX host without peer memory, a CPU-only box) and
//! live on this machine.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use bench_doctor::lf::Libfabric;
use bench_doctor::{self as doctor, Inputs, Report, Status};

/// A fake machine root: sysfs and procfs files as the kernel shows them.
struct Fx {
    root: PathBuf,
}

impl Drop for Fx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Fx {
    fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "rdma-bench-doctor-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("fixture root");
        Fx { root }
    }
    fn p(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }
    fn file(&self, abs: &str, text: &str) -> &Self {
        let p = self.p(abs);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }
    fn link(&self, abs: &str, target: &str) {
        let p = self.p(abs);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(target, p).unwrap();
    }
    fn dir(&self, abs: &str) {
        std::fs::create_dir_all(self.p(abs)).unwrap();
    }
    fn rm(&self, abs: &str) {
        let p = self.p(abs);
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn pci(
        &self,
        addr: &str,
        vendor: &str,
        device: &str,
        class: &str,
        driver: &str,
        numa: i32,
        gts: f64,
        width: u32,
    ) {
        let b = format!("/sys/bus/pci/devices/{addr}");
        self.file(&format!("{b}/vendor"), vendor)
            .file(&format!("{b}/device"), device)
            .file(&format!("{b}/class"), class)
            .file(&format!("{b}/numa_node"), &numa.to_string())
            .file(
                &format!("{b}/current_link_speed"),
                &format!("{gts:.1} GT/s PCIe"),
            )
            .file(
                &format!("{b}/max_link_speed"),
                &format!("{gts:.1} GT/s PCIe"),
            )
            .file(&format!("{b}/current_link_width"), &width.to_string())
            .file(&format!("{b}/max_link_width"), &width.to_string());
        self.link(
            &format!("{b}/driver"),
            &format!("../../../bus/pci/drivers/{driver}"),
        );
    }
    fn ib(&self, name: &str, addr: &str, rate: &str) {
        let b = format!("/sys/class/infiniband/{name}");
        self.link(
            &format!("{b}/device"),
            &format!("../../../bus/pci/devices/{addr}"),
        );
        self.file(&format!("{b}/ports/1/state"), "4: ACTIVE")
            .file(&format!("{b}/ports/1/phys_state"), "5: LinkUp")
            .file(&format!("{b}/ports/1/rate"), rate);
    }
    fn common(&self, modules: &[&str], memlock: &str, nvidia: Option<&str>) {
        let m: String = modules
            .iter()
            .map(|m| format!("{m} 16384 0 - Live 0x0000000000000000\n"))
            .collect();
        self.file("/proc/modules", &m)
            .file(
                "/proc/self/limits",
                &format!("Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         {memlock:<20} {memlock:<20} bytes     \n"),
            )
            .file("/proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0-1015-aws root=LABEL=/ ro console=ttyS0")
            .file("/proc/sys/kernel/osrelease", "6.8.0-1015-aws");
        self.dir("/sys/kernel/iommu_groups");
        self.dir("/sys/class/infiniband");
        if let Some(v) = nvidia {
            self.file("/proc/driver/nvidia/version", v);
        }
    }
}

const OPEN_DRIVER: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri May 31 09:30:47 UTC 2024";
const PROPRIETARY_DRIVER: &str =
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023";

/// The EFA PCI address of NIC `j` of GPU `g` on the fake p5.
fn efa_addr(g: usize, j: usize) -> String {
    format!("0000:{:02x}:00.0", 0x10 + g * 0x10 + 1 + j)
}

/// A healthy p5.48xlarge: 8 H100 (x16 Gen5), 32 EFA (4 per GPU, on the GPU's NUMA node),
/// peer memory loaded, memlock unlimited, IOMMU off.
fn p5(name: &str) -> Fx {
    let fx = Fx::new(name);
    fx.file("/sys/class/dmi/id/product_name", "p5.48xlarge")
        .file("/sys/class/dmi/id/sys_vendor", "Amazon EC2");
    fx.common(
        &["efa", "nvidia", "efa_nv_peermem"],
        "unlimited",
        Some(OPEN_DRIVER),
    );
    for g in 0..8 {
        let numa = (g / 4) as i32;
        let gpu = format!("0000:{:02x}:00.0", 0x10 + g * 0x10);
        fx.pci(
            &gpu, "0x10de", "0x2330", "0x030200", "nvidia", numa, 32.0, 16,
        );
        for j in 0..4 {
            let a = efa_addr(g, j);
            fx.pci(&a, "0x1d0f", "0xefa1", "0x020000", "efa", numa, 32.0, 16);
            fx.ib(
                &format!("rdmap{}s0", 0x10 + g * 0x10 + 1 + j),
                &a,
                "100 Gb/sec (4X EDR)",
            );
        }
    }
    fx
}

fn efa_libfabric() -> Libfabric {
    Libfabric {
        version: "2.1".into(),
        providers: vec!["efa".into(), "shm".into(), "tcp".into()],
        hmem_provider: Some("efa".into()),
        hmem: true,
        library: Some("/opt/amazon/efa/lib/libfabric.so.1".into()),
        cuda: Some(true),
        findings: Vec::new(),
    }
}

fn run(fx: &Fx, env: &[(&str, &str)], lf: Option<Libfabric>) -> Report {
    run_on(fx, env, lf, None)
}

/// `run` with a topology (hwloc's, or one built for the test).
fn run_on(
    fx: &Fx,
    env: &[(&str, &str)],
    lf: Option<Libfabric>,
    topology: Option<topo::Topology>,
) -> Report {
    let r = doctor::run(&Inputs {
        root: fx.root.clone(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        topology,
        libfabric: lf,
        probes: vec![],
    });
    eprintln!("{}", doctor::render(&r));
    // Every check a fixture node shows is in the doctor's list (and so in README.md's table).
    for c in &r.checks {
        assert!(
            doctor::catalog::listed(&c.id),
            "check {} is not in bench-doctor's catalog::CHECKS",
            c.id
        );
    }
    r
}

fn expect(r: &Report, id: &str, want: Status) {
    assert_eq!(
        r.status(id),
        Some(want),
        "check {id}: {:?}\n{}",
        r.get(id),
        doctor::render(r)
    );
}

#[test]
fn healthy_p5_is_all_ok() {
    let fx = p5("p5");
    let r = run(
        &fx,
        &[("FI_PROVIDER", "efa"), ("NCCL_DEBUG", "INFO")],
        Some(efa_libfabric()),
    );
    assert_eq!(r.instance.as_deref(), Some("p5"));
    for id in [
        "instance",
        "gpus",
        "rdma.devices",
        "rdma.links",
        "rdma.count",
        "memlock",
        "libfabric",
        "gpu.peermem",
        "gpu.dmabuf",
        "libfabric.hmem",
        "gpu.path",
        "pcie.links",
        "iommu",
        "numa.nic",
        "env",
    ] {
        expect(&r, id, Status::Ok);
    }
    // No config space to read in the fixture, as for a non-root user.
    expect(&r, "pcie.acs", Status::Skip);
    assert!(r.get("rdma.count").unwrap().summary.contains("32 efa"));
    assert!(r.checks.iter().all(|c| c.status <= Status::Skip));
    assert_eq!(r.exit_code, 0);
}

/// A backend the doctor has no checks of its own for: its probe is listed as a check named
/// after its library, and the backend's own findings as checks of theirs (a warning makes the
/// exit status 1).
#[test]
fn another_backends_probe_is_listed_with_its_findings() {
    use transport_core::{Finding, FindingStatus, Probe};
    let fx = p5("p5-probe");
    let r = doctor::run(&Inputs {
        root: fx.root.clone(),
        env: vec![],
        topology: None,
        libfabric: Some(efa_libfabric()),
        probes: vec![Probe {
            library: "ucx".into(),
            version: "1.13.1".into(),
            path: Some("/usr/lib/x86_64-linux-gnu/libucp.so.0".into()),
            offers: vec!["rc_verbs".into(), "tcp".into()],
            gpu: None,
            cuda_in_library: None,
            findings: vec![Finding {
                id: "ucx.fallback".into(),
                status: FindingStatus::Warn,
                summary: "rdmap79s0 would fall back to tcp".into(),
                fix: Some("install UCX with verbs support".into()),
            }],
        }],
    });
    eprintln!("{}", doctor::render(&r));
    expect(&r, "ucx", Status::Ok);
    assert!(
        r.get("ucx")
            .unwrap()
            .summary
            .contains("ucx 1.13.1 (/usr/lib/x86_64-linux-gnu/libucp.so.0), offers: rc_verbs, tcp"),
        "{:?}",
        r.get("ucx")
    );
    expect(&r, "ucx.fallback", Status::Warn);
    assert_eq!(r.exit_code, 1);
    // The libfabric checks are unchanged beside it.
    expect(&r, "libfabric", Status::Ok);
}

#[test]
fn p5_with_a_missing_efa_and_a_link_at_x8_fails() {
    let fx = p5("p5-degraded");
    // rdmap35s0 (GPU 1's third EFA) is gone; GPU 3 trained at x8.
    fx.rm("/sys/class/infiniband/rdmap35s0");
    fx.file("/sys/bus/pci/devices/0000:40:00.0/current_link_width", "8");
    let r = run(&fx, &[("FI_PROVIDER", "tcp")], Some(efa_libfabric()));
    expect(&r, "rdma.count", Status::Fail);
    let c = r.get("rdma.count").unwrap();
    assert!(c.summary.contains("31 of 32 efa"), "{}", c.summary);
    assert!(c.fix.is_some());
    expect(&r, "pcie.width", Status::Fail);
    let w = r.get("pcie.width").unwrap();
    assert!(
        w.summary.contains("GPU 0000:40:00.0 x8 of x16"),
        "{}",
        w.summary
    );
    expect(&r, "env.fi-provider-not-efa", Status::Fail);
    // What is still fine stays ok.
    expect(&r, "rdma.links", Status::Ok);
    expect(&r, "gpu.path", Status::Ok);
    assert_eq!(r.exit_code, 2);
}

#[test]
fn p5_with_efa_rdma_off_and_no_efa_provider() {
    let fx = p5("p5-env");
    let lf = Libfabric {
        version: "1.17".into(),
        providers: vec!["shm".into(), "tcp".into()],
        hmem_provider: Some("shm".into()),
        hmem: true,
        library: Some("/usr/lib/x86_64-linux-gnu/libfabric.so.1".into()),
        cuda: Some(false),
        findings: Vec::new(),
    };
    let r = run(&fx, &[("FI_EFA_USE_DEVICE_RDMA", "0")], Some(lf));
    expect(&r, "libfabric", Status::Fail);
    expect(&r, "libfabric.hmem", Status::Fail);
    expect(&r, "env.efa-device-rdma-off", Status::Fail);
    let c = r.get("env.efa-device-rdma-off").unwrap();
    assert!(c.summary.contains("older than 1.18"), "{}", c.summary);
    assert_eq!(r.exit_code, 2);
}

/// The libfabric backend's own findings (its probe's) reach the report beside the doctor's
/// libfabric checks, and a failed one fails the node.
#[test]
fn the_libfabric_probes_findings_are_listed() {
    use transport_core::{Finding, FindingStatus};
    let fx = p5("p5-lf-finding");
    let lf = Libfabric {
        findings: vec![Finding {
            id: "libfabric.example".into(),
            status: FindingStatus::Fail,
            summary: "something the backend found".into(),
            fix: Some("do this".into()),
        }],
        ..efa_libfabric()
    };
    // Not through run(): a backend's finding ids are its own, not in the doctor's catalog.
    let r = doctor::run(&Inputs {
        root: fx.root.clone(),
        env: vec![],
        topology: None,
        libfabric: Some(lf),
        probes: vec![],
    });
    expect(&r, "libfabric", Status::Ok);
    expect(&r, "libfabric.example", Status::Fail);
    assert_eq!(r.exit_code, 2);
}

/// FI_EFA_USE_DEVICE_RDMA's default depends on the libfabric API version an application
/// asks for: from 1.18 it follows the device (on for p4d and p5), below it is off on the
/// 0xefa0/0xefa1 generations. Doctor used to say "unset it, it defaults to 1" whatever the
/// version, which on a 1.17 libfabric left a p5 with emulated WRITEs.
#[test]
fn device_rdma_advice_follows_the_libfabric_version() {
    let fx = p5("p5-api");
    let old = Libfabric {
        version: "1.17".into(),
        ..efa_libfabric()
    };
    // 1.17, nothing set: device RDMA is off by default on this generation.
    let r = run(&fx, &[], Some(old.clone()));
    expect(&r, "env.efa-device-rdma-old-api", Status::Warn);
    let c = r.get("env.efa-device-rdma-old-api").unwrap();
    assert!(
        c.summary.contains("libfabric 1.17 predates API 1.18"),
        "{}",
        c.summary
    );
    assert!(c
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("FI_EFA_USE_DEVICE_RDMA=1"));
    // 1.17 with FI_EFA_USE_DEVICE_RDMA=1: what the old version needs; no warning.
    let r = run(&fx, &[("FI_EFA_USE_DEVICE_RDMA", "1")], Some(old));
    assert_eq!(r.status("env.efa-device-rdma-old-api"), None);
    assert_eq!(r.status("env.efa-device-rdma-off"), None);
    // 2.1: the default is right, nothing to say; turning it off is a failure whose message
    // says the default would be on.
    let r = run(&fx, &[], Some(efa_libfabric()));
    assert_eq!(r.status("env.efa-device-rdma-old-api"), None);
    let r = run(
        &fx,
        &[("FI_EFA_USE_DEVICE_RDMA", "0")],
        Some(efa_libfabric()),
    );
    expect(&r, "env.efa-device-rdma-off", Status::Fail);
    let c = r.get("env.efa-device-rdma-off").unwrap();
    assert!(c.summary.contains("API 1.18 or later"), "{}", c.summary);
}

/// A ConnectX host (a Dell XE8640-like box): 4 H100, 4 ConnectX-7 at 400 Gb/s, the
/// proprietary NVIDIA module and no peer-memory module.
fn connectx(name: &str, driver: &str) -> Fx {
    let fx = Fx::new(name);
    fx.file("/sys/class/dmi/id/product_name", "PowerEdge XE8640")
        .file("/sys/class/dmi/id/sys_vendor", "Dell Inc.");
    fx.common(
        &["mlx5_core", "mlx5_ib", "nvidia"],
        "unlimited",
        Some(driver),
    );
    for g in 0..4usize {
        let numa = (g / 2) as i32;
        let gpu = format!("0000:{:02x}:00.0", 0x20 + g * 0x20);
        fx.pci(
            &gpu, "0x10de", "0x2330", "0x030200", "nvidia", numa, 32.0, 16,
        );
        let nic = format!("0000:{:02x}:00.0", 0x21 + g * 0x20);
        fx.pci(
            &nic,
            "0x15b3",
            "0x1021",
            "0x020700",
            "mlx5_core",
            numa,
            32.0,
            16,
        );
        fx.ib(&format!("mlx5_{g}"), &nic, "400 Gb/sec (4X NDR)");
    }
    fx
}

#[test]
fn connectx_without_peermem_fails_gpu_registration() {
    let fx = connectx("cx", PROPRIETARY_DRIVER);
    // A switch port with ACS P2P request/completion redirect on, config space readable.
    fx.pci(
        "0000:1f:00.0",
        "0x15b3",
        "0x1976",
        "0x060400",
        "pcieport",
        0,
        32.0,
        16,
    );
    let mut cfg = vec![0u8; 4096];
    cfg[0x100..0x104].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
    cfg[0x106..0x108].copy_from_slice(&0x001du16.to_le_bytes());
    std::fs::write(fx.p("/sys/bus/pci/devices/0000:1f:00.0/config"), cfg).unwrap();
    let r = run(&fx, &[("NCCL_IB_DISABLE", "1")], None);
    assert_eq!(r.instance, None);
    let inst = &r.get("instance").unwrap().summary;
    assert!(
        inst.contains("ConnectX host (4 mlx5") && inst.contains("cx7-400"),
        "{inst}"
    );
    expect(&r, "rdma.count", Status::Ok);
    expect(&r, "gpu.peermem", Status::Warn);
    expect(&r, "gpu.dmabuf", Status::Warn);
    expect(&r, "gpu.path", Status::Fail);
    assert!(r
        .get("gpu.path")
        .unwrap()
        .fix
        .as_deref()
        .unwrap()
        .contains("nvidia_peermem"));
    expect(&r, "libfabric", Status::Skip);
    expect(&r, "pcie.acs", Status::Warn);
    assert!(r.get("pcie.acs").unwrap().summary.contains("0000:1f:00.0"));
    expect(&r, "env.nccl-ib-disabled", Status::Fail);
    expect(&r, "numa.nic", Status::Ok);
    assert_eq!(r.exit_code, 2);
}

#[test]
fn connectx_with_open_modules_uses_dmabuf() {
    let fx = connectx("cx-open", OPEN_DRIVER);
    // GPUs 2 and 3 (NUMA 1) lose their NICs to NUMA 0.
    fx.file("/sys/bus/pci/devices/0000:61:00.0/numa_node", "0");
    fx.file("/sys/bus/pci/devices/0000:81:00.0/numa_node", "0");
    let r = run(&fx, &[], None);
    expect(&r, "gpu.peermem", Status::Warn);
    expect(&r, "gpu.dmabuf", Status::Ok);
    expect(&r, "gpu.path", Status::Ok);
    assert!(r.get("gpu.path").unwrap().summary.contains("dmabuf"));
    expect(&r, "numa.nic", Status::Warn);
    assert!(r
        .get("numa.nic")
        .unwrap()
        .summary
        .contains("0000:80:00.0 (NUMA 1)"));
    assert_eq!(r.exit_code, 1);
}

/// Sets sysfs's numa_node of connectx's four GPUs (FIRST 0x20) or four NICs (0x21) to NODE.
fn set_numa_nodes(fx: &Fx, first: usize, node: &str) {
    for g in 0..4usize {
        fx.file(
            &format!(
                "/sys/bus/pci/devices/0000:{:02x}:00.0/numa_node",
                first + g * 0x20
            ),
            node,
        );
    }
}

/// GPUs whose NUMA node sysfs does not know (-1, as with NUMA off in the BIOS): nothing is
/// compared, so the check skips and says why instead of vouching for the placement.
#[test]
fn gpus_of_unknown_numa_node_are_not_vouched_for() {
    let fx = connectx("cx-numa-unknown", OPEN_DRIVER);
    set_numa_nodes(&fx, 0x20, "-1");
    let r = run(&fx, &[], None);
    expect(&r, "numa.nic", Status::Skip);
    assert!(r.get("numa.nic").unwrap().summary.contains("unknown"));
    // One GPU of known node: the others are named as unknown beside the Ok.
    fx.file("/sys/bus/pci/devices/0000:20:00.0/numa_node", "0");
    let r = run(&fx, &[], None);
    expect(&r, "numa.nic", Status::Ok);
    let s = &r.get("numa.nic").unwrap().summary;
    assert!(
        s.contains("1 of 4 GPU(s)") && s.contains("unknown: GPU 0000:40:00.0"),
        "{s}"
    );
}

/// GPUs of known node whose NICs' nodes sysfs does not know: a NIC of unknown node may be
/// on the GPU's node, so the GPU is not compared, where it read as far from every NIC.
#[test]
fn nics_of_unknown_numa_node_are_not_read_as_far() {
    let fx = connectx("cx-nic-numa-unknown", OPEN_DRIVER);
    // The NICs of NUMA 1 (GPUs 0000:60 and 0000:80) lose their node.
    fx.file("/sys/bus/pci/devices/0000:61:00.0/numa_node", "-1");
    fx.file("/sys/bus/pci/devices/0000:81:00.0/numa_node", "-1");
    let r = run(&fx, &[], None);
    expect(&r, "numa.nic", Status::Ok);
    let s = &r.get("numa.nic").unwrap().summary;
    assert!(
        s.contains("2 of 4 GPU(s)")
            && s.contains("not compared")
            && s.contains("GPU 0000:60:00.0 (NUMA 1; a NIC's node unknown)")
            && s.contains("GPU 0000:80:00.0"),
        "{s}"
    );
    // Every NIC's node unknown: no GPU compared.
    set_numa_nodes(&fx, 0x21, "-1");
    let r = run(&fx, &[], None);
    expect(&r, "numa.nic", Status::Skip);
    assert!(r
        .get("numa.nic")
        .unwrap()
        .summary
        .contains("no GPU's NUMA node could be compared"));
    // A NIC's node known and far from a GPU with no unknown NIC left: still a warning.
    set_numa_nodes(&fx, 0x21, "0");
    let r = run(&fx, &[], None);
    expect(&r, "numa.nic", Status::Warn);
}

/// The same from a topology (hwloc): a GPU whose NUMA node the topology does not know had
/// its NICs counted as on its node. Now every GPU unknown skips, and a partly known
/// topology's Ok names the GPUs it did not compare.
#[test]
fn topology_gpus_of_unknown_numa_node_are_not_vouched_for() {
    let fx = connectx("cx-topo-numa-unknown", OPEN_DRIVER);
    // The NUMA nodes of GPU 0, GPU 1, and the groups of mlx5_0 and mlx5_1.
    let topology = |gpu0: &str, gpu1: &str, nic0: &str, nic1: &str| -> topo::Topology {
        let json = format!(
            r#"{{"gpus":[
                {{"index":0,"pci":"0000:20:00.0","numa":{gpu0},
                  "nics":[{{"name":"mlx5_0","pci":"0000:21:00.0"}}],"cores":[0]}},
                {{"index":1,"pci":"0000:40:00.0","numa":{gpu1},
                  "nics":[{{"name":"mlx5_1","pci":"0000:41:00.0"}}],"cores":[1]}}],
              "unassigned_nics":[],
              "numa_groups":[{{"numa":{nic0},"nics":[{{"name":"mlx5_0","pci":"0000:21:00.0"}}],"cores":[0]}},
                {{"numa":{nic1},"nics":[{{"name":"mlx5_1","pci":"0000:41:00.0"}}],"cores":[0,1]}}]}}"#
        );
        serde_json::from_str(&json).expect("topology JSON")
    };
    let r = run_on(&fx, &[], None, Some(topology("null", "null", "0", "null")));
    expect(&r, "numa.nic", Status::Skip);
    assert!(r.get("numa.nic").unwrap().summary.contains("unknown"));
    let r = run_on(&fx, &[], None, Some(topology("0", "null", "0", "null")));
    expect(&r, "numa.nic", Status::Ok);
    let s = &r.get("numa.nic").unwrap().summary;
    assert!(
        s.contains("each of 1 GPU(s) compared")
            && s.contains("not compared, a NUMA node unknown: GPU 1"),
        "{s}"
    );
    // A GPU of known node whose NIC's node is unknown was read as crossing NUMA: it is not
    // compared.
    let r = run_on(&fx, &[], None, Some(topology("0", "1", "null", "1")));
    expect(&r, "numa.nic", Status::Ok);
    let s = &r.get("numa.nic").unwrap().summary;
    assert!(
        s.contains("each of 1 GPU(s) compared") && s.contains("GPU 0 (its NICs' node unknown)"),
        "{s}"
    );
    let r = run_on(&fx, &[], None, Some(topology("0", "1", "null", "null")));
    expect(&r, "numa.nic", Status::Skip);
    // Known and on another node: still crossing.
    let r = run_on(&fx, &[], None, Some(topology("0", "1", "1", "1")));
    expect(&r, "numa.nic", Status::Warn);
    assert!(r
        .get("numa.nic")
        .unwrap()
        .summary
        .contains("cross-NUMA NIC: GPU 0 (NUMA 0)"));
}

/// This kind of box: no GPU, no RDMA device, an 8 MiB memlock limit.
fn cpu_only(name: &str) -> Fx {
    let fx = Fx::new(name);
    fx.common(&["virtio_net"], "8388608", None);
    fx.pci(
        "0000:00:03.0",
        "0x1af4",
        "0x1000",
        "0x020000",
        "virtio-pci",
        -1,
        2.5,
        1,
    );
    fx
}

#[test]
fn cpu_only_box_warns() {
    let fx = cpu_only("cpu");
    let r = run(&fx, &[("FI_PROVIDER", "efa")], None);
    expect(&r, "instance", Status::Ok);
    expect(&r, "gpus", Status::Ok);
    expect(&r, "rdma.devices", Status::Warn);
    expect(&r, "memlock", Status::Warn);
    assert!(r.get("memlock").unwrap().summary.contains("8192 KiB"));
    for id in [
        "rdma.count",
        "gpu.memory",
        "pcie.links",
        "pcie.acs",
        "numa.nic",
    ] {
        expect(&r, id, Status::Skip);
    }
    expect(&r, "env.fi-provider-efa-absent", Status::Fail);
    assert_eq!(r.exit_code, 2);
    let r = run(&fx, &[], None);
    assert_eq!(r.exit_code, 1);
}

// ---------------------------------------------------------------------------------------
// Through the command line

fn doctor_cli(args: &[&str], env: &[(&str, &str)]) -> common::Out {
    let mut c = Command::new(common::bin());
    c.arg("doctor").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("FI_") || k.starts_with("NCCL_") {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    let o = c.output().expect("running rdma-bench doctor");
    common::Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
        elapsed: std::time::Duration::ZERO,
    }
}

fn root_arg(fx: &Fx) -> String {
    fx.root.display().to_string()
}

#[test]
fn cli_exit_codes_follow_the_worst_check() {
    let healthy = p5("cli-p5");
    let o = doctor_cli(&["--root", &root_arg(&healthy)], &[]);
    // libfabric is skipped under --root: the healthy p5 is all ok.
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("(instance type p5)"), "{}", o.stdout);
    let o = doctor_cli(&["--root", &root_arg(&healthy)], &[("NCCL_NET", "Socket")]);
    assert_eq!(o.code, Some(2), "{}", o.stdout);
    assert!(o.stdout.contains("env.nccl-net-socket"), "{}", o.stdout);
    assert!(o.stdout.contains("fix: unset NCCL_NET"), "{}", o.stdout);

    let cpu = cpu_only("cli-cpu");
    let o = doctor_cli(&["--root", &root_arg(&cpu), "--json"], &[]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    let v = o.json();
    assert_eq!(v["exit_code"], 1);
    let checks = v["checks"].as_array().unwrap();
    let mem = checks.iter().find(|c| c["id"] == "memlock").unwrap();
    assert_eq!(mem["status"], "warn");
    assert!(mem["fix"].as_str().unwrap().contains("memlock unlimited"));
}

/// `doctor --backend ucx ...`: the UCX probe opens a context with what was named and lists
/// its transports; an RDMA device UCX has no transport on is a warning, as is GPU memory of a
/// UCX without CUDA; transports UCX does not have are a failure in UCX's own words.
#[cfg(feature = "ucx")]
mod ucx {
    use super::*;

    fn doctor(args: &[&str]) -> (common::Out, serde_json::Value) {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        // UCX's own environment would stand in for what the test names.
        let mut c = Command::new(common::bin());
        c.arg("doctor").args(&a);
        for (k, _) in std::env::vars() {
            if k.starts_with("FI_") || k.starts_with("NCCL_") || k.starts_with("UCX_") {
                c.env_remove(k);
            }
        }
        let o = c.output().expect("running rdma-bench doctor");
        let o = common::Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
            elapsed: std::time::Duration::ZERO,
        };
        let v = o.json();
        (o, v)
    }

    fn check<'a>(v: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
    }

    fn rdma_on_this_node() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    }

    /// A run's `--report` page: its node check asks UCX about what the run named, as
    /// `doctor --backend ucx --provider tcp` does (it asked about nothing before).
    #[test]
    fn the_reports_node_check_asks_what_the_run_named() {
        let d = std::env::temp_dir().join(format!("rdma-bench-ucx-report-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let page = d.join("report.html");
        let o = common::run(
            &[
                "loopback",
                "--backend",
                "ucx",
                "--provider",
                "tcp",
                "-n",
                "2",
                "--pages",
                "4",
                "-s",
                "4K",
                "--report",
                page.to_str().unwrap(),
            ],
            std::time::Duration::from_secs(120),
        );
        assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
        let html = std::fs::read_to_string(&page).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert!(
            html.contains("TLS=tcp NET_DEVICES=(default): tcp/"),
            "the node check did not ask about TLS=tcp: {}",
            html.lines()
                .filter(|l| l.contains("TLS="))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[test]
    fn tcp_on_lo_is_listed() {
        let (o, v) = doctor(&["--backend", "ucx", "--provider", "tcp", "--devices", "lo"]);
        let u = check(&v, "ucx").unwrap_or_else(|| panic!("no ucx check: {}", o.stdout));
        assert_eq!(u["status"], "ok");
        assert!(u["summary"].as_str().unwrap().starts_with("ucx 1."), "{u}");
        let t = check(&v, "ucx.transports").unwrap();
        assert_eq!(t["status"], "ok", "{t}");
        assert_eq!(
            t["summary"], "TLS=tcp NET_DEVICES=lo: tcp/lo; between nodes: tcp/lo",
            "{t}"
        );
        assert!(check(&v, "ucx.fallback").is_none(), "{}", o.stdout);
        assert!(check(&v, "ucx.cuda").is_none(), "{}", o.stdout);
        // A UCX before 1.18 can abort a process whose peer dies during wire-up over tcp
        // (Debian 12's 1.13.1 does, in the kill soak): the doctor says so.
        let minor: u32 = u["summary"].as_str().unwrap()["ucx 1.".len()..]
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no UCX version in {u}"));
        let dead = check(&v, "ucx.dead_peer");
        assert_eq!(dead.is_some(), minor < 18, "UCX 1.{minor}: {}", o.stdout);
        if let Some(d) = dead {
            assert_eq!(d["status"], "warn", "{d}");
            assert!(d["summary"].as_str().unwrap().contains("over tcp"), "{d}");
        }
    }

    #[test]
    fn an_rdma_device_ucx_has_no_transport_on_warns() {
        let (o, v) = doctor(&[
            "--backend",
            "ucx",
            "--devices",
            "nosuchhca0:1",
            "--mem",
            "cuda",
        ]);
        let w = check(&v, "ucx.fallback").unwrap_or_else(|| panic!("{}", o.stdout));
        assert_eq!(w["status"], "warn", "{w}");
        assert!(
            w["summary"]
                .as_str()
                .unwrap()
                .starts_with("RDMA device nosuchhca0:1 named, but UCX has no RDMA transport on it"),
            "{w}"
        );
        assert!(w["fix"].as_str().unwrap().contains("libuct_ib.so"), "{w}");
        assert!(o.code >= Some(1), "{:?}", o.code);
        // GPU memory: a warning where this UCX has no CUDA memory domain (Debian's has none).
        let t = check(&v, "ucx.transports").unwrap()["summary"]
            .as_str()
            .unwrap()
            .to_string();
        let c = check(&v, "ucx.cuda").unwrap_or_else(|| panic!("{}", o.stdout));
        if !t.contains("cuda_copy") {
            assert_eq!(c["status"], "warn", "{c}");
            assert!(
                c["summary"]
                    .as_str()
                    .unwrap()
                    .contains("no CUDA memory domain"),
                "{c}"
            );
        }
        // What was named for another backend is not asked of UCX.
        let (o, v) = doctor(&["--backend", "verbs", "--devices", "nosuchhca0:1"]);
        assert!(
            check(&v, "ucx.fallback").is_none() || rdma_on_this_node(),
            "{}",
            o.stdout
        );
    }

    #[test]
    fn transports_ucx_does_not_have_fail_in_its_words() {
        if rdma_on_this_node() {
            transport_core::skip::note("rc_verbs may open here", "this node has RDMA devices");
            return;
        }
        let (o, v) = doctor(&["--backend", "ucx", "--provider", "rc_verbs"]);
        let t = check(&v, "ucx.transports").unwrap();
        assert_eq!(t["status"], "fail", "{t}");
        assert!(
            t["summary"]
                .as_str()
                .unwrap()
                .starts_with("UCX opened no transport for TLS=rc_verbs NET_DEVICES=(default): "),
            "{t}"
        );
        assert_eq!(o.code, Some(2));
        // UCX's own words, in the finding (and on stderr, not in the JSON on stdout).
        assert!(
            t["summary"]
                .as_str()
                .unwrap()
                .contains("(UCX: transport 'rc_verbs' is not available"),
            "{t}"
        );
        assert!(o.stderr.contains("rc_verbs"), "{}", o.stderr);
    }

    #[test]
    fn provider_needs_a_backend() {
        let mut c = Command::new(common::bin());
        let o = c.args(["doctor", "--provider", "tcp"]).output().unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("--backend"));
    }
}

#[test]
fn cli_bad_root_is_a_usage_error() {
    let o = doctor_cli(&["--root", "/nonexistent/rdma-bench-root"], &[]);
    assert_eq!(o.code, Some(2));
    assert!(
        o.stderr
            .contains("--root /nonexistent/rdma-bench-root: not a directory"),
        "{}",
        o.stderr
    );
    let o = doctor_cli(&["--topology", "/nonexistent.xml"], &[]);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("--topology"), "{}", o.stderr);
}

/// Live on this machine: any verdict, but a verdict (no panic, no error).
#[test]
fn cli_live_runs_without_error() {
    let o = doctor_cli(&["--json"], &[]);
    assert!(matches!(o.code, Some(0..=2)), "{:?} {}", o.code, o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["exit_code"].as_i64(), o.code.map(i64::from));
    let ids: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    for id in ["instance", "rdma.devices", "memlock", "libfabric", "iommu"] {
        assert!(ids.contains(&id), "{id} missing: {ids:?}");
    }
    let text = doctor_cli(&[], &[]);
    assert_eq!(text.code, o.code);
    assert!(
        text.stdout.contains("rdma-bench doctor:"),
        "{}",
        text.stdout
    );
}

/// The real p5 hwloc export (when ../shared/topologies is there) with the healthy p5 tree:
/// topo gives every GPU 4 EFA on its NUMA node.
#[test]
fn p5_topology_from_hwloc_export() {
    let xml = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/topologies/hwloc/aws-p5.48xlarge.8xH100-32xEFA.nixl.hwloc2.xml");
    if !xml.exists() {
        transport_core::skip::note(
            "no ../shared/topologies",
            &format!("{} not present", xml.display()),
        );
        return;
    }
    let fx = p5("p5-topo");
    let t = topo::from_xml(&xml).expect("p5 export loads");
    let r = run_on(&fx, &[], None, Some(t));
    expect(&r, "numa.nic", Status::Ok);
    assert!(r
        .get("numa.nic")
        .unwrap()
        .summary
        .contains("4 per GPU, topo"));
    let o = doctor_cli(
        &[
            "--root",
            &root_arg(&fx),
            "--topology",
            xml.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "{}", o.stdout);
}

// ---------------------------------------------------------------------------------------
// The list of checks and README.md's doctor table

fn readme() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// README.md's doctor table, from its header row to the last row.
fn readme_doctor_table(readme: &str) -> String {
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with("| check | what it checks | what to do |"));
    let mut t = String::new();
    for l in lines.by_ref().take_while(|l| l.starts_with('|')) {
        t.push_str(l);
        t.push('\n');
    }
    assert!(
        !t.is_empty(),
        "README.md has no doctor table (| check | what it checks | what to do |)"
    );
    t
}

/// README.md's doctor table is exactly what `doctor --list-checks --markdown` prints.
#[test]
fn readme_doctor_table_is_the_list() {
    let o = doctor_cli(&["--list-checks", "--markdown"], &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert_eq!(o.stdout, doctor::catalog::markdown());
    let readme = readme();
    let t = readme_doctor_table(&readme);
    assert!(
        t == o.stdout,
        "README.md's doctor table differs from `rdma-bench doctor --list-checks --markdown`; \
         paste its output into README.md.\nREADME:\n{t}\nthe list:\n{}",
        o.stdout
    );
    // The plain list names every check too.
    let o = doctor_cli(&["--list-checks"], &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    for c in doctor::catalog::CHECKS {
        assert!(o.stdout.contains(c.id), "{} missing:\n{}", c.id, o.stdout);
    }
    assert!(!o.stdout.contains("| ---"), "{}", o.stdout);
    // --markdown only with --list-checks.
    assert_eq!(doctor_cli(&["--markdown"], &[]).code, Some(2));
}

/// The sample output in README.md shows only listed checks, and every listed check is one
/// the doctor's code reports (no stale row): each id, bar the placeholders, is a string the
/// checks' source names.
#[test]
fn readme_sample_and_the_source_agree_with_the_list() {
    let readme = readme();
    let sample: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "$ rdma-bench doctor")
        .take_while(|l| *l != "```")
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            matches!(w.next(), Some("ok" | "WARN" | "FAIL" | "skip")).then(|| w.next())?
        })
        .collect();
    assert!(
        sample.len() >= 5,
        "no doctor sample in README.md: {sample:?}"
    );
    for id in &sample {
        assert!(
            doctor::catalog::listed(id),
            "README's sample shows {id}, not in the list"
        );
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench-doctor/src");
    let mut code = String::new();
    for f in [
        "checks/mod.rs",
        "checks/gpu.rs",
        "checks/numa.rs",
        "checks/pcie.rs",
        "checks/rdma.rs",
        "env.rs",
    ] {
        code.push_str(&std::fs::read_to_string(src.join(f)).unwrap());
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in doctor::catalog::CHECKS {
        assert!(seen.insert(c.id), "{} listed twice", c.id);
        if c.id == "env.RULE" || c.id == "LIBRARY" {
            continue;
        }
        assert!(
            code.contains(&format!("\"{}\"", c.id)),
            "{} is listed but no check reports it",
            c.id
        );
    }
}

/// `doctor --backend libfabric` asks libfabric about what the run names: an endpoint on a
/// provider that does not exist here fails the check (exit 2) in libfabric's words; one on
/// shm opens.
#[test]
fn libfabric_is_asked_about_the_named_provider() {
    let named = |provider: &str| {
        let o = Command::new(common::bin())
            .args([
                "doctor",
                "--json",
                "--backend",
                "libfabric",
                "--provider",
                provider,
            ])
            .env_remove("FI_PROVIDER")
            .output()
            .expect("running rdma-bench doctor");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor's JSON");
        let c = v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["id"] == "libfabric.named")
            .cloned()
            .unwrap_or_else(|| panic!("no libfabric.named check: {v:#}"));
        (o.status.code(), c)
    };
    let (code, c) = named("no-such-provider");
    assert_eq!(code, Some(2), "{c}");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["summary"].as_str().unwrap().contains("no-such-provider"),
        "{c}"
    );
    let (_, c) = named("shm");
    assert_eq!(c["status"], "ok", "{c}");
    // Another backend's names are not libfabric's to judge.
    let o = Command::new(common::bin())
        .args([
            "doctor",
            "--json",
            "--backend",
            "ucx",
            "--provider",
            "no-such-provider",
        ])
        .output()
        .expect("running rdma-bench doctor");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor's JSON");
    assert!(
        !v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|c| c["id"] == "libfabric.named"),
        "libfabric judged ucx's provider: {v:#}"
    );
}
