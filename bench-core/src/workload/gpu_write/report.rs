//! What a run measured, and its tables as printed.

/// One row: the proxy path's figure beside the host's from the same run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub size: usize,
    pub proxy: f64,
    pub host: f64,
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

/// One of the report's tables: a title, then size, proxy, host and `last` (what compares them).
pub(super) fn table(
    s: &mut String,
    title: &str,
    last: &str,
    rows: &[Row],
    cmp: impl Fn(&Row) -> String,
) {
    *s += &format!(
        "{title}\n{:>10} {:>10} {:>10} {last:>8}\n",
        "size", "proxy", "host"
    );
    for r in rows {
        *s += &format!(
            "{:>10} {:>10.2} {:>10.2} {}\n",
            crate::units::human_bytes(r.size as u64),
            r.proxy,
            r.host,
            cmp(r)
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
            |r| format!("{:>+8.2}", r.proxy - r.host),
        );
        table(
            &mut s,
            "latency, the same rounds' median round trip halved (us; each round by the \
             producer's clock, a kernel's: the SM's cycle counter in ns):",
            "diff",
            &self.lat_p50_us,
            |r| format!("{:>+8.2}", r.proxy - r.host),
        );
        table(
            &mut s,
            "bandwidth to delivery (Gbit/s; the clock stops at the server's answer to the last \
             counted immediate: it includes one return WRITE):",
            "ratio",
            &self.bw_gbps,
            |r| format!("{:>8.2}", r.proxy / r.host),
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
