//! Device contexts: where data lives and where an operation runs.
//!
//! Owns: [`Context`] and its device types, with the stock C codes (1 cpu, 2 gpu, 3 cpu_pinned,
//! 5 cpu_shared) and the stock text form (`cpu(0)`, `gpu(1)`). Whether a GPU is available is
//! the [`crate::cuda`] layer's answer (none without a CUDA driver).

use crate::error::{Error, Result};
use std::fmt;

/// Device type, with stock's numeric codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DevType {
    Cpu = 1,
    Gpu = 2,
    CpuPinned = 3,
    CpuShared = 5,
}

impl DevType {
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            1 => DevType::Cpu,
            2 => DevType::Gpu,
            3 => DevType::CpuPinned,
            5 => DevType::CpuShared,
            _ => {
                return Err(Error::value(format!(
                    "unknown device type {code} (expected 1 cpu, 2 gpu, 3 cpu_pinned or 5 cpu_shared)"
                )))
            }
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DevType::Cpu => "cpu",
            DevType::Gpu => "gpu",
            DevType::CpuPinned => "cpu_pinned",
            DevType::CpuShared => "cpu_shared",
        }
    }
    /// Whether memory of this type is host memory.
    pub fn is_host(self) -> bool {
        self != DevType::Gpu
    }
}

/// A device context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context {
    pub dev_type: DevType,
    pub dev_id: i32,
}

impl Context {
    pub const CPU: Context = Context { dev_type: DevType::Cpu, dev_id: 0 };

    pub fn new(dev_type: DevType, dev_id: i32) -> Result<Self> {
        if dev_id < 0 {
            return Err(Error::value(format!("device id must be >= 0, got {dev_id}")));
        }
        Ok(Context { dev_type, dev_id })
    }
    #[inline]
    pub fn from_codes(dev_type: i32, dev_id: i32) -> Result<Self> {
        Self::new(DevType::from_code(dev_type)?, dev_id)
    }
    pub fn gpu(dev_id: i32) -> Self {
        Context { dev_type: DevType::Gpu, dev_id }
    }
    /// Fails for a device this machine does not have (a GPU without a CUDA driver, or
    /// past the number of GPUs found).
    #[inline]
    pub fn check_available(self) -> Result<Self> {
        if self.dev_type == DevType::Gpu {
            let n = crate::cuda::device_count();
            if (self.dev_id as usize) >= n {
                return Err(Error::mxnet(if n == 0 {
                    format!(
                        "{self} is not available: no CUDA driver or GPU was found \
                         (MXGetGPUCount reports 0 GPUs)"
                    )
                } else {
                    format!("{self} is not available: this machine has {n} GPU(s)")
                }));
            }
        }
        Ok(self)
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.dev_type.name(), self.dev_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names() {
        assert_eq!(Context::from_codes(1, 0).unwrap().to_string(), "cpu(0)");
        assert_eq!(Context::from_codes(5, 2).unwrap().to_string(), "cpu_shared(2)");
        assert!(Context::from_codes(4, 0).is_err());
        assert!(Context::from_codes(1, -1).is_err());
        assert!(Context::gpu(4096).check_available().unwrap_err().to_string().contains("gpu(4096)"));
        assert!(Context::CPU.check_available().is_ok());
    }
}
