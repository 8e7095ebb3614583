//! From NVML device indices to CUDA device ordinals.
//!
//! NVML numbers every GPU of the machine by PCI bus; CUDA numbers only the GPUs that
//! `CUDA_VISIBLE_DEVICES` lets through, fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
//! The recorder's device numbers are CUDA ordinals, so the sampler matches each NVML device to a
//! CUDA device by PCI address and records that ordinal.

/// A PCI address: domain, bus, device (the function is always 0 for a GPU and is ignored).
pub type PciAddress = (u32, u8, u8);

/// Parses a PCI bus id as NVML (`00000000:3B:00.0`) or CUDA (`0000:3b:00.0`) writes it.
#[must_use]
pub fn parse_bus_id(id: &str) -> Option<PciAddress> {
    let mut parts = id.trim().split(':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u8::from_str_radix(parts.next()?, 16).ok()?;
    let dev_fn = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let device = dev_fn.split('.').next()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    Some((domain, bus, device))
}

/// For each NVML device (its PCI address, by NVML index), the CUDA ordinal of the same GPU:
/// `cuda[k]` is the address of CUDA ordinal `k`. `None` for a GPU that CUDA does not see (left
/// out by `CUDA_VISIBLE_DEVICES`) or whose address NVML could not read.
#[must_use]
pub fn nvml_to_cuda(nvml: &[Option<PciAddress>], cuda: &[PciAddress]) -> Vec<Option<u32>> {
    nvml.iter()
        .map(|addr| {
            let addr = (*addr)?;
            let k = cuda.iter().position(|c| *c == addr)?;
            u32::try_from(k).ok()
        })
        .collect()
}

/// The PCI address of each CUDA device, by ordinal, as this process sees them (honouring its
/// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`). `None` when there is no CUDA driver or it
/// cannot answer.
#[must_use]
pub fn cuda_pci_addresses() -> Option<Vec<PciAddress>> {
    use cudarc::driver::result::device;
    use cudarc::driver::sys::CUdevice_attribute as A;
    // SAFETY: only tries to dlopen the driver library; cudarc panics at the first driver call
    // without it, so nothing below runs unless it is present.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    cudarc::driver::result::init().ok()?;
    let count = device::get_count().ok()?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let dev = device::get(ordinal).ok()?;
        // SAFETY: `dev` is a device handle the driver just returned, after `cuInit`.
        let attr = |a| unsafe { device::get_attribute(dev, a) }.ok();
        let domain = u32::try_from(attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?).ok()?;
        let bus = u8::try_from(attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?).ok()?;
        let device = u8::try_from(attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?).ok()?;
        out.push((domain, bus, device));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_of_both_libraries_parse_alike() {
        assert_eq!(parse_bus_id("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_bus_id("0000:3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_bus_id("00000001:B1:1F.0"), Some((1, 0xb1, 0x1f)));
        assert_eq!(parse_bus_id(""), None);
        assert_eq!(parse_bus_id("0000:3b"), None);
        assert_eq!(parse_bus_id("0000:3b:00.0:1"), None);
        assert_eq!(parse_bus_id("zz:3b:00.0"), None);
    }

    #[test]
    fn all_visible_in_bus_order() {
        let nvml = [Some((0, 0x3b, 0)), Some((0, 0xb1, 0))];
        assert_eq!(
            nvml_to_cuda(&nvml, &[(0, 0x3b, 0), (0, 0xb1, 0)]),
            [Some(0), Some(1)]
        );
    }

    #[test]
    fn cuda_fastest_first_reverses_the_order() {
        // CUDA's default order put the GPU on the higher bus first.
        let nvml = [Some((0, 0x3b, 0)), Some((0, 0xb1, 0))];
        assert_eq!(
            nvml_to_cuda(&nvml, &[(0, 0xb1, 0), (0, 0x3b, 0)]),
            [Some(1), Some(0)]
        );
    }

    #[test]
    fn a_visible_subset_leaves_the_others_out() {
        // CUDA_VISIBLE_DEVICES=3,1 on a four-GPU machine.
        let nvml = [
            Some((0, 0x18, 0)),
            Some((0, 0x3b, 0)),
            Some((0, 0x86, 0)),
            Some((0, 0xaf, 0)),
        ];
        let cuda = [(0, 0xaf, 0), (0, 0x3b, 0)];
        assert_eq!(nvml_to_cuda(&nvml, &cuda), [None, Some(1), None, Some(0)]);
    }

    #[test]
    fn same_bus_in_another_domain_is_another_gpu() {
        let nvml = [Some((0, 0x3b, 0)), None, Some((1, 0x3b, 0))];
        assert_eq!(nvml_to_cuda(&nvml, &[(1, 0x3b, 0)]), [None, None, Some(0)]);
    }

    #[test]
    fn without_a_driver_there_are_no_addresses() {
        // Runs everywhere and must not panic: with a CUDA driver it lists the visible devices.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        if !present {
            assert_eq!(cuda_pci_addresses(), None);
        }
    }
}
