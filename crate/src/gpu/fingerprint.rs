//! Reading a GPU's [`Fingerprint`] from the driver (the record type and
//! the host's part live in `measure::fingerprint`).

use super::driver;
use crate::error::Result;
use crate::measure::fingerprint::{build_cuda_version, cuda_version_string, host_cpu_model, kernel_driver_version, sysfs_bus_id, Fingerprint, PcieLink};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use std::path::Path;

impl Fingerprint {
    pub(in crate::gpu) fn read(dev: driver::CUdevice, ordinal: usize) -> Result<Fingerprint> {
        let attr = |a| driver::attribute(dev, a);
        let pci_bus_id = driver::pci_bus_id(dev)?;
        let sysfs = Path::new("/sys/bus/pci/devices").join(sysfs_bus_id(&pci_bus_id));
        Ok(Fingerprint {
            gpu_name: driver::device_name(dev)?,
            gpu_uuid: driver::device_uuid(dev)?,
            ordinal,
            compute_capability: format!(
                "{}.{}",
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
            ),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            memory_bytes: driver::total_memory(dev)?,
            async_engine_count: attr(Attr::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as u32,
            concurrent_kernels: attr(Attr::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS)? != 0,
            driver_version: kernel_driver_version(),
            driver_cuda_version: cuda_version_string(driver::driver_cuda_version()?),
            build_cuda_version: build_cuda_version().to_string(),
            pcie: PcieLink::from_sysfs(&sysfs),
            pci_bus_id,
            host_cpu: host_cpu_model(),
            host_cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        })
    }
}
