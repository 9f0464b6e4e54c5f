//! Unit tests of the GID choice: tables as the kernel fills them (InfiniBand, RoCE v1/v2,
//! VLANs, several subnets, IPv6), and both ends of a connection picking the same pair.

use super::*;

pub(crate) fn v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

fn v6(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().unwrap().octets()
}

fn entry(
    index: u8,
    gid: [u8; 16],
    kind: GidKind,
    prefix_len: u8,
    netdev: &str,
    vlan: Option<u16>,
) -> GidEntry {
    GidEntry {
        index,
        wire: WireGid {
            gid,
            kind,
            prefix_len,
            vlan: vlan.is_some(),
        },
        netdev: Some(netdev.into()),
        vlan_id: vlan,
    }
}

/// A ConnectX-style RoCE table as the kernel fills it: per address a v1 and a v2 entry,
/// the link-local ones first; `eth0` with 10.0.0.5/24 and 192.168.7.5/24, and VLAN 100
/// on `eth0.100` with 172.16.0.5/16.
fn roce_table(host: u8) -> Vec<GidEntry> {
    use GidKind::*;
    let ll = v6(&format!("fe80::2:c9ff:fe00:{host}"));
    vec![
        entry(0, ll, RoceV1, 64, "eth0", None),
        entry(1, ll, RoceV2, 64, "eth0", None),
        entry(2, v4([172, 16, 0, host]), RoceV1, 16, "eth0.100", Some(100)),
        entry(3, v4([172, 16, 0, host]), RoceV2, 16, "eth0.100", Some(100)),
        entry(4, v4([10, 0, 0, host]), RoceV1, 24, "eth0", None),
        entry(5, v4([10, 0, 0, host]), RoceV2, 24, "eth0", None),
        entry(6, v4([192, 168, 7, host]), RoceV1, 24, "eth0", None),
        entry(7, v4([192, 168, 7, host]), RoceV2, 24, "eth0", None),
        entry(
            8,
            v6(&format!("2001:db8::{host}")),
            RoceV2,
            64,
            "eth0",
            None,
        ),
    ]
}

fn wires(c: &[GidEntry]) -> Vec<WireGid> {
    c.iter().map(|e| e.wire).collect()
}

/// The path each side of a connection picks from the other's advertised candidates.
fn connect(a: &[GidEntry], b: &[GidEntry], roce: bool) -> (PeerPath, PeerPath) {
    (
        peer_path(a, &wires(b), roce).unwrap(),
        peer_path(b, &wires(a), roce).unwrap(),
    )
}

fn cands(t: &[GidEntry], forced: Option<u8>) -> Vec<GidEntry> {
    candidates(t, true, forced, "mlx5_0", 1).unwrap()
}

/// Before: the first IPv4-mapped RoCE v2 GID whatever its netdev (here the VLAN's, index
/// 3). Now both ends pick the untagged RoCE v2 pair on a shared subnet, each naming the
/// other's GID. On a ConnectX-7 port with a VLAN the old choice sent every packet tagged
/// onto a network the peer may not be on (RTR then fails, or the ACKs never come back).
#[test]
fn untagged_v2_on_a_shared_subnet_by_default() {
    let (a, b) = (cands(&roce_table(5), None), cands(&roce_table(6), None));
    assert_eq!(a[0].index, 5, "own preference: untagged IPv4 RoCE v2 first");
    let (pa, pb) = connect(&a, &b, true);
    assert_eq!(
        (pa.sgid_index, pa.sgid, pa.dgid),
        (5, v4([10, 0, 0, 5]), v4([10, 0, 0, 6]))
    );
    assert_eq!((pb.sgid, pb.dgid), (pa.dgid, pa.sgid));
    assert_eq!((pa.netdev.as_deref(), pa.vlan), (Some("eth0"), None));
}

/// A peer whose only address is on the second subnet of the port: that subnet's GID, not
/// the first address's. Real hardware: a GID on another subnet makes the route lookup at
/// RTR fail (no neighbour) or sends the traffic through a router the fabric may not have.
#[test]
fn the_subnet_that_reaches_the_peer() {
    use GidKind::*;
    let a = cands(&roce_table(5), None);
    let peer = vec![entry(3, v4([192, 168, 7, 9]), RoceV2, 24, "ens1", None)];
    let (pa, pb) = connect(&a, &peer, true);
    assert_eq!((pa.sgid_index, pa.dgid), (7, v4([192, 168, 7, 9])));
    assert_eq!(pb.dgid, v4([192, 168, 7, 5]));
}

/// A VLAN GID only where the VLAN's subnet alone reaches the peer; the untagged netdev
/// otherwise, even when the VLAN's subnet matches too.
#[test]
fn vlan_only_where_only_its_subnet_matches() {
    use GidKind::*;
    let a = cands(&roce_table(5), None);
    let on_vlan = vec![entry(
        2,
        v4([172, 16, 3, 1]),
        RoceV2,
        16,
        "ens1.100",
        Some(100),
    )];
    let (pa, _) = connect(&a, &on_vlan, true);
    assert_eq!((pa.sgid_index, pa.vlan), (3, Some(100)));
    assert_eq!(pa.netdev.as_deref(), Some("eth0.100"));
    // The peer on both the VLAN's and the untagged subnet: untagged.
    let both = vec![
        entry(2, v4([172, 16, 3, 1]), RoceV2, 16, "ens1.100", Some(100)),
        entry(4, v4([10, 0, 0, 1]), RoceV2, 24, "ens1", None),
    ];
    let (pa, pb) = connect(&a, &both, true);
    assert_eq!((pa.sgid_index, pa.vlan), (5, None));
    assert_eq!(pb.sgid_index, 4);
}

/// Mixed RoCE v1/v2 tables: v2 wherever both have it; a v1-only peer gets a v1 pair (a
/// v2 GID towards a v1 peer would put UDP/IP packets on a wire the peer reads as RoCE
/// v1: nothing arrives).
#[test]
fn mixed_v1_v2_tables() {
    use GidKind::*;
    let a = cands(&roce_table(5), None);
    let v1_only = vec![entry(0, v4([10, 0, 0, 9]), RoceV1, 24, "eth2", None)];
    let (pa, pb) = connect(&a, &v1_only, true);
    assert_eq!((pa.sgid_index, pb.sgid_index), (4, 0));
    // v2 first when only the v1 entry is on the peer's subnet? No: the type comes first,
    // and a v2 pair without a subnet match still beats it (a routed v2 fabric).
    let peer = vec![
        entry(0, v4([10, 0, 0, 9]), RoceV1, 24, "eth2", None),
        entry(1, v4([10, 9, 0, 9]), RoceV2, 24, "eth2", None),
    ];
    let (pa, _) = connect(&a, &peer, true);
    assert_eq!((pa.sgid_index, pa.dgid), (5, v4([10, 9, 0, 9])));
    // A forced v1 index pairs with the peer's v1 entry; with none, a clear error.
    let forced = cands(&roce_table(5), Some(4));
    let (pa, _) = connect(&forced, &peer, true);
    assert_eq!((pa.sgid_index, pa.dgid), (4, v4([10, 0, 0, 9])));
    let v2_only = vec![entry(1, v4([10, 0, 0, 9]), RoceV2, 24, "eth2", None)];
    match peer_path(&forced, &wires(&v2_only), true) {
        Err(Error::InvalidArgument(m)) => {
            assert!(
                m.contains("RoCE v1 10.0.0.5") && m.contains("RoCE v2 10.0.0.9"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// A routed fabric (no shared subnet): untagged IPv4 RoCE v2 still, never a link-local
/// pair (whose /64 would otherwise look like a shared subnet; link-local packets do not
/// cross a router).
#[test]
fn routed_peers_and_link_local() {
    let a = cands(&roce_table(5), None);
    let mut b = roce_table(6);
    for e in &mut b {
        if is_v4_mapped(&e.wire.gid) {
            e.wire.gid[13] = 77; // 10.77.0.6, 192.77.7.6, 172.77.0.6: no subnet in common
        } else if !is_link_local(&e.wire.gid) {
            e.wire.gid[2] = 0x77; // 2001:7738::6
        }
    }
    let b = cands(&b, None);
    let (pa, pb) = connect(&a, &b, true);
    assert_eq!(pa.sgid_index, 5, "{pa:?}");
    assert!(is_v4_mapped(&pa.dgid) && pa.vlan.is_none());
    assert_eq!((pb.sgid, pb.dgid), (pa.dgid, pa.sgid));
}

/// IPv6-only RoCE: the global address on the peer's /64, not the link-local one.
#[test]
fn ipv6_subnets() {
    use GidKind::*;
    let a = cands(&roce_table(5), None);
    let peer = vec![
        entry(0, v6("fe80::1"), RoceV2, 64, "ens1", None),
        entry(1, v6("2001:db8::77"), RoceV2, 64, "ens1", None),
    ];
    let (pa, _) = connect(&a, &peer, true);
    assert_eq!((pa.sgid_index, pa.dgid), (8, v6("2001:db8::77")));
}

/// Whatever two tables, both ends pick the same pair: each one's source GID is the
/// other's destination. rxe drops a packet whose destination GID is not on the netdev it
/// arrived on, and a ConnectX answers from the QP's own source GID: a one-sided choice
/// could leave the ACKs on another subnet or VLAN.
#[test]
fn both_ends_agree() {
    let tables: Vec<Vec<GidEntry>> = (0..6)
        .map(|k| {
            let mut t = roce_table(5 + k);
            // drop some entries so the tables differ in shape
            t.retain(|e| !(e.index as usize + k as usize).is_multiple_of(3));
            t
        })
        .collect();
    for a in &tables {
        for b in &tables {
            for fa in [None, Some(a[0].index), Some(a[a.len() - 1].index)] {
                let (ca, cb) = (cands(a, fa), cands(b, None));
                let pa = peer_path(&ca, &wires(&cb), true);
                let pb = peer_path(&cb, &wires(&ca), true);
                match (pa, pb) {
                    (Ok(pa), Ok(pb)) => {
                        assert_eq!((pa.sgid, pa.dgid), (pb.dgid, pb.sgid), "{ca:?}\n{cb:?}")
                    }
                    (Err(_), Err(_)) => {}
                    (pa, pb) => panic!("one end connects, the other not: {pa:?} {pb:?}"),
                }
            }
        }
    }
}

/// InfiniBand: index 0 (the port GID), no subnet or VLAN logic; a forced index stays.
/// Real IB: the LID routes and the GRH (with this GID) is added only on request.
#[test]
fn infiniband_table() {
    use GidKind::*;
    let prefix = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
    let gid = |guid: u8| {
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&prefix);
        g[15] = guid;
        g
    };
    let t = |guid| {
        vec![
            GidEntry {
                index: 0,
                wire: WireGid {
                    gid: gid(guid),
                    kind: Ib,
                    prefix_len: 0,
                    vlan: false,
                },
                netdev: None,
                vlan_id: None,
            },
            GidEntry {
                index: 1,
                wire: WireGid {
                    gid: gid(guid + 100),
                    kind: Ib,
                    prefix_len: 0,
                    vlan: false,
                },
                netdev: None,
                vlan_id: None,
            },
        ]
    };
    let a = candidates(&t(1), false, None, "mlx5_0", 1).unwrap();
    assert_eq!(a.len(), 1);
    let b = candidates(&t(2), false, Some(1), "mlx5_1", 1).unwrap();
    let (pa, pb) = connect(&a, &b, false);
    assert_eq!((pa.sgid_index, pa.dgid), (0, gid(102)));
    assert_eq!((pb.sgid_index, pb.dgid), (1, gid(1)));
    // An empty table (old kernels, a port without GIDs): index 0, no GRH.
    let none = candidates(&[], false, None, "mlx5_0", 1).unwrap();
    let p = peer_path(&none, &[], false).unwrap();
    assert_eq!((p.sgid_index, p.dgid), (0, [0; 16]));
}

/// `gid=N` forces the index (here the VLAN's, which the choice would not take); an empty
/// index is an error that names show_gids and the sysfs path.
#[test]
fn forced_index() {
    let a = cands(&roce_table(5), Some(3));
    assert_eq!(a.len(), 1);
    let (pa, pb) = connect(&a, &cands(&roce_table(6), None), true);
    assert_eq!((pa.sgid_index, pa.vlan), (3, Some(100)));
    assert_eq!(
        (pb.sgid_index, pb.vlan),
        (3, Some(100)),
        "the peer follows it"
    );
    match candidates(&roce_table(5), true, Some(42), "mlx5_0", 1) {
        Err(Error::InvalidArgument(m)) => {
            for want in [
                "42",
                "show_gids mlx5_0",
                "/sys/class/infiniband/mlx5_0/ports/1/gids/",
            ] {
                assert!(m.contains(want), "{want} missing: {m}");
            }
        }
        other => panic!("{other:?}"),
    }
    match candidates(&[], true, None, "rxe0", 1) {
        Err(Error::NoDevice(m)) => assert!(m.contains("IP address"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn subnet_arithmetic() {
    let w = |gid, prefix_len| WireGid {
        gid,
        kind: GidKind::RoceV2,
        prefix_len,
        vlan: false,
    };
    assert!(in_subnet(&w(v4([10, 1, 2, 3]), 24), &v4([10, 1, 2, 200])));
    assert!(!in_subnet(&w(v4([10, 1, 2, 3]), 24), &v4([10, 1, 3, 3])));
    assert!(in_subnet(&w(v4([10, 1, 2, 3]), 23), &v4([10, 1, 3, 3])));
    assert!(
        !in_subnet(&w(v4([10, 1, 2, 3]), 0), &v4([10, 1, 2, 3])),
        "0: unknown"
    );
    assert!(!in_subnet(&w(v4([10, 1, 2, 3]), 33), &v4([10, 1, 2, 3])));
    assert!(in_subnet(&w(v4([10, 1, 2, 3]), 32), &v4([10, 1, 2, 3])));
    assert!(!in_subnet(&w(v4([10, 1, 2, 3]), 8), &v6("2001:db8::1")));
    assert!(in_subnet(
        &w(v6("2001:db8::1"), 64),
        &v6("2001:db8::ffff:1")
    ));
    assert!(!in_subnet(&w(v6("2001:db8::1"), 64), &v6("2001:db9::1")));
    assert_eq!(gid_text(&v4([10, 99, 0, 1])), "10.99.0.1");
    assert_eq!(gid_text(&v6("fe80::1")), "fe80::1");
}
