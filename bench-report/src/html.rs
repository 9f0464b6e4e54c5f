//! `--report FILE.html`: one self-contained page (no script, no external resource) with the
//! result tables, the gate, the bandwidth plot and the topology with its GPU-to-NIC diagram,
//! and the doctor's verdict on the node.

use std::fmt::Write as _;

use crate::gate::GateResult;
use bench_core::record::Record;
use bench_core::report::RunReport;
use bench_core::units::human_bytes;
use bench_doctor as doctor;

/// Everything the page shows.
pub struct Page<'a> {
    pub command: String,
    /// (label, run) per row: the provider or pair the run belongs to.
    pub runs: Vec<(String, &'a RunReport)>,
    /// Pairs that failed (compare).
    pub failures: Vec<(String, String)>,
    pub gate: Option<&'a GateResult>,
    pub plot_svg: Option<String>,
    pub topology: Option<(String, topo::Topology)>,
    pub topology_svg: Option<String>,
    pub doctor: Option<doctor::Report>,
    /// What ran, where and on what.
    pub record: Option<&'a Record>,
}

/// Escape text for HTML.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn opt(v: Option<f64>, p: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.p$}"))
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;font-size:13px;margin:8px 0}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}\
td.l,th.l{text-align:left}tr.fail td{background:#fde0e0}tr.warn td{background:#fff3cd}\
tr.ok td.s{color:#1a7f37}.pass{color:#1a7f37;font-weight:bold}.bad{color:#c62828;font-weight:bold}\
code{background:#f4f4f4;padding:1px 4px}.fig{overflow-x:auto}.meta{color:#555;font-size:13px}";

/// The page.
pub fn render(p: &Page<'_>) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <link rel=\"icon\" href=\"data:,\"><title>rdma-bench report</title>\
         <style>{STYLE}</style></head><body>\n<h1>rdma-bench report</h1>\n\
         <p class=\"meta\">command: <code>{}</code><br>rdma-bench {}</p>\n",
        esc(&p.command),
        env!("CARGO_PKG_VERSION")
    );
    if let Some(r) = p.record {
        record(&mut o, r);
    }
    if let Some(g) = p.gate {
        let _ = write!(
            o,
            "<h2>Gate</h2>\n<p>{}: <span class=\"{}\">{}</span></p>\n<table><tr>\
             <th class=\"l\">run</th><th class=\"l\">what</th><th class=\"l\">NIC</th><th>GPU</th>\
             <th>Gbit/s</th><th>line</th><th>need</th><th>% line</th><th class=\"l\">result</th></tr>\n",
            esc(&g.gate),
            if g.pass { "pass" } else { "bad" },
            esc(&if g.pass { "PASS".into() } else { g.summary() })
        );
        for r in &g.rows {
            let what = match (r.scope, r.index) {
                ("nic", Some(i)) => format!("nic {i}"),
                ("gpu", _) => format!("gpu {}", r.gpu.unwrap_or(0)),
                (s, _) => s.to_string(),
            };
            let _ = writeln!(
                o,
                "<tr class=\"{}\"><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td>\
                 <td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l s\">{}{}</td></tr>",
                if r.pass { "ok" } else { "fail" },
                esc(&r.run),
                esc(&what),
                esc(&r.nic),
                r.gpu.map_or("-".into(), |g| g.to_string()),
                r.gbps,
                opt(r.line_gbps, 1),
                opt(r.need_gbps, 1),
                opt(r.pct, 1),
                if r.pass { "ok" } else { "FAIL" },
                r.note.as_deref().map(|n| format!(" ({})", esc(n))).unwrap_or_default()
            );
        }
        o.push_str("</table>\n");
        for n in &g.notes {
            let _ = writeln!(o, "<p class=\"meta\">note: {}</p>", esc(n));
        }
    }
    o.push_str(
        "<h2>Results</h2>\n<table><tr><th class=\"l\">run</th><th class=\"l\">workload</th>\
        <th class=\"l\">stage</th><th>size</th><th>GPUs x NICs</th><th>Gbit/s</th><th>% line</th>\
        <th>Mops</th><th>p50 us</th><th class=\"l\">verified</th></tr>\n",
    );
    for (label, r) in &p.runs {
        let _ = writeln!(
            o,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td>\
             <td>{} x {}</td><td>{:.2}</td><td>{}</td><td>{:.3}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(label),
            esc(&r.workload),
            esc(r.stage.as_deref().unwrap_or("-")),
            human_bytes(r.size),
            r.gpus.len(),
            r.nics / r.gpus.len().max(1),
            r.gbps,
            opt(r.pct_line_rate, 1),
            r.mops,
            opt(r.p50_us, 2),
            if r.verified { "yes" } else { "no" }
        );
    }
    for (label, e) in &p.failures {
        let _ = writeln!(
            o,
            "<tr class=\"fail\"><td class=\"l\">{}</td><td class=\"l\" colspan=\"9\">failed: {}</td></tr>",
            esc(label),
            esc(e)
        );
    }
    o.push_str("</table>\n");
    if let Some((_, last)) = p.runs.last() {
        if !last.per_nic.is_empty() {
            let _ = write!(
                o,
                "<h3>Per NIC ({} {})</h3>\n<table><tr><th>NIC</th><th>GPU</th><th class=\"l\">name</th>\
                 <th>bytes</th><th>seconds</th><th>Gbit/s</th><th>link</th><th>% line</th></tr>\n",
                esc(&last.workload),
                esc(&last.stage.clone().unwrap_or_else(|| human_bytes(last.size)))
            );
            for n in &last.per_nic {
                let _ = writeln!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.4}</td>\
                     <td>{:.2}</td><td>{}</td><td>{}</td></tr>",
                    n.index,
                    n.gpu,
                    esc(&n.nic),
                    n.bytes,
                    n.seconds,
                    n.gbps,
                    opt(n.link_gbps, 0),
                    opt(n.pct_line_rate, 1)
                );
            }
            o.push_str("</table>\n");
        }
    }
    if let Some(svg) = &p.plot_svg {
        let _ = write!(o, "<h2>Bandwidth</h2>\n<div class=\"fig\">{svg}</div>\n");
    }
    if let Some((source, t)) = &p.topology {
        let _ = write!(
            o,
            "<h2>Topology</h2>\n<p class=\"meta\">{}</p>\n",
            esc(source)
        );
        if let Some(svg) = &p.topology_svg {
            let _ = writeln!(o, "<div class=\"fig\">{svg}</div>");
        }
        if t.gpus().is_empty() {
            o.push_str("<table><tr><th>NUMA</th><th class=\"l\">NICs</th><th>cores</th></tr>\n");
            for g in t.numa_groups() {
                let _ = writeln!(
                    o,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td></tr>",
                    g.numa.map_or("-".into(), |n| n.to_string()),
                    esc(&g
                        .nics
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")),
                    g.cores.len()
                );
            }
        } else {
            o.push_str(
                "<table><tr><th>GPU</th><th class=\"l\">bus id</th><th>NUMA</th>\
                <th class=\"l\">NICs</th><th>cores</th></tr>\n",
            );
            for g in t.gpus() {
                let _ = writeln!(
                    o,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td></tr>",
                    g.index,
                    esc(&g.pci),
                    g.numa.map_or("-".into(), |n| n.to_string()),
                    esc(&g.nic_names().join(", ")),
                    g.cores.len()
                );
            }
        }
        o.push_str("</table>\n");
    }
    if let Some(d) = &p.doctor {
        let _ = write!(
            o,
            "<h2>Node check (rdma-bench doctor)</h2>\n<p>exit {}</p>\n<table><tr><th class=\"l\">status</th>\
             <th class=\"l\">check</th><th class=\"l\">finding</th><th class=\"l\">fix</th></tr>\n",
            d.exit_code
        );
        for c in &d.checks {
            let cls = match c.status {
                doctor::Status::Fail => "fail",
                doctor::Status::Warn => "warn",
                _ => "ok",
            };
            let _ = writeln!(
                o,
                "<tr class=\"{cls}\"><td class=\"l s\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                esc(&format!("{:?}", c.status).to_lowercase()),
                esc(&c.id),
                esc(&c.summary),
                esc(c.fix.as_deref().unwrap_or(""))
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("</body></html>\n");
    o
}

/// The run record: a row per fact, this side's and the peer's beside it; each compare pair's
/// backends; each rank whose facts differ from rank 0's.
fn record(o: &mut String, r: &Record) {
    let peer = r.peer.is_some();
    let _ = write!(
        o,
        "<h2>Run record</h2>\n<table id=\"record\"><tr><th class=\"l\">fact</th><th class=\"l\">{}</th>{}</tr>\n",
        if peer { "this side" } else { "value" },
        if peer { "<th class=\"l\">peer</th>" } else { "" }
    );
    for (k, v, p) in r.rows() {
        let _ = write!(
            o,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td>",
            esc(&k),
            esc(&v)
        );
        if peer {
            let _ = write!(
                o,
                "<td class=\"l\">{}</td>",
                esc(p.as_deref().unwrap_or("-"))
            );
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</table>\n");
    let lib = |b: &transport_core::Runtime| {
        format!(
            "{} {} {} {}{}",
            b.backend,
            b.library,
            b.version.as_deref().unwrap_or("-"),
            b.provider.as_deref().unwrap_or(&b.device),
            b.firmware
                .as_deref()
                .map(|f| format!(", firmware {f}"))
                .unwrap_or_default()
        )
    };
    if !r.pairs.is_empty() {
        o.push_str(
            "<table><tr><th class=\"l\">pair</th><th class=\"l\">client side</th>\
             <th class=\"l\">server side</th></tr>\n",
        );
        for p in &r.pairs {
            let _ = writeln!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                esc(&p.pair),
                esc(&lib(&p.backend)),
                esc(&lib(&p.peer))
            );
        }
        o.push_str("</table>\n");
    }
    if !r.ranks.is_empty() {
        o.push_str(
            "<table><tr><th>rank</th><th class=\"l\">host</th><th class=\"l\">rdma-bench</th>\
             <th class=\"l\">kernel</th><th class=\"l\">backend</th></tr>\n",
        );
        for k in &r.ranks {
            let f = &k.facts;
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{} ({})</td>\
                 <td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                k.rank,
                esc(&f.host),
                esc(&f.rdma_bench),
                esc(&f.commit),
                esc(&f.kernel),
                esc(&f.backend.as_ref().map(lib).unwrap_or_else(|| "-".into()))
            );
        }
        o.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    /// The record's facts show, the peer's beside this side's, each compare pair's and each
    /// differing rank's backends under them, all escaped.
    #[test]
    fn the_run_record_shows_every_side() {
        use bench_core::record::{Facts, PairRecord, RankFacts, Record};
        use transport_core::Runtime;
        let rt = |dev: &str| Runtime {
            backend: "efa".into(),
            library: "libfabric".into(),
            version: Some("2.6.0".into()),
            provider: Some("efa".into()),
            device: dev.into(),
            firmware: Some("<fw 1.2>".into()),
            ..Runtime::default()
        };
        let mut me = Facts::here("0.1.0", "abc123");
        me.host = "node<a>".into();
        let mut r = Record::now(me.with_backend(Some(rt("rdmap0"))));
        let mut other = me.with_backend(Some(rt("rdmap1")));
        other.host = "node-b".into();
        r.peer = Some(other.clone());
        r.pairs.push(PairRecord {
            pair: "efa:efa".into(),
            backend: rt("rdmap0"),
            peer: rt("rdmap1"),
        });
        r.ranks.push(RankFacts {
            rank: 3,
            facts: other,
        });
        let p = Page {
            command: "rdma-bench".into(),
            runs: vec![],
            failures: vec![],
            gate: None,
            plot_svg: None,
            topology: None,
            topology_svg: None,
            doctor: None,
            record: Some(&r),
        };
        let h = render(&p);
        for want in [
            "<h2>Run record</h2>",
            "<th class=\"l\">peer</th>",
            "<td class=\"l\">node&lt;a&gt;</td><td class=\"l\">node-b</td>",
            "0.1.0 (abc123)",
            "libfabric 2.6.0",
            "&lt;fw 1.2&gt;",
            "<td class=\"l\">efa:efa</td>",
            "<td>3</td><td class=\"l\">node-b</td>",
        ] {
            assert!(h.contains(want), "{want}:\n{h}");
        }
    }

    #[test]
    fn empty_page_is_well_formed() {
        let p = Page {
            command: "rdma-bench loopback <x>".into(),
            runs: vec![],
            failures: vec![],
            gate: None,
            plot_svg: None,
            topology: None,
            topology_svg: None,
            doctor: None,
            record: None,
        };
        let h = render(&p);
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(h.contains("rdma-bench loopback &lt;x&gt;"));
        assert!(h.trim_end().ends_with("</html>"));
    }
}
