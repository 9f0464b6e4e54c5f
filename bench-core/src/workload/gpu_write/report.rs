//! What a run measured, and its tables as printed.

use crate::report::median;

/// One row: the proxy path's figure beside the host's from the same run; with `--rounds`,
/// each path's median over the rounds, and every round's pair.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub size: usize,
    pub proxy: f64,
    pub host: f64,
    /// With several rounds: each round's `[proxy, host]`, in the order they ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<[f64; 2]>,
}

impl Row {
    /// A row of a size's rounds: `proxy[i]` and `host[i]` ran in the same round.
    pub fn of_rounds(size: usize, proxy: &[f64], host: &[f64]) -> Self {
        let rounds = if proxy.len() > 1 {
            proxy.iter().zip(host).map(|(&p, &h)| [p, h]).collect()
        } else {
            Vec::new()
        };
        Row {
            size,
            proxy: median(&mut proxy.to_vec()),
            host: median(&mut host.to_vec()),
            rounds,
        }
    }

    /// `cmp(proxy, host)` of the row: with rounds, the median of each round's (a round's two
    /// paths ran next to each other, so the machine's drift between rounds cancels), with the
    /// lowest and highest round's beside it.
    pub fn compare(&self, cmp: impl Fn(f64, f64) -> f64) -> (f64, Option<(f64, f64)>) {
        if self.rounds.is_empty() {
            return (cmp(self.proxy, self.host), None);
        }
        let mut each: Vec<f64> = self.rounds.iter().map(|&[p, h]| cmp(p, h)).collect();
        let m = median(&mut each);
        (m, Some((each[0], each[each.len() - 1])))
    }
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GpuWriteReport {
    pub producer: &'static str,
    /// How the latency rounds' producer orders a command ([`super::Producer::publish`]).
    pub publish: &'static str,
    /// Commands per second through the ring alone (millions).
    pub ring_mcmds: f64,
    /// Latency, half the round trip of a ping-pong, microseconds (mean of `lat_rounds`).
    pub lat_us: Vec<Row>,
    /// The same rounds' median round trip, halved, microseconds (perftest's "typical").
    pub lat_p50_us: Vec<Row>,
    /// Timed round trips per latency row.
    pub lat_rounds: u64,
    /// Times each size's two paths ran, alternating which went first (`--rounds`).
    pub rounds: u32,
    /// Who answered the proxy path's WRITEs at the server: `host` (a thread on its endpoint,
    /// as for the host path) or `ring` (its proxy and a CPU echo through its ring).
    pub server_echo: &'static str,
    /// Bandwidth, Gbit/s, to the server's answer after its last counted immediate.
    pub bw_gbps: Vec<Row>,
    pub verified: bool,
    /// Landed bytes the server compared with the client's pattern, over every step.
    pub server_checked: u64,
    /// Where the proxy threads ran, in words.
    pub pinning: String,
}

/// One of the report's tables: a title, then size, proxy, host and `last`, `cmp(proxy, host)`
/// ([`Row::compare`]: with rounds, the median of the rounds' own and their range).
pub(super) fn table(
    s: &mut String,
    title: &str,
    last: &str,
    rows: &[Row],
    cmp: impl Fn(f64, f64) -> f64,
    sign: bool,
) {
    *s += &format!(
        "{title}\n{:>10} {:>10} {:>10} {last:>8}\n",
        "size", "proxy", "host"
    );
    let f = |x: f64| {
        if sign {
            format!("{x:+.2}")
        } else {
            format!("{x:.2}")
        }
    };
    for r in rows {
        let (c, range) = r.compare(&cmp);
        *s += &format!(
            "{:>10} {:>10.2} {:>10.2} {:>8}{}\n",
            crate::units::human_bytes(r.size as u64),
            r.proxy,
            r.host,
            f(c),
            range.map_or(String::new(), |(lo, hi)| format!(" ({}..{})", f(lo), f(hi)))
        );
    }
}

impl GpuWriteReport {
    /// The table, for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "gpu-write (producer {}, latency rounds published {}): ring alone {:.2} M commands/s (commands the producer makes; one proxy thread consuming into nothing)\n",
            self.producer, self.publish, self.ring_mcmds
        );
        if self.rounds > 1 {
            s += &format!(
                "{} rounds of each size, the two paths side by side in each (alternating which \
                 went first): each path's median round; diff and ratio: the median of the \
                 rounds' own, the lowest and highest in brackets\n",
                self.rounds
            );
        }
        table(
            &mut s,
            &format!(
                "latency, half the round trip (WRITE+imm answered by one of the same size once \
                 counted; mean of {} rounds, us; the server answers {}):",
                self.lat_rounds,
                if self.server_echo == "ring" {
                    "the proxy path through its ring and proxy, the host path from a thread"
                } else {
                    "both paths from a thread on its endpoint"
                }
            ),
            "diff",
            &self.lat_us,
            |p, h| p - h,
            true,
        );
        table(
            &mut s,
            "latency, the same rounds' median round trip halved (us; each round by the \
             producer's clock, a kernel's: the SM's cycle counter in ns):",
            "diff",
            &self.lat_p50_us,
            |p, h| p - h,
            true,
        );
        table(
            &mut s,
            "bandwidth to delivery (Gbit/s; the clock stops at the server's answer to the last \
             counted immediate: it includes one return WRITE):",
            "ratio",
            &self.bw_gbps,
            |p, h| p / h,
            false,
        );
        s += &format!("proxy threads: {}\n", self.pinning);
        // The same words as every other workload's output ("every byte verified").
        s += &if self.verified {
            format!(
                "every byte verified (the server checked {} landed bytes, the client every answer)\n",
                self.server_checked
            )
        } else {
            "not verified (--no-verify)\n".to_string()
        };
        s
    }
}
