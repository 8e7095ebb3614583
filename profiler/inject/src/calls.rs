//! Which CUDA API functions the callbacks watch.
//!
//! The callbacks run on the program's own threads inside every watched call, so only the calls
//! that issue GPU work or block the host are watched: copies, memsets, kernel and graph
//! launches, synchronizations, device allocations and frees, and `cuProfilerStop` (which
//! flushes). Functions are chosen by the names CUPTI gives them (`cuptiGetCallbackName`), so
//! new versioned variants (`cuMemcpyHtoDAsync_v2`, `cudaLaunchKernelExC_v11060`) are included
//! without a table to update.

/// An API domain with callbacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    /// `cu*` functions.
    Driver,
    /// `cuda*` functions.
    Runtime,
}

/// Why a function is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// A copy, memset, synchronization, allocation or free (host call stack captured by default).
    Work,
    /// A kernel launch: the most frequent calls, so their host call stack is captured only
    /// when asked for (`PERFKIT_INJECT_STACKS=all`).
    Launch,
    /// A CUDA graph launch: like [`Watch::Launch`], and every node of the replay (kernels,
    /// copies, memsets) carries this one call's correlation id.
    GraphLaunch,
    /// `cuProfilerStop`: flush the records gathered so far.
    ProfilerStop,
}

/// Whether the function named `name` (as `cuptiGetCallbackName` reports it) is watched.
pub fn classify(domain: Domain, name: &str) -> Option<Watch> {
    match domain {
        Domain::Driver => {
            if name == "cuProfilerStop" {
                return Some(Watch::ProfilerStop);
            }
            // Pinned host allocations are host memory, not GPU work.
            if name.starts_with("cuMemAllocHost") || name.starts_with("cuMemFreeHost") {
                return None;
            }
            // A host function runs on a CUDA thread, not the GPU: no activity record ever
            // carries its id, so its call would wait in the call table for nothing.
            if name.starts_with("cuLaunchHostFunc") {
                return None;
            }
            if name.starts_with("cuGraphLaunch") {
                return Some(Watch::GraphLaunch);
            }
            if name.starts_with("cuLaunch") {
                return Some(Watch::Launch);
            }
            const PREFIXES: &[&str] = &[
                "cuMemcpy",
                "cuMemset",
                "cuStreamSynchronize",
                "cuCtxSynchronize",
                "cuEventSynchronize",
                "cuMemAlloc",
                "cuMemFree",
            ];
            PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
                .then_some(Watch::Work)
        }
        Domain::Runtime => {
            if name.starts_with("cudaMallocHost") || name.starts_with("cudaFreeHost") {
                return None;
            }
            if name.starts_with("cudaLaunchHostFunc") {
                return None;
            }
            if name.starts_with("cudaGraphLaunch") {
                return Some(Watch::GraphLaunch);
            }
            if name.starts_with("cudaLaunch") {
                return Some(Watch::Launch);
            }
            const PREFIXES: &[&str] = &[
                "cudaMemcpy",
                "cudaMemset",
                "cudaStreamSynchronize",
                "cudaDeviceSynchronize",
                "cudaEventSynchronize",
                "cudaMalloc",
                "cudaFree",
            ];
            PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
                .then_some(Watch::Work)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_work_and_blocking_calls() {
        for n in [
            "cuMemcpyHtoD_v2",
            "cuMemcpyDtoHAsync_v2",
            "cuMemcpy2DAsync_v2",
            "cuMemsetD32_v2",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
            "cuEventSynchronize",
            "cuMemAlloc_v2",
            "cuMemAllocAsync",
            "cuMemFree_v2",
        ] {
            assert_eq!(classify(Domain::Driver, n), Some(Watch::Work), "{n}");
        }
        for n in [
            "cudaMemcpy_v3020",
            "cudaMemcpyAsync_v3020",
            "cudaDeviceSynchronize_v3020",
            "cudaStreamSynchronize_v3020",
            "cudaMalloc_v3020",
            "cudaFree_v3020",
            "cudaMemsetAsync_v3020",
        ] {
            assert_eq!(classify(Domain::Runtime, n), Some(Watch::Work), "{n}");
        }
    }

    #[test]
    fn launches_are_their_own_class() {
        for n in [
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchCooperativeKernel",
        ] {
            assert_eq!(classify(Domain::Driver, n), Some(Watch::Launch), "{n}");
        }
        for n in ["cudaLaunchKernel_v7000", "cudaLaunchKernelExC_v11060"] {
            assert_eq!(classify(Domain::Runtime, n), Some(Watch::Launch), "{n}");
        }
        // Host functions: launched, but never GPU work with an activity record.
        assert_eq!(classify(Domain::Driver, "cuLaunchHostFunc"), None);
        assert_eq!(classify(Domain::Driver, "cuLaunchHostFunc_ptsz"), None);
        assert_eq!(classify(Domain::Runtime, "cudaLaunchHostFunc_v10000"), None);
        assert_eq!(
            classify(Domain::Driver, "cuGraphLaunch"),
            Some(Watch::GraphLaunch)
        );
        assert_eq!(
            classify(Domain::Runtime, "cudaGraphLaunch_v10000"),
            Some(Watch::GraphLaunch)
        );
    }

    #[test]
    fn ignores_everything_else() {
        for n in [
            "cuCtxGetCurrent",
            "cuMemAllocHost_v2",
            "cuMemFreeHost",
            "cuStreamWaitEvent",
            "cuEventRecord",
            "cuModuleGetFunction",
            "cuInit",
        ] {
            assert_eq!(classify(Domain::Driver, n), None, "{n}");
        }
        for n in [
            "cudaMallocHost_v3020",
            "cudaFreeHost_v3020",
            "cudaGetDevice_v3020",
        ] {
            assert_eq!(classify(Domain::Runtime, n), None, "{n}");
        }
        assert_eq!(classify(Domain::Runtime, "cuProfilerStop"), None);
    }

    #[test]
    fn profiler_stop_flushes() {
        assert_eq!(
            classify(Domain::Driver, "cuProfilerStop"),
            Some(Watch::ProfilerStop)
        );
    }
}

/// Which calls get their host call stack captured (`PERFKIT_INJECT_STACKS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackPolicy {
    /// Copies, memsets, synchronizations, allocations and frees (`transfers`, the default).
    Transfers,
    /// Every watched call, kernel launches included (`all`).
    All,
    /// None (`off`).
    Off,
}

impl StackPolicy {
    /// Parses the value of `PERFKIT_INJECT_STACKS` (None: the default).
    pub fn parse(value: Option<&str>) -> Result<StackPolicy, String> {
        match value.map(str::trim) {
            None | Some("" | "transfers") => Ok(StackPolicy::Transfers),
            Some("all") => Ok(StackPolicy::All),
            Some("off" | "0" | "none") => Ok(StackPolicy::Off),
            Some(other) => Err(format!(
                "PERFKIT_INJECT_STACKS={other:?}: expected transfers, all or off"
            )),
        }
    }

    /// Whether a call of this kind gets a stack.
    pub fn wants(self, watch: Watch) -> bool {
        match (self, watch) {
            (StackPolicy::Off, _) | (_, Watch::ProfilerStop) => false,
            (StackPolicy::All, _) => true,
            (StackPolicy::Transfers, w) => w == Watch::Work,
        }
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    #[test]
    fn policy_parsing_and_choice() {
        assert_eq!(StackPolicy::parse(None), Ok(StackPolicy::Transfers));
        assert_eq!(StackPolicy::parse(Some("all")), Ok(StackPolicy::All));
        assert_eq!(StackPolicy::parse(Some("off")), Ok(StackPolicy::Off));
        assert!(
            StackPolicy::parse(Some("some"))
                .unwrap_err()
                .contains("PERFKIT_INJECT_STACKS")
        );
        assert!(StackPolicy::Transfers.wants(Watch::Work));
        assert!(!StackPolicy::Transfers.wants(Watch::Launch));
        assert!(StackPolicy::All.wants(Watch::Launch));
        assert!(!StackPolicy::Transfers.wants(Watch::GraphLaunch));
        assert!(StackPolicy::All.wants(Watch::GraphLaunch));
        assert!(!StackPolicy::Off.wants(Watch::Work));
    }
}
