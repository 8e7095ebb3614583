//! CPU twins of every CUDA kernel in `cuda/mlp.cu`, plus the matrix product.
//!
//! Each function computes what its kernel computes, with the same argument order and
//! the same row-major layout, so the device results can be compared with these and
//! the CPU trainer runs the very same algorithm. Shape mismatches are programming
//! errors and panic with a message naming the argument.

use crate::rng;
use crate::task::TaskSpec;

/// Row-major `c = alpha * op(a) * op(b) + beta * c` where `op(a)` is `m x k`, `op(b)`
/// is `k x n` and `c` is `m x n`. `trans_a`/`trans_b` say that `a`/`b` are stored
/// transposed (`k x m` / `n x k`). Same semantics as the cuBLAS calls of the device
/// path.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    assert_eq!(a.len(), m * k, "gemm: `a` must hold m*k elements");
    assert_eq!(b.len(), k * n, "gemm: `b` must hold k*n elements");
    assert_eq!(c.len(), m * n, "gemm: `c` must hold m*n elements");
    if m == 0 || n == 0 {
        return;
    }
    gemm_rows(trans_a, trans_b, m, m, n, k, alpha, a, b, beta, c);
}

/// [`gemm`] on `threads` threads (at most one per row of `c`): the rows of `c` are split into
/// contiguous blocks, one per thread, each an independent single-threaded product. Same
/// results as [`gemm`] (each element is computed by the same code), so the CPU trainer can
/// give the model exactly the cores its loader workers leave.
#[allow(clippy::too_many_arguments)]
pub fn gemm_threads(
    threads: usize,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    let threads = threads.clamp(1, m.max(1));
    if threads == 1 || n == 0 || k == 0 {
        gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
        return;
    }
    assert_eq!(a.len(), m * k, "gemm: `a` must hold m*k elements");
    assert_eq!(b.len(), k * n, "gemm: `b` must hold k*n elements");
    assert_eq!(c.len(), m * n, "gemm: `c` must hold m*n elements");
    let block = m.div_ceil(threads);
    // Row r of op(a) starts at a[r * k] when `a` is stored as is, at a[r] when transposed.
    let row_stride = if trans_a { 1 } else { k };
    std::thread::scope(|scope| {
        for (i, c_block) in c.chunks_mut(block * n).enumerate() {
            let rows = c_block.len() / n;
            let a_block = &a[i * block * row_stride..];
            scope.spawn(move || {
                gemm_rows(
                    trans_a, trans_b, m, rows, n, k, alpha, a_block, b, beta, c_block,
                )
            });
        }
    });
}

/// `rows` rows of a product whose op(a) has `m` rows in all; `a` starts at the first of them
/// ([`gemm`] is the whole product: `rows == m`).
#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    trans_a: bool,
    trans_b: bool,
    m: usize,
    rows: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    let (rsa, csa) = if trans_a {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    let (rsb, csb) = if trans_b {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    // The last element read of `a` is at (rows - 1) * rsa + (k - 1) * csa from its start
    // (nothing is read of it when k == 0: then c = beta * c).
    if rows > 0 && k > 0 {
        let last = (rows - 1) * rsa as usize + (k - 1) * csa as usize;
        assert!(last < a.len(), "gemm: a row block runs past `a`");
    }
    assert_eq!(
        c.len(),
        rows * n,
        "gemm: a row block of `c` has the wrong size"
    );
    // SAFETY: every element read of `a` lies within the slice (checked just above), `b` holds
    // k*n elements (checked by the caller) and `c` is a unique borrow of exactly rows*n
    // elements that aliases neither.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Twin of `fill_uniform`: `out[i] = lo + (hi - lo) * U(seed, tag, i)`.
pub fn fill_uniform(out: &mut [f32], seed: u32, tag: u32, lo: f32, hi: f32) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = lo + (hi - lo) * rng::unit(rng::mix(seed, tag, i as u64));
    }
}

/// Twin of `synth_batch`: fills `x` (`rows x spec.dim`) and `labels` (`rows`) with
/// samples `first .. first + rows` of the synthetic task.
pub fn synth_batch(x: &mut [f32], labels: &mut [i32], spec: &TaskSpec, first: u64) {
    let rows = labels.len();
    let dim = spec.dim;
    assert_eq!(
        x.len(),
        rows * dim,
        "synth_batch: `x` must hold rows*dim elements"
    );
    // The class prototypes, computed once per call (the kernel recomputes them per
    // element; the values are the same).
    let protos: Vec<f32> = (0..spec.classes * dim)
        .map(|i| {
            spec.signal * (2.0 * rng::unit(rng::mix(spec.seed, rng::TAG_PROTO, i as u64)) - 1.0)
        })
        .collect();
    for (r, label_out) in labels.iter_mut().enumerate() {
        let sample = first + r as u64;
        let label = rng::mix(spec.seed, rng::TAG_LABEL, sample) % spec.classes as u32;
        *label_out = label as i32;
        let proto = &protos[label as usize * dim..(label as usize + 1) * dim];
        let row = &mut x[r * dim..(r + 1) * dim];
        for (j, (out, p)) in row.iter_mut().zip(proto).enumerate() {
            let h = rng::mix(spec.seed, rng::TAG_NOISE, sample * dim as u64 + j as u64);
            let u1 = (h & 0xffff) as f32 * (1.0 / 65_536.0);
            let u2 = (h >> 16) as f32 * (1.0 / 65_536.0);
            // Mean 0, variance 1.
            let noise = (u1 + u2 - 1.0) * SQRT6;
            *out = p + spec.noise_scale * noise;
        }
    }
}

/// `sqrt(6)` as the kernel spells it (`PK_SQRT6`).
const SQRT6: f32 = 2.449_489_7;

/// Twin of `bias_act_fwd`: `z[r, c] += bias[c]`, then ReLU when `relu`. In place.
pub fn bias_act_fwd(z: &mut [f32], bias: &[f32], rows: usize, cols: usize, relu: bool) {
    assert_eq!(
        z.len(),
        rows * cols,
        "bias_act_fwd: `z` must hold rows*cols elements"
    );
    assert_eq!(
        bias.len(),
        cols,
        "bias_act_fwd: `bias` must hold cols elements"
    );
    for row in z.chunks_exact_mut(cols.max(1)) {
        for (v, b) in row.iter_mut().zip(bias) {
            let s = *v + *b;
            *v = if relu && s < 0.0 { 0.0 } else { s };
        }
    }
}

/// Twin of `bias_act_bwd`: masks `dz` where `h <= 0` (when `relu`) and writes the
/// column sums of the masked gradient into `db`.
pub fn bias_act_bwd(
    h: &[f32],
    dz: &mut [f32],
    db: &mut [f32],
    rows: usize,
    cols: usize,
    relu: bool,
) {
    assert_eq!(
        h.len(),
        rows * cols,
        "bias_act_bwd: `h` must hold rows*cols elements"
    );
    assert_eq!(
        dz.len(),
        rows * cols,
        "bias_act_bwd: `dz` must hold rows*cols elements"
    );
    assert_eq!(db.len(), cols, "bias_act_bwd: `db` must hold cols elements");
    db.fill(0.0);
    for (hrow, grow) in h
        .chunks_exact(cols.max(1))
        .zip(dz.chunks_exact_mut(cols.max(1)))
    {
        for ((hv, g), d) in hrow.iter().zip(grow.iter_mut()).zip(db.iter_mut()) {
            if relu && *hv <= 0.0 {
                *g = 0.0;
            }
            *d += *g;
        }
    }
}

/// Twin of `softmax_xent_fwd`: row-wise softmax into `probs`; returns the mean
/// cross-entropy over the rows.
pub fn softmax_xent_fwd(logits: &[f32], labels: &[i32], probs: &mut [f32], cols: usize) -> f32 {
    let rows = labels.len();
    assert_eq!(
        logits.len(),
        rows * cols,
        "softmax_xent_fwd: `logits` must hold rows*cols elements"
    );
    assert_eq!(
        probs.len(),
        rows * cols,
        "softmax_xent_fwd: `probs` must hold rows*cols elements"
    );
    if rows == 0 {
        return 0.0;
    }
    let mut total = 0.0f64;
    for ((row, prow), &y) in logits
        .chunks_exact(cols)
        .zip(probs.chunks_exact_mut(cols))
        .zip(labels)
    {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        let log_s = s.ln();
        for (p, v) in prow.iter_mut().zip(row) {
            *p = (v - m - log_s).exp();
        }
        let y = usize::try_from(y).expect("softmax_xent_fwd: labels must be non-negative");
        total += f64::from(log_s + m - row[y]);
    }
    (total / rows as f64) as f32
}

/// Twin of `softmax_xent_bwd`: `dlogits = (probs - onehot(labels)) / rows`.
pub fn softmax_xent_bwd(probs: &[f32], labels: &[i32], dlogits: &mut [f32], cols: usize) {
    let rows = labels.len();
    assert_eq!(
        probs.len(),
        rows * cols,
        "softmax_xent_bwd: `probs` must hold rows*cols elements"
    );
    assert_eq!(
        dlogits.len(),
        rows * cols,
        "softmax_xent_bwd: `dlogits` must hold rows*cols elements"
    );
    let scale = rows as f32;
    for ((prow, grow), &y) in probs
        .chunks_exact(cols)
        .zip(dlogits.chunks_exact_mut(cols))
        .zip(labels)
    {
        for (c, (p, g)) in prow.iter().zip(grow.iter_mut()).enumerate() {
            let onehot = if c as i32 == y { 1.0 } else { 0.0 };
            *g = (p - onehot) / scale;
        }
    }
}

/// Twin of `sgd_momentum` (PyTorch's formulation):
/// `g' = g + weight_decay * w; v = momentum * v + g'; w -= lr * v`.
pub fn sgd_momentum(
    w: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    assert_eq!(
        w.len(),
        v.len(),
        "sgd_momentum: `w` and `v` must have the same length"
    );
    assert_eq!(
        w.len(),
        g.len(),
        "sgd_momentum: `w` and `g` must have the same length"
    );
    for ((wi, vi), gi) in w.iter_mut().zip(v.iter_mut()).zip(g) {
        let gg = gi + weight_decay * *wi;
        let nv = momentum * *vi + gg;
        *vi = nv;
        *wi -= lr * nv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_on_threads_gives_the_single_threaded_result() {
        let (m, n, k) = (37, 11, 23);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.5)
            .collect();
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                let mut one = vec![1.0f32; m * n];
                gemm(trans_a, trans_b, m, n, k, 0.5, &a, &b, 0.25, &mut one);
                for threads in [2, 3, 4, 37, 100] {
                    let mut many = vec![1.0f32; m * n];
                    gemm_threads(
                        threads, trans_a, trans_b, m, n, k, 0.5, &a, &b, 0.25, &mut many,
                    );
                    assert_eq!(
                        many, one,
                        "trans_a {trans_a} trans_b {trans_b} threads {threads}"
                    );
                }
            }
        }
    }

    fn naive(
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
    ) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f32;
                for l in 0..k {
                    let av = if trans_a { a[l * m + i] } else { a[i * k + l] };
                    let bv = if trans_b { b[j * k + l] } else { b[l * n + j] };
                    s += av * bv;
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    #[test]
    fn gemm_matches_naive_product_for_every_transpose() {
        let (m, n, k) = (5, 7, 3);
        let mut a = vec![0.0; m * k];
        let mut b = vec![0.0; k * n];
        fill_uniform(&mut a, 1, 100, -1.0, 1.0);
        fill_uniform(&mut b, 1, 101, -1.0, 1.0);
        for ta in [false, true] {
            for tb in [false, true] {
                let mut c = vec![0.0; m * n];
                gemm(ta, tb, m, n, k, 1.0, &a, &b, 0.0, &mut c);
                let want = naive(ta, tb, m, n, k, &a, &b);
                for (x, y) in c.iter().zip(&want) {
                    assert!(
                        (x - y).abs() < 1e-5,
                        "trans_a={ta} trans_b={tb}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_noise_constant_is_the_kernels() {
        assert!((SQRT6 * SQRT6 - 6.0).abs() < 1e-6);
        assert!(crate::nvrtc::MLP_SOURCE.contains("#define PK_SQRT6 2.4494897f"));
    }

    #[test]
    fn synth_noise_has_unit_variance() {
        let spec = TaskSpec {
            seed: 5,
            dim: 1000,
            classes: 2,
            signal: 0.0,
            noise_scale: 1.0,
        };
        let mut x = vec![0.0; 100 * 1000];
        let mut y = vec![0; 100];
        synth_batch(&mut x, &mut y, &spec, 0);
        let n = x.len() as f64;
        let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }

    #[test]
    fn gemm_honours_alpha_and_beta() {
        let a = [1.0, 2.0];
        let b = [3.0, 4.0];
        let mut c = [10.0];
        gemm(false, false, 1, 1, 2, 2.0, &a, &b, 0.5, &mut c);
        assert_eq!(c[0], 2.0 * 11.0 + 5.0);
    }

    #[test]
    fn bias_act_fwd_adds_bias_and_clamps() {
        let mut z = [1.0, -3.0, 0.5, -0.25];
        bias_act_fwd(&mut z, &[1.0, 1.0], 2, 2, true);
        assert_eq!(z, [2.0, 0.0, 1.5, 0.75]);
        let mut z = [1.0, -3.0];
        bias_act_fwd(&mut z, &[1.0, 1.0], 1, 2, false);
        assert_eq!(z, [2.0, -2.0]);
    }

    #[test]
    fn bias_act_bwd_masks_and_sums_columns() {
        let h = [0.0, 2.0, 1.0, 0.0];
        let mut dz = [5.0, 1.0, 2.0, 7.0];
        let mut db = [9.0, 9.0];
        bias_act_bwd(&h, &mut dz, &mut db, 2, 2, true);
        assert_eq!(dz, [0.0, 1.0, 2.0, 0.0]);
        assert_eq!(db, [2.0, 1.0]);
    }

    #[test]
    fn softmax_xent_of_uniform_logits_is_log_classes() {
        let logits = [0.0f32; 20];
        let labels = [3, 7];
        let mut probs = [0.0f32; 20];
        let loss = softmax_xent_fwd(&logits, &labels, &mut probs, 10);
        assert!((loss - 10f32.ln()).abs() < 1e-6);
        assert!(probs.iter().all(|p| (p - 0.1).abs() < 1e-6));
        let mut d = [0.0f32; 20];
        softmax_xent_bwd(&probs, &labels, &mut d, 10);
        assert!((d[3] - (0.1 - 1.0) / 2.0).abs() < 1e-6);
        assert!((d[0] - 0.1 / 2.0).abs() < 1e-6);
        // The gradient of each row sums to zero.
        assert!(d[..10].iter().sum::<f32>().abs() < 1e-6);
    }

    #[test]
    fn softmax_xent_gradient_matches_finite_differences() {
        let cols = 4;
        let mut logits = vec![0.0f32; 3 * cols];
        fill_uniform(&mut logits, 5, 200, -2.0, 2.0);
        let labels = [0, 3, 1];
        let mut probs = vec![0.0; logits.len()];
        softmax_xent_fwd(&logits, &labels, &mut probs, cols);
        let mut grad = vec![0.0; logits.len()];
        softmax_xent_bwd(&probs, &labels, &mut grad, cols);
        let eps = 1e-2f32;
        for i in 0..logits.len() {
            let mut plus = logits.clone();
            plus[i] += eps;
            let mut minus = logits.clone();
            minus[i] -= eps;
            let fp = softmax_xent_fwd(&plus, &labels, &mut probs, cols);
            let fm = softmax_xent_fwd(&minus, &labels, &mut probs, cols);
            let numeric = (fp - fm) / (2.0 * eps);
            assert!(
                (numeric - grad[i]).abs() < 2e-3,
                "element {i}: {numeric} vs {}",
                grad[i]
            );
        }
    }

    #[test]
    fn sgd_momentum_follows_the_pytorch_update() {
        let mut w = [1.0f32];
        let mut v = [0.5f32];
        sgd_momentum(&mut w, &mut v, &[2.0], 0.1, 0.9, 0.01);
        let g = 2.0 + 0.01 * 1.0;
        let nv = 0.9 * 0.5 + g;
        assert!((v[0] - nv).abs() < 1e-7);
        assert!((w[0] - (1.0 - 0.1 * nv)).abs() < 1e-7);
    }

    #[test]
    fn synth_batch_is_deterministic_and_independent_of_batching() {
        let spec = TaskSpec {
            seed: 3,
            dim: 16,
            classes: 10,
            signal: 1.0,
            noise_scale: 1.0,
        };
        let mut x_all = vec![0.0; 8 * 16];
        let mut y_all = vec![0; 8];
        synth_batch(&mut x_all, &mut y_all, &spec, 100);
        let mut x_tail = vec![0.0; 4 * 16];
        let mut y_tail = vec![0; 4];
        synth_batch(&mut x_tail, &mut y_tail, &spec, 104);
        assert_eq!(&x_all[4 * 16..], &x_tail[..]);
        assert_eq!(&y_all[4..], &y_tail[..]);
        assert!(y_all.iter().all(|&y| (0..10).contains(&y)));
    }

    #[test]
    fn synth_batch_samples_of_one_class_share_a_prototype() {
        // Same-class samples are closer to each other than to other classes on average,
        // which is what makes the task learnable.
        let spec = TaskSpec {
            seed: 9,
            dim: 256,
            classes: 4,
            signal: 1.0,
            noise_scale: 1.0,
        };
        let rows = 64;
        let mut x = vec![0.0; rows * spec.dim];
        let mut y = vec![0; rows];
        synth_batch(&mut x, &mut y, &spec, 0);
        let dist = |a: usize, b: usize| -> f32 {
            x[a * spec.dim..(a + 1) * spec.dim]
                .iter()
                .zip(&x[b * spec.dim..(b + 1) * spec.dim])
                .map(|(p, q)| (p - q) * (p - q))
                .sum()
        };
        let (mut same, mut ns, mut diff, mut nd) = (0.0, 0, 0.0, 0);
        for a in 0..rows {
            for b in a + 1..rows {
                if y[a] == y[b] {
                    same += dist(a, b);
                    ns += 1;
                } else {
                    diff += dist(a, b);
                    nd += 1;
                }
            }
        }
        assert!(ns > 0 && nd > 0);
        assert!(same / (ns as f32) < 0.8 * diff / (nd as f32));
    }
}
