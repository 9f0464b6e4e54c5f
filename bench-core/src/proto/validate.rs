//! The bounds every message that arrives is checked against before it is used.

use super::{
    proto, Msg, NicWire, CTRL_LEN, MAGIC, MAX_ADDR, MAX_BATCH, MAX_FACTS, MAX_IMM_EVERY, MAX_ITERS,
    MAX_LAT_ITERS, MAX_LINKS, MAX_NAME, MAX_NICS, MAX_PATH, MAX_RANKS, MAX_REGION, MAX_RUNS,
    MAX_TEXT, MAX_WARMUP, MAX_WINDOW, MRS_PER_NIC, VERSION,
};
use crate::config::{Knobs, Workload};
use crate::error::Result;
use crate::record::Facts;

fn check_name(what: &str, s: &str) -> Result<()> {
    if s.len() > MAX_NAME {
        return Err(proto(format!(
            "{what} is {} bytes long (limit {MAX_NAME})",
            s.len()
        )));
    }
    Ok(())
}

/// A peer's run-record facts: every text bounded, every list too.
fn check_facts(f: Option<&Facts>) -> Result<()> {
    let Some(f) = f else { return Ok(()) };
    let names = [&f.rdma_bench, &f.commit, &f.host, &f.kernel];
    for (what, s) in ["version", "commit", "host name", "kernel"]
        .iter()
        .zip(names)
    {
        check_name(what, s)?;
    }
    if let Some(i) = &f.instance {
        check_name("instance type", i)?;
    }
    if let Some(c) = &f.cuda {
        check_name("CUDA driver", &c.driver)?;
        if c.gpus.len() > MAX_FACTS {
            return Err(proto(format!(
                "{} GPU names (limit {MAX_FACTS})",
                c.gpus.len()
            )));
        }
        for g in &c.gpus {
            check_name("GPU name", g)?;
        }
    }
    if let Some(b) = &f.backend {
        for s in [&b.backend, &b.library, &b.device] {
            check_name("backend fact", s)?;
        }
        for s in [&b.version, &b.provider, &b.fabric, &b.firmware]
            .into_iter()
            .flatten()
        {
            check_name("backend fact", s)?;
        }
        if b.path.as_ref().is_some_and(|p| p.len() > MAX_PATH) {
            return Err(proto(format!("a library path over {MAX_PATH} bytes")));
        }
        if b.settings.len() > MAX_FACTS {
            return Err(proto(format!(
                "{} backend settings (limit {MAX_FACTS})",
                b.settings.len()
            )));
        }
        for (k, v) in &b.settings {
            check_name("backend setting", k)?;
            check_name("backend setting", v)?;
        }
    }
    Ok(())
}

fn check_nics(nics: &[NicWire]) -> Result<()> {
    if nics.is_empty() || nics.len() > MAX_NICS {
        return Err(proto(format!(
            "{} NICs announced (allowed: 1..={MAX_NICS})",
            nics.len()
        )));
    }
    for (i, n) in nics.iter().enumerate() {
        check_name("NIC name", &n.name)?;
        if n.addr.is_empty() || n.addr.len() > MAX_ADDR {
            return Err(proto(format!(
                "NIC {i}: address of {} bytes (allowed: 1..={MAX_ADDR})",
                n.addr.len()
            )));
        }
        if n.mrs.len() != MRS_PER_NIC {
            return Err(proto(format!(
                "NIC {i}: {} memory regions announced, expected {MRS_PER_NIC}",
                n.mrs.len()
            )));
        }
        if n.mrs[1].len < CTRL_LEN as u64 {
            return Err(proto(format!("NIC {i}: control region too small")));
        }
        for m in &n.mrs {
            if m.addr.checked_add(m.len).is_none() {
                return Err(proto(format!(
                    "NIC {i}: region {m:?} wraps the address space"
                )));
            }
            if m.len > MAX_REGION {
                return Err(proto(format!(
                    "NIC {i}: a region of {} bytes (limit {MAX_REGION})",
                    m.len
                )));
            }
        }
        if let Some(g) = n.link_gbps {
            if !g.is_finite() || g < 0.0 {
                return Err(proto(format!("NIC {i}: link speed {g} is not a speed")));
            }
        }
    }
    Ok(())
}

/// Check every bound that does not depend on this side's configuration.
pub fn validate(msg: &Msg) -> Result<()> {
    match msg {
        Msg::Hello(h) => {
            check_magic(&h.magic, h.version)?;
            check_name("backend", &h.backend)?;
            check_name("provider", &h.provider)?;
            check_nics(&h.nics)?;
            let want = (h.gpus as u64).checked_mul(h.nics_per_gpu as u64);
            if h.gpus == 0 || h.nics_per_gpu == 0 || want != Some(h.nics.len() as u64) {
                return Err(proto(format!(
                    "hello announces {} GPUs x {} NICs per GPU but carries {} NICs",
                    h.gpus,
                    h.nics_per_gpu,
                    h.nics.len()
                )));
            }
            for (i, n) in h.nics.iter().enumerate() {
                if n.gpu as usize != i / h.nics_per_gpu as usize {
                    return Err(proto(format!("NIC {i} claims GPU {}", n.gpu)));
                }
            }
            // The same bound the client's flag has.
            crate::buffers::check_page_offset(h.buf_offset)
                .map_err(|e| proto(format!("hello: {e}")))
        }
        Msg::Welcome(w) => {
            check_magic(&w.magic, w.version)?;
            check_nics(&w.nics)?;
            check_facts(w.facts.as_deref())
        }
        Msg::Request(r) => {
            // A page shifts by a cache line per step (buffers::Versions): at most size / 64
            // steps, so a 16 MiB page has 262144 (a fixed 65536 refused every page above 4 MiB).
            if r.shifts == 0 || r.shifts > (r.size / 64).max(1) {
                return Err(proto(format!(
                    "request of {} source shifts of {}-byte pages",
                    r.shifts, r.size
                )));
            }
            if r.imm_every == 0
                || r.imm_every > MAX_IMM_EVERY
                || r.count.saturating_mul(u64::from(r.imm_every)) > 1 << 20
            {
                return Err(proto(format!(
                    "request of --imm-every {} over {} pages",
                    r.imm_every, r.count
                )));
            }
            check_run(r.workload, r.size, r.count, r.iters, &r.knobs)
        }
        Msg::Error { message } => {
            if message.len() > MAX_TEXT {
                return Err(proto("error text too long"));
            }
            Ok(())
        }
        Msg::Done(d) => {
            if d.per_nic.len() > MAX_NICS || d.cores.len() > MAX_NICS {
                return Err(proto("done message lists too many NICs"));
            }
            if !d.seconds.is_finite() || d.seconds < 0.0 {
                return Err(proto("done message with a bad duration"));
            }
            for n in &d.per_nic {
                if !n.seconds.is_finite() || n.seconds < 0.0 {
                    return Err(proto("done message with a bad NIC duration"));
                }
            }
            Ok(())
        }
        Msg::Ready { .. } | Msg::Bye | Msg::Barrier { .. } => Ok(()),
        Msg::GpuStep(g) => {
            if g.size == 0 || g.size > u64::from(u32::MAX) || g.half > MAX_ITERS {
                return Err(proto("gpu-write step: size 1 byte to 4 GiB - 1"));
            }
            if g.n == 0 || g.n > MAX_ITERS || g.warm > MAX_LAT_ITERS {
                return Err(proto("gpu-write step: bad count"));
            }
            if !g.capacity.is_power_of_two() || g.capacity > 1 << 24 {
                return Err(proto("gpu-write step: ring capacity not a power of two"));
            }
            Ok(())
        }
        // The step's region bounds what a server can have checked; with it the client's sum
        // over its steps cannot overflow.
        Msg::GpuStepDone(d) if d.checked > MAX_REGION || d.arrivals > MAX_ITERS => {
            Err(proto(format!(
                "a gpu-write step's result claims {} WRITEs and {} bytes checked (limits \
                 {MAX_ITERS} and {MAX_REGION})",
                d.arrivals, d.checked
            )))
        }
        Msg::GpuStepDone(_) => Ok(()),
        Msg::Join(j) => {
            check_magic(&j.magic, j.version)?;
            check_name("host name", &j.host)?;
            if j.world < 2 || j.world > MAX_RANKS || j.rank >= j.world {
                return Err(proto(format!(
                    "rank {} of a job of {} (allowed: 2..={MAX_RANKS} ranks)",
                    j.rank, j.world
                )));
            }
            let sp = &j.spec;
            check_name("build", &sp.build)?;
            check_name("backend", &sp.backend)?;
            check_name("provider", &sp.provider)?;
            let nics = (sp.gpus as u64).checked_mul(sp.nics_per_gpu as u64);
            if sp.gpus == 0 || sp.nics_per_gpu == 0 || nics.is_none_or(|n| n > MAX_NICS as u64) {
                return Err(proto(format!(
                    "{} GPUs x {} NICs per rank (allowed: 1..={MAX_NICS} NICs)",
                    sp.gpus, sp.nics_per_gpu
                )));
            }
            if sp.runs.is_empty() || sp.runs.len() > MAX_RUNS {
                return Err(proto(format!(
                    "{} runs (allowed: 1..={MAX_RUNS})",
                    sp.runs.len()
                )));
            }
            for r in &sp.runs {
                if let Some(s) = &r.stage {
                    check_name("stage", s)?;
                }
                check_run(sp.workload, r.size, r.pages, r.iters, &r.knobs)?;
            }
            Ok(())
        }
        Msg::Links(l) => {
            if l.rank >= MAX_RANKS || l.links.len() > MAX_LINKS {
                return Err(proto(format!(
                    "links of rank {}: {} entries (allowed: up to {MAX_LINKS})",
                    l.rank,
                    l.links.len()
                )));
            }
            for (i, k) in l.links.iter().enumerate() {
                check_name("NIC name", &k.name)?;
                if k.peer >= MAX_RANKS || k.nic as usize >= MAX_NICS {
                    return Err(proto(format!(
                        "link {i}: peer {} NIC {} out of range",
                        k.peer, k.nic
                    )));
                }
                if k.addr.is_empty() || k.addr.len() > MAX_ADDR {
                    return Err(proto(format!(
                        "link {i}: address of {} bytes (allowed: 1..={MAX_ADDR})",
                        k.addr.len()
                    )));
                }
                // Receiving: where the pages land; sending: where the receiver's delivery
                // acknowledgement lands (the pad past its pages).
                match &k.mr {
                    Some(m) if m.addr.checked_add(m.len).is_some() && m.len <= MAX_REGION => {}
                    _ => {
                        return Err(proto(format!(
                            "link {i}: every link carries one region that does not wrap, of \
                             at most {MAX_REGION} bytes"
                        )))
                    }
                }
            }
            Ok(())
        }
        Msg::RankDone(d) => {
            if d.rank >= MAX_RANKS || d.links.len() > MAX_LINKS || d.nics.len() > MAX_NICS {
                return Err(proto("rank result out of bounds"));
            }
            if d.cores.len() > MAX_NICS {
                return Err(proto("rank result lists too many cores"));
            }
            check_facts(d.facts.as_deref())?;
            for n in &d.nics {
                check_name("NIC name", n)?;
            }
            if !d.seconds.is_finite() || d.seconds < 0.0 {
                return Err(proto("rank result with a bad duration"));
            }
            for l in &d.links {
                if !l.seconds.is_finite() || l.seconds < 0.0 || l.nic as usize >= d.nics.len() {
                    return Err(proto("rank result with a bad link"));
                }
            }
            Ok(())
        }
        Msg::Abort { rank, message } => {
            if *rank >= MAX_RANKS || message.len() > MAX_TEXT {
                return Err(proto("abort message out of bounds"));
            }
            Ok(())
        }
    }
}

/// The numbers of one run (a server request, or a run of a rank job).
fn check_run(workload: Workload, size: u64, count: u64, iters: u64, knobs: &Knobs) -> Result<()> {
    if size == 0 {
        return Err(proto("request of size 0"));
    }
    if iters == 0 || iters > MAX_ITERS {
        return Err(proto(format!("request of {iters} iterations")));
    }
    if workload == Workload::Lat && iters > MAX_LAT_ITERS {
        return Err(proto(format!(
            "{iters} latency round trips (limit {MAX_LAT_ITERS})"
        )));
    }
    if count == 0 || count > MAX_ITERS {
        return Err(proto(format!("request count {count}")));
    }
    if knobs.batch == 0 || knobs.batch > MAX_BATCH {
        return Err(proto(format!(
            "batch {} (allowed: 1..={MAX_BATCH})",
            knobs.batch
        )));
    }
    if knobs.window > MAX_WINDOW {
        return Err(proto(format!(
            "window {} (allowed: 0..={MAX_WINDOW}, 0 the send queue's depth)",
            knobs.window
        )));
    }
    if knobs.warmup > MAX_WARMUP {
        return Err(proto(format!("warm-up {} over {MAX_WARMUP}", knobs.warmup)));
    }
    Ok(())
}

fn check_magic(magic: &str, version: u32) -> Result<()> {
    if magic != MAGIC {
        return Err(proto(format!(
            "peer is not rdma-bench (magic {:?})",
            magic.chars().take(32).collect::<String>()
        )));
    }
    if version != VERSION {
        return Err(proto(format!(
            "protocol version mismatch: peer speaks {version}, this side {VERSION}; run the same rdma-bench on both sides"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::fixtures::{hello, join, links, rank_done, request};
    use crate::proto::{decode_body, decode_frame, encode, Join, Links};
    use serde_json::Value;
    use transport_core::KeyBytes;

    #[test]
    fn rank_messages_bounds() {
        for m in [
            Msg::Join(join()),
            Msg::Links(links()),
            Msg::RankDone(rank_done()),
        ] {
            validate(&m).unwrap();
        }
        let bad_join = |f: fn(&mut Join)| {
            let mut j = join();
            f(&mut j);
            validate(&Msg::Join(j)).unwrap_err().to_string()
        };
        assert!(bad_join(|j| j.version = 9).contains("version mismatch"));
        assert!(bad_join(|j| j.world = 1).contains("rank"));
        assert!(bad_join(|j| j.rank = 4).contains("rank 4"));
        assert!(bad_join(|j| j.world = MAX_RANKS + 1).contains("rank"));
        assert!(bad_join(|j| j.spec.runs.clear()).contains("runs"));
        assert!(bad_join(|j| j.spec.runs[0].size = 0).contains("size 0"));
        assert!(bad_join(|j| j.spec.gpus = 0).contains("GPUs"));
        assert!(bad_join(|j| j.host = "h".repeat(MAX_NAME + 1)).contains("host"));
        let bad_links = |f: fn(&mut Links)| {
            let mut l = links();
            f(&mut l);
            validate(&Msg::Links(l)).is_err()
        };
        assert!(bad_links(|l| l.links[0].mr = None));
        assert!(bad_links(|l| l.links[1].mr = None));
        assert!(bad_links(|l| l.links[0].mr.as_mut().unwrap().len = u64::MAX));
        assert!(bad_links(
            |l| l.links[1].mr.as_mut().unwrap().addr = u64::MAX
        ));
        assert!(bad_links(|l| l.links[0].addr.clear()));
        assert!(bad_links(|l| l.links[0].peer = MAX_RANKS));
        let mut d = rank_done();
        d.links[0].nic = 2;
        assert!(
            validate(&Msg::RankDone(d)).is_err(),
            "NIC index past the names"
        );
        let mut d = rank_done();
        d.seconds = f64::NAN;
        assert!(validate(&Msg::RankDone(d)).is_err());
        assert!(validate(&Msg::Abort {
            rank: 0,
            message: "x".repeat(MAX_TEXT + 1)
        })
        .is_err());
    }

    /// A peer's run-record facts are bounded like every other field: each text, the GPU
    /// list, the settings; a message without them (a peer that sends none) is fine.
    #[test]
    fn facts_bounds() {
        use crate::proto::fixtures::facts;
        type Spoil = fn(&mut Facts);
        let bad: Vec<(&str, Spoil)> = vec![
            ("host name", |f| f.host = "x".repeat(MAX_NAME + 1)),
            ("kernel", |f| f.kernel = "x".repeat(MAX_NAME + 1)),
            ("commit", |f| f.commit = "x".repeat(MAX_NAME + 1)),
            ("instance", |f| f.instance = Some("x".repeat(MAX_NAME + 1))),
            ("GPU names", |f| {
                f.cuda.as_mut().unwrap().gpus = vec![String::new(); MAX_FACTS + 1]
            }),
            ("GPU name", |f| {
                f.cuda.as_mut().unwrap().gpus[0] = "x".repeat(MAX_NAME + 1)
            }),
            ("backend fact", |f| {
                f.backend.as_mut().unwrap().firmware = Some("x".repeat(MAX_NAME + 1))
            }),
            ("library path", |f| {
                f.backend.as_mut().unwrap().path = Some("x".repeat(MAX_PATH + 1))
            }),
            ("backend settings", |f| {
                let b = f.backend.as_mut().unwrap();
                b.settings = (0..=MAX_FACTS)
                    .map(|i| (i.to_string(), String::new()))
                    .collect();
            }),
            ("backend setting", |f| {
                let b = f.backend.as_mut().unwrap();
                b.settings.insert("k".into(), "x".repeat(MAX_NAME + 1));
            }),
        ];
        validate(&Msg::RankDone(rank_done())).unwrap();
        for (what, f) in &bad {
            let mut d = rank_done();
            f(d.facts.as_mut().unwrap());
            let e = validate(&Msg::RankDone(d)).unwrap_err().to_string();
            assert!(e.contains(what), "{what}: {e}");
            let w = Msg::Welcome(crate::proto::Welcome {
                magic: MAGIC.into(),
                version: VERSION,
                mem: crate::config::MemKind::Host,
                nics: hello().nics,
                facts: Some(Box::new({
                    let mut x = facts();
                    f(&mut x);
                    x
                })),
            });
            assert!(validate(&w).is_err(), "{what}");
        }
        // A result without facts (any run but the first, or a peer that sends none) reads as
        // `None`.
        let mut v = serde_json::to_value(Msg::RankDone(rank_done())).unwrap();
        v.as_object_mut().unwrap().remove("facts").unwrap();
        match serde_json::from_value::<Msg>(v).unwrap() {
            Msg::RankDone(d) => assert!(d.facts.is_none()),
            m => panic!("{}", m.kind()),
        }
    }

    /// A hello may place the regions anywhere in a page, host or GPU memory, and nowhere else.
    #[test]
    fn a_hello_offsets_regions_inside_one_page() {
        use crate::config::MemKind;
        let with = |off: u32, mem: MemKind| {
            let mut h = hello();
            h.buf_offset = off;
            h.mem = mem;
            validate(&Msg::Hello(h))
        };
        with(0, MemKind::Cuda).unwrap();
        with(512, MemKind::Cuda).unwrap();
        with(4095, MemKind::Host).unwrap();
        for (off, mem) in [
            (4096, MemKind::Host),
            (u32::MAX, MemKind::Host),
            (4096, MemKind::Cuda),
        ] {
            let e = with(off, mem).unwrap_err().to_string();
            assert!(e.contains("bytes into a page"), "{off} {mem}: {e}");
        }
        // A peer that never places its regions sends no field; it reads as 0.
        let v = serde_json::to_value(Msg::Hello(hello())).unwrap();
        assert!(v.get("buf_offset").is_none(), "{v}");
    }

    /// A region's key is bytes of any length a backend makes, up to `KeyBytes::MAX_LEN`; a
    /// key outside that (empty, too long, not hex, the number an older build sent) does not
    /// decode, so the message is refused with words that name the key, before any backend
    /// reads it.
    #[test]
    fn remote_keys_are_bounded() {
        let mut h = hello();
        let max = KeyBytes::new(vec![0xee; KeyBytes::MAX_LEN]).unwrap();
        for m in h.nics.iter_mut().flat_map(|n| n.mrs.iter_mut()) {
            m.key = max.clone();
        }
        let f = encode(&Msg::Hello(h.clone())).unwrap();
        assert_eq!(decode_frame(&f).unwrap(), Msg::Hello(h));
        let too_long = "ab".repeat(KeyBytes::MAX_LEN + 1);
        let cases = [
            (Value::from(""), "0 hex digits"),
            (Value::from(too_long), "2050 hex digits"),
            (Value::from("abc"), "3 hex digits"),
            (Value::from("zz"), "not hex"),
            (Value::from(7), "older build"),
            (Value::Null, "hex string"),
        ];
        let hello = serde_json::to_value(Msg::Hello(hello())).unwrap();
        let links = serde_json::to_value(Msg::Links(links())).unwrap();
        for (bad, says) in cases {
            let mut v = hello.clone();
            v["nics"][0]["mrs"][1]["key"] = bad.clone();
            let mut w = links.clone();
            w["links"][1]["mr"]["key"] = bad.clone();
            for m in [v, w] {
                let e = decode_body(&serde_json::to_vec(&m).unwrap())
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("remote key") && e.contains(says), "{bad}: {e}");
            }
        }
    }

    /// A request's source shifts are bounded by its page size (a cache line per step), not by
    /// a fixed number: 16 MiB pages shift 262144 times (the GPU host's client/server run).
    #[test]
    fn source_shifts_follow_the_page_size() {
        let mut r = request();
        r.size = 16 << 20;
        r.shifts = (16 << 20) / 64;
        validate(&Msg::Request(r.clone())).unwrap();
        r.shifts += 1;
        let e = validate(&Msg::Request(r.clone())).unwrap_err().to_string();
        assert!(e.contains("262145 source shifts"), "{e}");
        r.shifts = 0;
        assert!(validate(&Msg::Request(r)).is_err());
    }

    #[test]
    fn bounds() {
        let mut h = hello();
        h.version = VERSION + 1;
        assert!(validate(&Msg::Hello(h))
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut h = hello();
        h.nics_per_gpu = 3;
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.gpus = u32::MAX;
        h.nics_per_gpu = u32::MAX;
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[0].addr = vec![0; MAX_ADDR + 1];
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[1].mrs.pop();
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[1].mrs[0].addr = u64::MAX;
        assert!(validate(&Msg::Hello(h)).is_err());
        // A region that does not wrap but would size a buffer past any memory (the server
        // allocates the client's length, as far as its --max-mem allows).
        for len in [MAX_REGION + 1, 1 << 63] {
            let mut h = hello();
            (h.nics[1].mrs[0].addr, h.nics[1].mrs[0].len) = (0, len);
            let e = validate(&Msg::Hello(h)).unwrap_err().to_string();
            assert!(e.contains("limit"), "{len}: {e}");
            let mut l = links();
            if let Some(m) = l.links[0].mr.as_mut() {
                (m.addr, m.len) = (0, len);
            }
            assert!(validate(&Msg::Links(l)).is_err(), "{len}");
        }
        let mut h = hello();
        (h.nics[1].mrs[0].addr, h.nics[1].mrs[0].len) = (0, MAX_REGION);
        validate(&Msg::Hello(h)).unwrap();
        // A gpu-write step's result: what it claims is bounded by its region and count.
        let done = |arrivals, checked| {
            validate(&Msg::GpuStepDone(crate::proto::GpuStepDone {
                arrivals,
                checked,
                ..Default::default()
            }))
        };
        done(MAX_ITERS, MAX_REGION).unwrap();
        assert!(done(0, u64::MAX).is_err());
        assert!(done(u64::MAX, 0).is_err());
        let mut r = request();
        r.size = 0;
        assert!(validate(&Msg::Request(r)).is_err());
        let mut r = request();
        r.knobs.batch = 0;
        assert!(validate(&Msg::Request(r)).is_err());
        let mut r = request();
        r.knobs.window = MAX_WINDOW + 1;
        assert!(validate(&Msg::Request(r)).is_err());
        let mut r = request();
        r.knobs.window = MAX_WINDOW;
        assert!(validate(&Msg::Request(r)).is_ok());
        let mut r = request();
        r.workload = Workload::Lat;
        r.iters = MAX_LAT_ITERS + 1;
        assert!(validate(&Msg::Request(r)).is_err());
        for (k, count) in [(0, 16), (MAX_IMM_EVERY + 1, 1), (MAX_IMM_EVERY, 1 << 20)] {
            let mut r = request();
            (r.imm_every, r.count) = (k, count);
            assert!(
                validate(&Msg::Request(r)).is_err(),
                "imm_every {k} x {count}"
            );
        }
        // A request from a peer that predates --imm-every means one pass per immediate.
        let mut v = serde_json::to_value(Msg::Request(request())).unwrap();
        v.as_object_mut().unwrap().remove("imm_every").unwrap();
        match serde_json::from_value::<Msg>(v).unwrap() {
            Msg::Request(r) => assert_eq!(r.imm_every, 1),
            m => panic!("{}", m.kind()),
        }
        assert!(decode_frame(&[0, 0, 0, 0]).is_err());
        assert!(decode_frame(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_frame(&[0, 0]).is_err());
    }
}
