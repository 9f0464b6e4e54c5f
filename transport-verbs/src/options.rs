//! The endpoint's `NicDesc::options`: numbers with a range, aliases of one setting, and the
//! forced GID index (the crate docs list every option, `about.rs` their keys).

use transport_core::{Error, NicDesc, Result};

/// The value of option `key`, else `default`; checked against `max`.
pub(crate) fn opt<T>(nic: &NicDesc, key: &str, default: T, max: T) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Default,
{
    Ok(opt_any(nic, &[key], max)?.unwrap_or(default))
}

/// The value of the first of `keys` given (aliases of one option), checked against `max`;
/// two of them with different values are refused.
pub(crate) fn opt_any<T>(nic: &NicDesc, keys: &[&str], max: T) -> Result<Option<T>>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Default,
{
    let mut found: Option<(&str, &String, T)> = None;
    for &key in keys {
        let (Some(x), Some(v)) = (
            nic.number_option("verbs", key, T::default()..=max)?,
            nic.options.get(key),
        ) else {
            continue;
        };
        if let Some((k0, v0, x0)) = found {
            if x0 != x {
                return Err(Error::InvalidArgument(format!(
                    "verbs options {k0}={v0} and {key}={v} disagree: they are one setting, give \
                     one of them"
                )));
            }
        }
        found = found.or(Some((key, v, x)));
    }
    Ok(found.map(|f| f.2))
}

/// The local GID index asked for: option `gid`.
pub(crate) fn forced_gid(nic: &NicDesc) -> Result<Option<u8>> {
    opt_any(nic, &["gid"], 255u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(opts: &[(&str, &str)]) -> NicDesc {
        opts.iter()
            .fold(NicDesc::default(), |n, (k, v)| n.with_option(*k, *v))
    }

    fn tc(opts: &[(&str, &str)]) -> Result<Option<u8>> {
        opt_any(&nic(opts), &["tc", "traffic_class"], 255u8)
    }

    /// `tc=N` sets the traffic class, `traffic_class=N` still does, 0..=255 only, and the two
    /// disagreeing is an error. Before: only `traffic_class` was read, so `--nic-opt tc=106`
    /// was silently ignored and every QP ran at class 0; on a RoCE fabric whose lossless
    /// (PFC) class is DSCP 26 the traffic then went into the lossy default queue.
    #[test]
    fn traffic_class_option() {
        assert_eq!(tc(&[]).unwrap(), None);
        assert_eq!(tc(&[("tc", "106")]).unwrap(), Some(106));
        assert_eq!(tc(&[("traffic_class", "32")]).unwrap(), Some(32));
        assert_eq!(tc(&[("tc", "255")]).unwrap(), Some(255));
        assert_eq!(tc(&[("tc", "7"), ("traffic_class", "7")]).unwrap(), Some(7));
        for bad in ["256", "-1", "0x10", "", "dscp26"] {
            match tc(&[("tc", bad)]) {
                Err(Error::InvalidArgument(m)) => {
                    assert!(m.contains("tc=") && m.contains("255"), "{m}")
                }
                other => panic!("tc={bad}: {other:?}"),
            }
        }
        match tc(&[("tc", "8"), ("traffic_class", "16")]) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("disagree"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// `gid=N` forces the GID index, 0..=255.
    #[test]
    fn gid_option() {
        assert_eq!(forced_gid(&nic(&[])).unwrap(), None);
        assert_eq!(forced_gid(&nic(&[("gid", "3")])).unwrap(), Some(3));
        assert!(matches!(
            forced_gid(&nic(&[("gid", "256")])),
            Err(Error::InvalidArgument(_))
        ));
    }
}
