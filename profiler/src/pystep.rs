//! Training steps of a Python trace that has no step spans (a program captured through CUPTI
//! injection), inferred from the optimizer steps in the Python frames of its GPU operations:
//! each optimizer step ends a training step. One definition for every reader of traces (the
//! terminal summary and the reports).
//!
//! On each thread, a step runs from the return of one optimizer step's last CUDA call to the
//! return of the next's: a boundary is placed at the first operation with Python frames outside
//! the optimizer after operations inside it. Operations without Python frames (made without the
//! GIL) say nothing either way. The work before the first optimizer step is set-up, the work
//! after the last an unfinished step.

use std::collections::HashMap;

use crate::model::{Nanos, PyFrame, ThreadIndex};

/// Whether a Python frame is an optimizer's `step`: a function named `step` in a file whose path
/// names an optimizer module (`torch/optim/sgd.py`, `bitsandbytes/optim/...`,
/// `transformers/optimization.py`, `apex/optimizers/...`).
pub fn is_optimizer_step(f: &PyFrame) -> bool {
    &*f.function == "step" && f.file.to_ascii_lowercase().contains("optim")
}

/// A step boundary: on `thread` at `at`, step `ended` (its synthetic span id) ended, if one was
/// open, and step number `number` (from 1) began with span id `begun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBoundary {
    /// The thread.
    pub thread: ThreadIndex,
    /// When the previous optimizer step's last call returned.
    pub at: Nanos,
    /// The span id of the step that ended (None before the first).
    pub ended: Option<u64>,
    /// The span id of the step that began (ids count down from `u64::MAX`, clear of the
    /// recorder's).
    pub begun: u64,
    /// The number of the step that began, from 1.
    pub number: u64,
}

#[derive(Default)]
struct ThreadState {
    in_optimizer: bool,
    optimizer_end: Nanos,
    open: Option<u64>,
    count: u64,
}

/// The inference, fed the operations with Python frames in file order.
#[derive(Default)]
pub struct PyStepInference {
    threads: HashMap<ThreadIndex, ThreadState>,
    issued: u64,
}

impl PyStepInference {
    /// A new inference.
    pub fn new() -> Self {
        Self::default()
    }

    /// An operation issued on `thread` with Python `frames` (innermost first), whose call
    /// returned at `host_end`. Returns the step boundary it marks, if any (emit it before the
    /// operation).
    pub fn op(
        &mut self,
        thread: ThreadIndex,
        frames: &[PyFrame],
        host_end: Nanos,
    ) -> Option<StepBoundary> {
        let st = self.threads.entry(thread).or_default();
        if frames.iter().any(is_optimizer_step) {
            st.in_optimizer = true;
            st.optimizer_end = st.optimizer_end.max(host_end);
            return None;
        }
        if !st.in_optimizer {
            return None;
        }
        st.in_optimizer = false;
        st.count += 1;
        let begun = u64::MAX - self.issued;
        self.issued += 1;
        let ended = st.open.replace(begun);
        Some(StepBoundary {
            thread,
            at: st.optimizer_end,
            ended,
            begun,
            number: st.count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn frame(file: &str, function: &str) -> PyFrame {
        PyFrame {
            file: Arc::from(file),
            function: Arc::from(function),
            line: 1,
        }
    }

    #[test]
    fn each_optimizer_step_ends_a_step() {
        let opt = [
            frame("/x/torch/optim/sgd.py", "_single_tensor_sgd"),
            frame("/x/torch/optim/sgd.py", "step"),
            frame("train.py", "main"),
        ];
        let fwd = [frame("train.py", "main")];
        let mut inf = PyStepInference::new();
        // Set-up and the first iteration before its optimizer step: no step yet.
        assert_eq!(inf.op(0, &fwd, 10), None);
        assert_eq!(inf.op(0, &opt, 20), None);
        assert_eq!(inf.op(0, &opt, 30), None);
        let b = inf.op(0, &fwd, 40).expect("first step begins");
        assert_eq!((b.at, b.ended, b.number), (30, None, 1));
        assert_eq!(inf.op(0, &fwd, 50), None);
        assert_eq!(inf.op(0, &opt, 60), None);
        let c = inf.op(0, &fwd, 70).expect("second step begins");
        assert_eq!((c.at, c.ended, c.number), (60, Some(b.begun), 2));
        assert_ne!(b.begun, c.begun);
        // Other threads keep their own steps.
        assert_eq!(inf.op(1, &fwd, 80), None);
    }

    #[test]
    fn optimizer_frames_are_recognised() {
        assert!(is_optimizer_step(&frame(
            "/v/site-packages/torch/optim/adamw.py",
            "step"
        )));
        assert!(is_optimizer_step(&frame(
            "/v/site-packages/transformers/optimization.py",
            "step"
        )));
        assert!(!is_optimizer_step(&frame("train.py", "step")));
        assert!(!is_optimizer_step(&frame(
            "/v/site-packages/torch/optim/optimizer.py",
            "zero_grad"
        )));
    }
}
