//! perfkit-profiler: records what a training program does, with almost no overhead.
