// CUDA C kernels of the reference MLP workload, compiled at run time with NVRTC.
//
// Every kernel has a CPU twin in `src/cpu.rs` that computes the same result; the
// twins are the reference the kernels are tested against. Matrices are row-major.
// The matrix products themselves go through cuBLAS and are not in this file.

// ---------------------------------------------------------------------------
// Counter-based random numbers (identical on the host: see `src/rng.rs`).
// ---------------------------------------------------------------------------

__device__ __forceinline__ unsigned int pk_hash(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// Hash of (seed, tag, 64-bit counter).
__device__ __forceinline__ unsigned int pk_mix(unsigned int seed, unsigned int tag,
                                               unsigned long long counter) {
    unsigned int h = pk_hash(seed ^ 0x9e3779b9U);
    h = pk_hash(h ^ tag);
    h = pk_hash(h ^ (unsigned int)(counter & 0xffffffffULL));
    h = pk_hash(h ^ (unsigned int)(counter >> 32));
    return h;
}

// Uniform in [0, 1) with 24 random bits: exact in f32 on both sides.
__device__ __forceinline__ float pk_unit(unsigned int h) {
    return (float)(h >> 8) * (1.0f / 16777216.0f);
}

#define PK_TAG_LABEL 1u
#define PK_TAG_PROTO 2u
#define PK_TAG_NOISE 3u
#define PK_SQRT6 2.4494897f

// ---------------------------------------------------------------------------
// Parameter initialisation and synthetic data, generated on the device.
// ---------------------------------------------------------------------------

// out[i] = lo + (hi - lo) * U(seed, tag, i)
extern "C" __global__ void fill_uniform(float* out, unsigned int n, unsigned int seed,
                                        unsigned int tag, float lo, float hi) {
    // 64-bit: with n near 2^32 the last block's 32-bit index would wrap to 0.
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float u = pk_unit(pk_mix(seed, tag, i));
    out[i] = __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), u));
}

// One synthetic sample per row: label = hash % classes, features = class prototype
// (uniform in [-signal, signal)) + noise_scale * (approximately standard normal noise).
// Sample `first + r` is the same whatever batch it lands in.
extern "C" __global__ void synth_batch(float* x, int* labels, unsigned int seed,
                                       unsigned long long first, int rows, int dim,
                                       int classes, float signal, float noise_scale) {
    unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long total = (unsigned long long)rows * (unsigned long long)dim;
    if (idx >= total) return;
    int r = (int)(idx / (unsigned long long)dim);
    int j = (int)(idx % (unsigned long long)dim);
    unsigned long long sample = first + (unsigned long long)r;
    int label = (int)(pk_mix(seed, PK_TAG_LABEL, sample) % (unsigned int)classes);
    if (j == 0) labels[r] = label;
    unsigned long long proto_idx = (unsigned long long)label * (unsigned long long)dim + j;
    float proto = __fmul_rn(signal,
        __fsub_rn(__fmul_rn(2.0f, pk_unit(pk_mix(seed, PK_TAG_PROTO, proto_idx))), 1.0f));
    unsigned long long noise_idx = sample * (unsigned long long)dim + j;
    // Two 16-bit uniforms from one hash; (u1 + u2 - 1) * sqrt(6) has mean 0, variance 1.
    unsigned int h = pk_mix(seed, PK_TAG_NOISE, noise_idx);
    float u1 = (float)(h & 0xffffU) * (1.0f / 65536.0f);
    float u2 = (float)(h >> 16) * (1.0f / 65536.0f);
    float n = __fmul_rn(__fsub_rn(__fadd_rn(u1, u2), 1.0f), PK_SQRT6);
    x[idx] = __fadd_rn(proto, __fmul_rn(noise_scale, n));
}

// ---------------------------------------------------------------------------
// Bias + ReLU.
// ---------------------------------------------------------------------------

// z[r, c] = z[r, c] + bias[c], then max(., 0) when relu != 0. In place.
extern "C" __global__ void bias_act_fwd(float* z, const float* bias, int rows, int cols,
                                        int relu) {
    unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long total = (unsigned long long)rows * (unsigned long long)cols;
    if (idx >= total) return;
    int c = (int)(idx % (unsigned long long)cols);
    float v = z[idx] + bias[c];
    if (relu != 0 && v < 0.0f) v = 0.0f;
    z[idx] = v;
}

// Backward of bias_act_fwd. `h` is the forward output; `dz` holds the gradient of the
// output and becomes the gradient of the pre-activation (masked where h <= 0 when
// relu != 0). db[c] = sum over rows of the masked gradient.
// Launch with blockDim = (32, PK_BWD_ROWS) and gridDim.x = ceil(cols / 32).
#define PK_BWD_ROWS 8
extern "C" __global__ void bias_act_bwd(const float* h, float* dz, float* db, int rows, int cols,
                                        int relu) {
    __shared__ float partial[PK_BWD_ROWS][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < cols) {
        for (int r = threadIdx.y; r < rows; r += PK_BWD_ROWS) {
            unsigned long long idx = (unsigned long long)r * (unsigned long long)cols + c;
            float g = dz[idx];
            if (relu != 0 && h[idx] <= 0.0f) {
                g = 0.0f;
                dz[idx] = 0.0f;
            }
            acc += g;
        }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float sum = 0.0f;
        for (int k = 0; k < PK_BWD_ROWS; ++k) sum += partial[k][threadIdx.x];
        db[c] = sum;
    }
}

// ---------------------------------------------------------------------------
// Softmax cross-entropy.
// ---------------------------------------------------------------------------

// Row-wise softmax into `probs` and the mean cross-entropy over the batch, reduced on
// the device into loss[0]. Launch with exactly one block of PK_XENT_THREADS threads.
#define PK_XENT_THREADS 256
extern "C" __global__ void softmax_xent_fwd(const float* logits, const int* labels, float* probs,
                                            float* loss, int rows, int cols) {
    __shared__ float partial[PK_XENT_THREADS];
    float acc = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const float* row = logits + (unsigned long long)r * cols;
        float* prow = probs + (unsigned long long)r * cols;
        float m = row[0];
        for (int c = 1; c < cols; ++c) m = fmaxf(m, row[c]);
        float s = 0.0f;
        for (int c = 0; c < cols; ++c) s += expf(row[c] - m);
        float log_s = logf(s);
        for (int c = 0; c < cols; ++c) prow[c] = expf(row[c] - m - log_s);
        int y = labels[r];
        acc += log_s + m - row[y];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = PK_XENT_THREADS / 2; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = partial[0] / (float)rows;
}

// Gradient of the mean cross-entropy with respect to the logits:
// dlogits = (probs - onehot(labels)) / rows.
extern "C" __global__ void softmax_xent_bwd(const float* probs, const int* labels, float* dlogits,
                                            int rows, int cols) {
    unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long total = (unsigned long long)rows * (unsigned long long)cols;
    if (idx >= total) return;
    int r = (int)(idx / (unsigned long long)cols);
    int c = (int)(idx % (unsigned long long)cols);
    float onehot = (labels[r] == c) ? 1.0f : 0.0f;
    dlogits[idx] = (probs[idx] - onehot) / (float)rows;
}

// ---------------------------------------------------------------------------
// Optimizer.
// ---------------------------------------------------------------------------

// SGD with momentum (PyTorch's formulation):
//   g' = g + weight_decay * w;  v = momentum * v + g';  w = w - lr * v
extern "C" __global__ void sgd_momentum(float* w, float* v, const float* g, unsigned int n,
                                        float lr, float momentum, float weight_decay) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = __fadd_rn(g[i], __fmul_rn(weight_decay, w[i]));
    float vi = __fadd_rn(__fmul_rn(momentum, v[i]), gi);
    v[i] = vi;
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, vi));
}
