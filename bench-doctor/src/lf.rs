//! What the libfabric this process loaded offers: version, providers, FI_HMEM, CUDA.
//!
//! The doctor names no backend: the libfabric backend's probe (`BackendInfo::probe`, which
//! the program hands over in [`crate::DoctorCfg::probes`]) reports on its library, and this
//! is the doctor's view of that report, for its libfabric checks.

use serde::Serialize;
use transport_core::{Finding, Probe};

/// The libfabric facts doctor judges.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Libfabric {
    /// The API version, `major.minor`.
    pub version: String,
    pub providers: Vec<String>,
    /// The provider asked for `FI_HMEM` (`efa` where present, else `shm`), and whether an
    /// endpoint with `FI_HMEM` opened on it.
    pub hmem_provider: Option<String>,
    pub hmem: bool,
    /// The library file mapped into this process.
    pub library: Option<String>,
    /// Whether that file names `libcuda.so`; `None` where it could not be read.
    pub cuda: Option<bool>,
    /// The backend's own findings, listed beside the doctor's libfabric checks.
    pub findings: Vec<Finding>,
}

impl Libfabric {
    /// The doctor's view of a probe of libfabric; `None` for another library's.
    pub fn from_probe(p: &Probe) -> Option<Libfabric> {
        if p.library != "libfabric" {
            return None;
        }
        // `2.6.0`, `2.1.0amzn3.0`: the API version is the release's first two numbers.
        let mut parts = p
            .version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty());
        let version = match (parts.next(), parts.next()) {
            (Some(a), Some(b)) => format!("{a}.{b}"),
            _ => p.version.clone(),
        };
        Some(Libfabric {
            version,
            providers: p.offers.clone(),
            hmem_provider: p.gpu.as_ref().map(|g| g.0.clone()),
            hmem: p.gpu.as_ref().is_some_and(|g| g.1),
            library: p.path.clone(),
            cuda: p.cuda_in_library,
            findings: p.findings.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_of_libfabric_reads_as_its_api_version() {
        let p = Probe {
            library: "libfabric".into(),
            version: "2.1.0amzn3.0".into(),
            path: Some("/opt/amazon/efa/lib/libfabric.so.1".into()),
            offers: vec!["efa".into(), "shm".into()],
            gpu: Some(("efa".into(), true)),
            cuda_in_library: Some(true),
            findings: Vec::new(),
        };
        let l = Libfabric::from_probe(&p).unwrap();
        assert_eq!(l.version, "2.1");
        assert_eq!(
            (l.hmem_provider.as_deref(), l.hmem, l.cuda),
            (Some("efa"), true, Some(true))
        );
        let other = Probe {
            library: "ucx".into(),
            ..p
        };
        assert!(Libfabric::from_probe(&other).is_none());
    }
}
