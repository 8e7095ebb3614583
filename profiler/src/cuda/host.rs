//! Host buffers that know whether they are page-locked.

use cudarc::driver::{HostSlice, PinnedHostSlice};

use crate::model::HostMemory;

/// A host buffer a copy can read from or write to, knowing whether it is pinned.
///
/// Implemented for slices, arrays and `Vec` (pageable) and for cudarc's
/// [`PinnedHostSlice`] (pinned), which are exactly the host types cudarc's copy methods
/// accept.
pub trait HostBuffer<T>: HostSlice<T> {
    /// Pinned or pageable.
    fn host_memory(&self) -> HostMemory;
}

impl<T> HostBuffer<T> for [T] {
    fn host_memory(&self) -> HostMemory {
        HostMemory::Pageable
    }
}

impl<T, const N: usize> HostBuffer<T> for [T; N] {
    fn host_memory(&self) -> HostMemory {
        HostMemory::Pageable
    }
}

impl<T> HostBuffer<T> for Vec<T> {
    fn host_memory(&self) -> HostMemory {
        HostMemory::Pageable
    }
}

impl<T> HostBuffer<T> for PinnedHostSlice<T> {
    fn host_memory(&self) -> HostMemory {
        HostMemory::Pinned
    }
}

/// Bytes in `len` elements of `T`.
pub(crate) fn bytes_of<T>(len: usize) -> u64 {
    (len as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_host_memory_is_pageable() {
        let v = vec![1.0f32; 3];
        assert_eq!(v.host_memory(), HostMemory::Pageable);
        assert_eq!(v[..2].host_memory(), HostMemory::Pageable);
        assert_eq!([0u8; 4].host_memory(), HostMemory::Pageable);
    }

    #[test]
    fn bytes_count_elements_times_their_size() {
        assert_eq!(bytes_of::<f32>(1024), 4096);
        assert_eq!(bytes_of::<u8>(3), 3);
        assert_eq!(bytes_of::<f64>(0), 0);
        assert_eq!(bytes_of::<[f32; 4]>(2), 32);
    }
}
