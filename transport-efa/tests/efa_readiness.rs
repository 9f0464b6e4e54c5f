//! The hardware-readiness fixes, on libfabric's real efa provider: under the simulated EFA
//! device (`ci/efa-sim.sh cargo test -p transport-efa --test efa_readiness`, and with
//! `--devices p5` or `--devices minimal-nouwr`), or on an EFA host. Skipped without an efa
//! device; `CONFORMANCE_REQUIRE_DEVICE=1` makes that a failure.
//!
//! What each test would have caught on a p5 before the fix is in its comment.

use transport_core::{Error, NicDesc, Result, Transport};
use transport_efa::{match_nic, Endpoint};

fn efa() -> NicDesc {
    NicDesc::provider("efa")
}

/// An efa endpoint, or `None` (with a note) where this host has no efa device.
fn open(nic: &NicDesc) -> Option<Endpoint> {
    match Endpoint::open(nic) {
        Ok(ep) => Some(ep),
        Err(Error::NoDevice(why)) if std::env::var_os("CONFORMANCE_REQUIRE_DEVICE").is_none() => {
            transport_core::skip::note("no device (transport_efa)", &why);
            None
        }
        Err(e) => panic!("open efa: {e}"),
    }
}

/// On the efa fabric the endpoint asks for the library's own API version, which keeps device
/// RDMA on: WRITEs are the device's, not SENDs in disguise (below 1.18 the provider turns
/// device RDMA off on 0xefa0/0xefa1 devices, as on p4d and p5), with `FI_THREAD_DOMAIN` (no
/// lock per operation) and shared memory off (a same-host run measures the device).
#[test]
fn efa_fabric_uses_the_device_and_no_shm() {
    let Some(ep) = open(&efa()) else { return };
    let info = ep.info().clone();
    eprintln!("efa: {info}");
    let (major, minor) = info.api_version.split_once('.').expect("major.minor");
    let api = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap());
    assert!(api >= (1, 20), "{info}");
    assert_eq!(info.threading, "FI_THREAD_DOMAIN", "{info}");
    assert_eq!(info.shm_permitted, Some(false), "{info}");
    if std::env::var_os("FI_EFA_USE_DEVICE_RDMA").is_none() {
        assert_eq!(info.emulated_write, Some(false), "{info}");
    }
    assert!(info.pci.is_some(), "{info}");
    // shm=on asks for it; FI_EFA_ENABLE_SHM_TRANSFER=0 (ci/efa-sim.sh sets it for fabtests)
    // overrides the application, and the endpoint then says it could not be set.
    let with_shm = open(&efa().with_option("shm", "on")).expect("efa with shm=on");
    let env_off = std::env::var("FI_EFA_ENABLE_SHM_TRANSFER").is_ok_and(|v| v == "0");
    let want = if env_off { None } else { Some(true) };
    assert_eq!(with_shm.info().shm_permitted, want, "{}", with_shm.info());
}

/// Every efa domain is matched by its PCI address, whatever its name: the ibverbs name
/// `topo` reports (`rdmap79s0`) is not a domain name (`rdmap79s0-rdm`), which stopped a p5 run
/// at its first endpoint. The NIC is named wrongly on purpose (as a renamed device would be):
/// with its right name, the name fallback (`rdmap79s0` is `rdmap79s0-rdm`) would find the
/// domain even if matching by PCI address were broken.
#[test]
fn each_domain_opens_by_its_pci_address() -> Result<()> {
    let domains = Endpoint::domains(Some("efa"))?;
    if domains.is_empty() {
        assert!(
            std::env::var_os("CONFORMANCE_REQUIRE_DEVICE").is_none(),
            "no efa domain"
        );
        transport_core::skip::note("no device (transport_efa)", "no efa domain");
        return Ok(());
    }
    let mut seen = 0;
    for d in domains.iter().filter(|d| d.fabric == "efa") {
        let pci = d
            .pci
            .expect("the efa provider reports each device's PCI address");
        let nic = NicDesc {
            device: Some(format!("renamed-{}", d.nic_name)),
            pci: Some(pci.to_string()),
            ..efa()
        };
        assert!(
            !domains.iter().any(|x| x.domain == d.nic_name),
            "a bare ibverbs name"
        );
        assert!(
            Endpoint::open(&NicDesc {
                pci: None,
                ..nic.clone()
            })
            .is_err(),
            "the wrong name alone opens {}: it would not test the PCI match",
            d.domain
        );
        let hits = match_nic(&domains, &nic)?;
        assert!(hits.iter().all(|&i| domains[i].pci == Some(pci)));
        let ep = Endpoint::open(&nic)?;
        assert_eq!(ep.nic_name(), d.domain);
        assert_eq!(ep.info().pci, Some(pci));
        seen += 1;
        if seen == 4 {
            break; // a few are enough under --devices p5's 32
        }
    }
    eprintln!(
        "{seen} domains opened by PCI address of {} offered",
        domains.len()
    );
    assert!(
        seen > 0,
        "no domain of the efa fabric among the {} offered: {domains:?}",
        domains.len()
    );
    let e = Endpoint::open(&NicDesc {
        pci: Some("0000:ff:1f.7".into()),
        device: Some("rdmap255s31".into()),
        ..efa()
    })
    .expect_err("no such NIC");
    assert!(e.to_string().contains("PCI 0000:ff:1f.7"), "{e}");
    Ok(())
}

/// Whether the simulated devices have unsolicited write receive: the `caps` line of the
/// device file `EFA_SIM_DEVICES` names (ci/efa-sim.sh sets it); `None` outside the simulator.
fn sim_unsolicited_write_recv() -> Option<bool> {
    let file = std::env::var_os("EFA_SIM_DEVICES")?;
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("EFA_SIM_DEVICES={}: {e}", file.to_string_lossy()));
    let caps: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("caps "))
        .collect();
    assert_eq!(caps.len(), 1, "one caps line in {}", file.to_string_lossy());
    Some(
        caps[0]
            .split_whitespace()
            .any(|c| c == "unsolicited_write_recv"),
    )
}

/// efa-direct on a device without unsolicited write receive (`--devices minimal-nouwr`):
/// without `FI_RX_CQ_DATA` the fabric offers no RMA and the open failed with no reason; now
/// the endpoint posts receives for immediates on a data endpoint. A SEND is capped at the
/// device's message size, a WRITE at its RDMA size. On a device with unsolicited write receive
/// (`minimal`, `p5`) the endpoint takes the unsolicited path: no receives for immediates.
///
/// Where it posts receives, enough immediates to wrap its receive queue several times: each
/// receive must be posted again as its immediate completes (a `repost` that did nothing would
/// stop the run after the first `MAX_IMM_RECVS`).
#[test]
fn efa_direct_opens_with_receives_for_immediates_where_the_device_needs_them() {
    let direct = efa().with_option("fabric", "efa-direct");
    let Some(ep) = open(&direct) else { return };
    let info = ep.info();
    eprintln!("efa-direct: {info}, caps {:?}", ep.caps());
    match sim_unsolicited_write_recv() {
        Some(uwr) => assert_eq!(
            info.rx_cq_data, !uwr,
            "unsolicited write recv {uwr}: {info}"
        ),
        None => eprintln!(
            "not the simulator: rx_cq_data {} not checked",
            info.rx_cq_data
        ),
    }
    assert!(
        ep.caps().max_msg_size < ep.caps().max_write_size,
        "{:?}",
        ep.caps()
    );
    // A pair moves a WRITE with immediate and a SEND either way.
    let pair = transport_conformance::connect(&|_| Endpoint::open(&direct)).expect("connect");
    if let Some(mut p) = pair {
        transport_conformance::immediates_exactly_once(&mut p).expect("immediates");
        transport_conformance::send_recv_len(&mut p, 4096).expect("send");
        if info.rx_cq_data {
            let n = 4 * transport_efa::MAX_IMM_RECVS + 100;
            transport_conformance::immediates_many(&mut p, n).expect("immediates");
            eprintln!(
                "{n} immediates: the {} receives wrapped 4 times",
                transport_efa::MAX_IMM_RECVS
            );
        }
    }
}
