//! CUDA ordinals through the CUDA driver (feature `cuda`).

use crate::grouping::CudaDev;
use cudarc::driver::{result, sys};

/// The CUDA devices with their PCI location, or why they cannot be listed.
/// Never panics when no driver is installed: the library is probed first.
pub(crate) fn devices() -> Result<Vec<CudaDev>, String> {
    // SAFETY: `is_culib_present` only tries to dlopen the CUDA driver library
    // (libcuda.so) by its usual names and drops the handle; it touches no
    // CUDA state and has no precondition.
    let present = unsafe { sys::is_culib_present() };
    if !present {
        return Err("no CUDA driver library".to_string());
    }
    result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let dev = result::device::get(ordinal)
            .map_err(|e| format!("cuDeviceGet({ordinal}) failed: {e}"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32, String> {
            // SAFETY: `dev` was just returned by cuDeviceGet for a valid
            // ordinal, which is the only requirement of cuDeviceGetAttribute.
            unsafe { result::device::get_attribute(dev, a) }.map_err(|e| {
                format!("cuDeviceGetAttribute({a:?}) failed for device {ordinal}: {e}")
            })
        };
        let domain = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        let bus = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let device = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        let (Ok(ordinal), Ok(domain), Ok(bus), Ok(dev)) = (
            usize::try_from(ordinal),
            u32::try_from(domain),
            u8::try_from(bus),
            u8::try_from(device),
        ) else {
            return Err(format!(
                "CUDA device {ordinal} reports an impossible PCI location {domain}:{bus}:{device}"
            ));
        };
        out.push(CudaDev {
            ordinal,
            domain,
            bus,
            dev,
        });
    }
    Ok(out)
}

/// The CUDA driver's version (`cuDriverGetVersion`, as `major.minor`) and the names of the
/// CUDA devices `ordinals`, in that order; or why they cannot be read.
pub fn driver_and_names(ordinals: &[usize]) -> Result<(String, Vec<String>), String> {
    // SAFETY: as in `devices`: a dlopen probe without preconditions.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library".to_string());
    }
    result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: `v` is a valid out-pointer; the driver is loaded and initialised.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| format!("cuDriverGetVersion failed: {e}"))?;
    let mut names = Vec::with_capacity(ordinals.len());
    for &o in ordinals {
        let i = std::ffi::c_int::try_from(o).map_err(|_| format!("GPU {o}: no such ordinal"))?;
        let dev = result::device::get(i).map_err(|e| format!("cuDeviceGet({o}) failed: {e}"))?;
        names.push(
            result::device::get_name(dev)
                .map_err(|e| format!("cuDeviceGetName({o}) failed: {e}"))?,
        );
    }
    Ok((format!("{}.{}", v / 1000, v % 1000 / 10), names))
}
