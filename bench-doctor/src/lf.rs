//! What the libfabric this process loaded offers: version, providers, FI_HMEM, CUDA.
//!
//! Only through transport-efa's public API: `Endpoint::libfabric_version()`,
//! `available_providers()`, and an endpoint opened with `hmem=on` (it opens only where the
//! provider advertises `FI_HMEM`). Whether the library was built with CUDA is read from the
//! library file itself: a CUDA-enabled libfabric names `libcuda.so` (to load or link it).

use serde::Serialize;

/// The libfabric facts doctor judges.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Libfabric {
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
}

/// The mapped libfabric, from `/proc/self/maps` (this process, never under `--root`).
#[cfg(feature = "efa")]
fn library_path() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with("libfabric.so"))
        })
        .map(str::to_string)
}

#[cfg(feature = "efa")]
fn names_libcuda(path: &str) -> Option<bool> {
    let bytes = std::fs::read(path).ok()?;
    let needle = b"libcuda.so";
    Some(bytes.windows(needle.len()).any(|w| w == needle))
}

/// Ask the libfabric linked into this binary; `None` in a build without the efa backend.
pub fn probe() -> Option<Libfabric> {
    #[cfg(feature = "efa")]
    {
        use transport_core::{NicDesc, Transport};
        use transport_efa::Endpoint;
        let providers = Endpoint::available_providers();
        let p = if providers.iter().any(|p| p == "efa") {
            "efa"
        } else {
            "shm"
        };
        let hmem = providers.iter().any(|x| x == p) && {
            let mut d = NicDesc {
                provider: Some(p.into()),
                ..NicDesc::default()
            };
            d.options.insert("hmem".into(), "on".into());
            Endpoint::open(&d).is_ok_and(|ep| ep.caps().gpu_memory)
        };
        let library = library_path();
        let cuda = library.as_deref().and_then(names_libcuda);
        Some(Libfabric {
            version: Endpoint::libfabric_version(),
            providers,
            hmem_provider: Some(p.into()),
            hmem,
            library,
            cuda,
        })
    }
    #[cfg(not(feature = "efa"))]
    {
        None
    }
}
