//! Parsing and printing of sizes and GPU lists as users type them.

use std::fmt;
use std::str::FromStr;

/// A byte count as typed on the command line: `64`, `4K`, `64KiB`, `1M`, `2G` (binary units).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        if num.is_empty() {
            return Err(format!("`{s}` is not a size (e.g. 64, 4K, 1M)"));
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("`{s}` is not a size (e.g. 64, 4K, 1M)"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            _ => return Err(format!("`{s}`: unknown unit `{unit}` (use K, M or G)")),
        };
        n.checked_mul(1u64 << shift)
            .map(Size)
            .ok_or_else(|| format!("`{s}` is too large"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human_bytes(self.0))
    }
}

/// `4096` -> `4K`, `1048576` -> `1M`, `1000` -> `1000`: exact binary units only.
pub fn human_bytes(n: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// The most GPUs (or logical NIC groups) one run may name.
pub const MAX_GPUS: usize = 64;

/// A GPU list as typed: `0`, `0,1,3`, `0-7`, `0-3,6`. Ordered, without duplicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuList(pub Vec<usize>);

impl FromStr for GpuList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (parse_index(a, s)?, parse_index(b, s)?),
                None => {
                    let i = parse_index(part, s)?;
                    (i, i)
                }
            };
            if lo > hi {
                return Err(format!("`{part}` in `{s}`: range runs backwards"));
            }
            if hi - lo >= MAX_GPUS {
                return Err(format!("`{part}`: more than {MAX_GPUS} GPUs"));
            }
            for i in lo..=hi {
                if out.contains(&i) {
                    return Err(format!("GPU {i} named twice in `{s}`"));
                }
                out.push(i);
                if out.len() > MAX_GPUS {
                    return Err(format!("`{s}`: more than {MAX_GPUS} GPUs"));
                }
            }
        }
        if out.is_empty() {
            return Err("the GPU list is empty".into());
        }
        Ok(GpuList(out))
    }
}

fn parse_index(t: &str, whole: &str) -> Result<usize, String> {
    t.trim()
        .parse::<usize>()
        .map_err(|_| format!("`{t}` in `{whole}` is not a GPU index"))
}

impl fmt::Display for GpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.0.iter().map(|i| i.to_string()).collect();
        f.write_str(&v.join(","))
    }
}

/// Where threads ran, in words: "not pinned", or "pinned to cores 0-3, 8".
pub fn pinning(cores: &[u32]) -> String {
    if cores.is_empty() {
        return "not pinned".into();
    }
    let mut v = cores.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    format!(
        "pinned to core{} {}",
        if v.len() > 1 { "s" } else { "" },
        parts.join(", ")
    )
}

/// A provider and the NIC it opened, each named once: "efa rdmap16s27", but "shm" where the
/// provider has no device of its own (its NIC is named after it).
pub fn provider_nic(provider: &str, nic: &str) -> String {
    if nic.is_empty() || nic == provider {
        provider.to_string()
    } else {
        format!("{provider} {nic}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!("64".parse::<Size>(), Ok(Size(64)));
        assert_eq!("4K".parse::<Size>(), Ok(Size(4096)));
        assert_eq!("64KiB".parse::<Size>(), Ok(Size(65536)));
        assert_eq!("1m".parse::<Size>(), Ok(Size(1 << 20)));
        assert_eq!("2G".parse::<Size>(), Ok(Size(2 << 30)));
        assert!("".parse::<Size>().is_err());
        assert!("K".parse::<Size>().is_err());
        assert!("4X".parse::<Size>().is_err());
        assert!("99999999999999999999G".parse::<Size>().is_err());
        assert!("17179869184G".parse::<Size>().is_err());
        assert_eq!(human_bytes(65536), "64K");
        assert_eq!(human_bytes(1000), "1000");
    }

    #[test]
    fn gpu_lists() {
        assert_eq!("0".parse::<GpuList>(), Ok(GpuList(vec![0])));
        assert_eq!("0-3,6".parse::<GpuList>(), Ok(GpuList(vec![0, 1, 2, 3, 6])));
        assert!("3-1".parse::<GpuList>().is_err());
        assert!("1,1".parse::<GpuList>().is_err());
        assert!("a".parse::<GpuList>().is_err());
        assert!("0-100000000000".parse::<GpuList>().is_err());
        assert!("".parse::<GpuList>().is_err());
    }
}
