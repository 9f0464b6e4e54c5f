//! How an endpoint is opened, checked on `shm` and `tcp` for what it means on EFA: the API
//! version asked, the threading model, the efa-only endpoint options, the domain list NICs
//! are matched against.

use std::sync::Once;

use transport_core::{Error, NicDesc, Transport};
use transport_efa::{match_nic, Endpoint};

fn tcp() -> NicDesc {
    static LOOPBACK: Once = Once::new();
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    nic
}

fn version(s: &str) -> (u32, u32) {
    let mut it = s.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// The API version asked is the highest both the loaded library and the headers know. On
/// the EFA installer's 2.x that keeps the efa provider's device RDMA on (below 1.18 it is
/// off by default on p4d and p5 devices, and WRITEs are emulated over SENDs) and lets it
/// take dmabuf registrations (1.20). The backend used to ask for 1.17 whatever it ran on.
#[test]
fn asks_for_the_highest_api_version_both_know() {
    let ep = Endpoint::open(&NicDesc::provider("shm")).expect("open shm");
    let want = version(&Endpoint::libfabric_version())
        .min(version(&Endpoint::libfabric_header_version()))
        .max((1, 17));
    assert_eq!(version(&ep.info().api_version), want, "{}", ep.info());
    if want.0 >= 2 {
        assert!(version(&ep.info().api_version) >= (1, 20));
    }
}

/// `FI_THREAD_DOMAIN`: the endpoint serializes its own calls, so the provider need not lock
/// per operation (efa 2.x takes a lock on every post and poll under `FI_THREAD_SAFE` and
/// `FI_THREAD_COMPLETION`). The backend used to ask for `FI_THREAD_SAFE`.
#[test]
fn opens_with_the_domain_threading_model() {
    for nic in [NicDesc::provider("shm"), tcp()] {
        let ep = Endpoint::open(&nic).expect("open");
        eprintln!("{}: {}", ep.provider(), ep.info());
        // libfabric 1.17's tcp;ofi_rxm runs its own progress thread where data progress
        // is automatic (its default) and then makes the domain FI_THREAD_SAFE whatever was
        // asked (rxm_alter_info); every other provider here grants what was asked.
        let rxm_1 =
            ep.provider().ends_with("ofi_rxm") && version(&Endpoint::libfabric_version()) < (2, 0);
        let want = if rxm_1 {
            "FI_THREAD_SAFE"
        } else {
            "FI_THREAD_DOMAIN"
        };
        assert_eq!(ep.info().threading, want, "{}", ep.info());
    }
}

/// `FI_OPT_SHARED_MEMORY_PERMITTED` and `FI_OPT_CUDA_API_PERMITTED` are efa's business (on
/// efa: shm off unless `shm=on`; CUDA calls off where GPU memory may be registered); on shm
/// and tcp nothing is set, and the endpoint says so.
#[test]
fn efa_only_settings_are_not_applied_elsewhere() {
    for nic in [NicDesc::provider("shm"), tcp()] {
        let ep = Endpoint::open(&nic.clone().with_option("shm", "off")).expect("open");
        let info = ep.info();
        assert_eq!(info.shm_permitted, None, "{info}");
        assert_eq!(info.emulated_write, None, "{info}");
        if !ep.caps().gpu_memory {
            assert_eq!(info.cuda_api_permitted, None, "{info}");
        }
        assert!(!info.rx_cq_data, "{info}");
    }
    for (k, v) in [("shm", "maybe"), ("cuda_api", "yes"), ("rx_cq_data", "off")] {
        match Endpoint::open(&NicDesc::provider("shm").with_option(k, v)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(k), "{m}"),
            other => panic!("{k}={v}: expected InvalidArgument, got {other:?}"),
        }
    }
}

/// What libfabric offers is listed with each domain's fabric and PCI function (none on tcp
/// and shm), and a NIC name libfabric does not offer fails with that list.
#[test]
fn domains_are_listed_and_matched() {
    let _ = tcp();
    let domains = Endpoint::domains(Some("tcp")).expect("tcp domains");
    assert!(domains.iter().any(|d| d.domain == "lo"), "{domains:?}");
    let lo = match_nic(&domains, &tcp()).expect("lo matches");
    assert!(lo.iter().all(|&i| domains[i].domain == "lo"));
    let mut nope = tcp();
    nope.device = Some("rdmap79s0".into());
    nope.pci = Some("0000:4f:00.0".into());
    match Endpoint::open(&nope) {
        Err(Error::NoDevice(m)) => {
            assert!(m.contains("rdmap79s0 at PCI 0000:4f:00.0"), "{m}");
            assert!(m.contains("lo (no PCI"), "{m}");
        }
        other => panic!("expected NoDevice, got {other:?}"),
    }
}
