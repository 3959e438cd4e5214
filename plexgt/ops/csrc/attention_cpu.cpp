// CPU kernels of plexgt's sparse multi-head attention (built on first use by plexgt.ops.native;
// plexgt.ops.attention falls back to torch's per-head sparse kernels where it is unavailable).
//
// Shapes: head-major dense operands [h, N, d] (contiguous); per-edge values [h, E] (one
// contiguous array per head, in the CSR order of the graph they belong to); CSR index arrays
// int32 or int64; outputs node-major [Nr, h, d] (written strided, which costs nothing).
//
// Why hand-written: torch's path is a sampled_addmm per head, then softmax as two segment
// reductions, two index_selects and three elementwise passes over [h, E], then an SpMM per
// head; backward repeats that and gathers [h, E] twice more to carry values to the transposed
// order. Here softmax is fused into the score pass, the softmax backward into the dP pass, and
// the transposed SpMMs read the values through the edge permutation in place. What remains is
// one pass per product, each reading one random operand.
//
// Every pass runs head by head with rows in parallel inside a head: one head's [N, d] slice is
// what the random column reads touch (all heads at once, or per-head strided reads of a
// node-major tensor, reach past the caches and the TLB: measured 2-4x slower at 100K nodes).
// Row sums of d products use a vector reduction: compilers do not reassociate a running sum
// without -ffast-math, and D dependent adds per edge were measured to double the pass.
//
// Only the headers used are included (not <torch/extension.h>, which pulls in all of libtorch's
// C++ API): the build takes 30 s instead of 52 s on one core, paid at install and per ISA test.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGrain = 512;  // rows per task: ~5K edges at degree 10

template <typename T, int D>
inline T dot(const T* __restrict a, const T* __restrict b) {
    T acc[D];
    for (int j = 0; j < D; ++j) acc[j] = a[j] * b[j];
    for (int w = D / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0];
}

#ifdef __AVX512F__
template <int D>
inline float dot512(const float* __restrict a, const float* __restrict b) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b));
    for (int j = 16; j < D; j += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
    return _mm512_reduce_add_ps(acc);
}
template <>
inline float dot<float, 16>(const float* __restrict a, const float* __restrict b) {
    return dot512<16>(a, b);
}
template <>
inline float dot<float, 32>(const float* __restrict a, const float* __restrict b) {
    return dot512<32>(a, b);
}
template <>
inline float dot<float, 64>(const float* __restrict a, const float* __restrict b) {
    return dot512<64>(a, b);
}

// exp on 16 floats: Cephes' expf (range reduction by ln 2, degree-6 polynomial, relative
// error ~1e-7, i.e. float rounding) with the 2^n scaling by scalef, which also handles
// underflow to subnormals and zero exactly. libm's scalar expf was half of the score pass.
inline __m512 exp16(__m512 x) {
    // constant first: min/max return their second operand when either is NaN, so a NaN
    // score stays NaN (as torch's exp keeps it) instead of being clamped to a number
    x = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // below: 0 after scaling anyway
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

// x[t] = exp(x[t] - m) for t in [0, n); returns the sum.
template <typename T>
inline T exp_shift_sum(T* x, int64_t n, T m) {
    T sum = T(0);
    for (int64_t t = 0; t < n; ++t) {
        x[t] = std::exp(x[t] - m);
        sum += x[t];
    }
    return sum;
}
#ifdef __AVX512F__
template <>
inline float exp_shift_sum<float>(float* x, int64_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 k = n - t >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - t)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + t), mv));
        _mm512_mask_storeu_ps(x + t, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

// One output row of an SpMM: acc = sum over edges t in [a, b) of w[t or perm[t]] x[ix[t]],
// then o = acc (or o += acc). The portable fallback (no AVX2 + FMA, or D not a multiple of
// the vector width); gcc leaves its T acc[D] on the stack for D >= 32 (see below).
template <typename T, typename I, int D>
inline void row_gather(const T* __restrict w, const I* __restrict ix, const I* __restrict perm,
                       int64_t a, int64_t b, const T* __restrict x, T* __restrict o,
                       bool accumulate) {
    T acc[D];
    for (int j = 0; j < D; ++j) acc[j] = T(0);
    for (int64_t t = a; t < b; ++t) {
        const T wt = w[perm ? int64_t(perm[t]) : t];
        const T* xr = x + int64_t(ix[t]) * D;
#pragma omp simd
        for (int j = 0; j < D; ++j) acc[j] += wt * xr[j];
    }
    for (int j = 0; j < D; ++j) o[j] = accumulate ? o[j] + acc[j] : acc[j];
}
// The same with the accumulator in D/W vector registers (AVX-512, else AVX2 with FMA): left
// to the compiler, a T acc[D] array for D >= 32 lived on the stack and every edge's update
// went through memory (measured 7-10x slower per element than D = 16).
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
template <typename T>
struct Simd;
// Simd<T> for one vector register type REG of WIDTH lanes, intrinsics P##_op_##S
#define PLEXGT_SIMD(T, REG, WIDTH, P, S)                                            \
    template <>                                                                     \
    struct Simd<T> {                                                                \
        using R = REG;                                                              \
        static constexpr int W = WIDTH;                                             \
        static R zero() { return P##_setzero_##S(); }                               \
        static R set1(T x) { return P##_set1_##S(x); }                              \
        static R load(const T* p) { return P##_loadu_##S(p); }                      \
        static void store(T* p, R x) { P##_storeu_##S(p, x); }                      \
        static R fma(R a, R b, R c) { return P##_fmadd_##S(a, b, c); }              \
        static R add(R a, R b) { return P##_add_##S(a, b); }                        \
    };
#ifdef __AVX512F__
PLEXGT_SIMD(float, __m512, 16, _mm512, ps)
PLEXGT_SIMD(double, __m512d, 8, _mm512, pd)
#else
PLEXGT_SIMD(float, __m256, 8, _mm256, ps)
PLEXGT_SIMD(double, __m256d, 4, _mm256, pd)
#endif
#undef PLEXGT_SIMD
template <typename T, typename I, int D>
    requires(D % Simd<T>::W == 0)
inline void row_gather(const T* __restrict w, const I* __restrict ix, const I* __restrict perm,
                       int64_t a, int64_t b, const T* __restrict x, T* __restrict o,
                       bool accumulate) {
    using Z = Simd<T>;
    constexpr int V = D / Z::W;
    typename Z::R acc[V];
    for (int u = 0; u < V; ++u) acc[u] = Z::zero();
    for (int64_t t = a; t < b; ++t) {
        const typename Z::R wt = Z::set1(w[perm ? int64_t(perm[t]) : t]);
        const T* xr = x + int64_t(ix[t]) * D;
        for (int u = 0; u < V; ++u) acc[u] = Z::fma(wt, Z::load(xr + u * Z::W), acc[u]);
    }
    for (int u = 0; u < V; ++u)
        Z::store(o + u * Z::W, accumulate ? Z::add(Z::load(o + u * Z::W), acc[u]) : acc[u]);
}
#endif

// Scores scale·q[r]·k[c] on every edge, softmax over each row -> p [h, E]; lse [h, Nr].
template <typename T, typename I, int D>
void scores_softmax(const I* ip, const I* ix, const T* q, const T* k, T* p, T* lse,
                    int64_t nr, int64_t nc, int64_t e, int64_t h, T scale) {
    for (int64_t i = 0; i < h; ++i) {
        T* pi = p + i * e;
        const T* qi = q + i * nr * D;
        const T* ki = k + i * nc * D;
        at::parallel_for(0, nr, kGrain, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const int64_t a = ip[r], b = ip[r + 1];
                if (a == b) {
                    lse[i * nr + r] = -std::numeric_limits<T>::infinity();
                    continue;
                }
                const T* qr = qi + r * D;
                for (int64_t t = a; t < b; ++t) pi[t] = scale * dot<T, D>(qr, ki + int64_t(ix[t]) * D);
                T mx = pi[a];
                for (int64_t t = a + 1; t < b; ++t)
                    if (pi[t] > mx || pi[t] != pi[t]) mx = pi[t];  // NaN wins, as in torch
                const T sum = exp_shift_sum<T>(pi + a, b - a, mx);  // >= 1: the max gives exp(0)
                const T inv = T(1) / sum;
                for (int64_t t = a; t < b; ++t) pi[t] *= inv;
                lse[i * nr + r] = mx + std::log(sum);
            }
        });
    }
}

// out[r, i] (+)= sum over the row's edges t of w[i, perm[t]] x[i, ix[t]] (perm null: w[i, t]).
template <typename T, typename I, int D>
void spmm_heads(const I* ip, const I* ix, const I* perm, const T* w, const T* x, T* out,
                int64_t nr, int64_t nc, int64_t e, int64_t h, bool accumulate) {
    const int64_t hd = h * D;
    for (int64_t i = 0; i < h; ++i) {
        const T* wi = w + i * e;
        const T* xi = x + i * nc * D;
        at::parallel_for(0, nr, kGrain, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                row_gather<T, I, D>(wi, ix, perm, ip[r], ip[r + 1], xi, out + r * hd + i * D,
                                    accumulate);
        });
    }
}

// dS = scale · P ⊙ (dP - rowsum(P ⊙ dP)) with dP = dy[r]·v[c] on every edge -> [h, E].
template <typename T, typename I, int D>
void softmax_grad(const I* ip, const I* ix, const T* v, const T* p, const T* dy, T* ds,
                  int64_t nr, int64_t nc, int64_t e, int64_t h, T scale) {
    for (int64_t i = 0; i < h; ++i) {
        const T* pi = p + i * e;
        T* dsi = ds + i * e;
        const T* vi = v + i * nc * D;
        const T* dyi = dy + i * nr * D;
        at::parallel_for(0, nr, kGrain, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const int64_t a = ip[r], b = ip[r + 1];
                const T* dyr = dyi + r * D;
                for (int64_t t = a; t < b; ++t) dsi[t] = dot<T, D>(dyr, vi + int64_t(ix[t]) * D);
                T delta = T(0);
                for (int64_t t = a; t < b; ++t) delta += pi[t] * dsi[t];
                for (int64_t t = a; t < b; ++t) dsi[t] = scale * pi[t] * (dsi[t] - delta);
            }
        });
    }
}

void check_index(const at::Tensor& x, const at::Tensor& like, const char* name) {
    TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 1, name,
                " must be a contiguous 1-D CPU tensor");
    TORCH_CHECK(x.scalar_type() == like.scalar_type(), name, " must have the indices' dtype");
}

// indptr [rows + 1] and indices [E] of one index dtype; rows < 0: not checked here
void check_csr(const at::Tensor& indptr, const at::Tensor& indices, int64_t rows) {
    check_index(indices, indices, "indices");
    check_index(indptr, indices, "indptr");
    TORCH_CHECK(rows < 0 || indptr.numel() == rows + 1, "indptr must have Nr + 1 entries");
}

void check_dense(const at::Tensor& x, const at::Tensor& like, const char* name) {
    TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.device().is_cpu(), name,
                " must be a contiguous head-major [h, N, d] CPU tensor");
    TORCH_CHECK(x.scalar_type() == like.scalar_type() && x.size(0) == like.size(0) &&
                    x.size(2) == like.size(2),
                name, " must match the other operands' dtype, heads and width");
}

void check_values(const at::Tensor& w, const at::Tensor& like, int64_t e, const char* name) {
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(0) == like.size(0) &&
                    w.size(1) == e && w.scalar_type() == like.scalar_type(),
                name, " must be contiguous [h, E] values of the operands' dtype");
}

// f.template operator()<T, I, D>() for the dtype, the index dtype and d in {8, 16, 32, 64}
// (compile-time widths: fixed-length vector loops); other widths use torch's kernels.
template <typename F>
void dispatch(const at::Tensor& dense, const at::Tensor& index, int64_t d, F&& f) {
    AT_DISPATCH_FLOATING_TYPES(dense.scalar_type(), "plexgt_attention", [&] {
        using T = scalar_t;
        auto by_d = [&](auto tag) {
            using I = decltype(tag);
            switch (d) {
                case 8: f.template operator()<T, I, 8>(); break;
                case 16: f.template operator()<T, I, 16>(); break;
                case 32: f.template operator()<T, I, 32>(); break;
                case 64: f.template operator()<T, I, 64>(); break;
                default: TORCH_CHECK(false, "head width ", d, " is not one of 8, 16, 32, 64");
            }
        };
        if (index.scalar_type() == at::kInt) by_d(int32_t{});
        else if (index.scalar_type() == at::kLong) by_d(int64_t{});
        else TORCH_CHECK(false, "CSR indices must be int32 or int64");
    });
}

}  // namespace

// indptr [Nr+1], indices [E]; qh [h, Nr, d], kh [h, Nc, d] -> (p [h, E], lse [h, Nr])
std::vector<at::Tensor> scores(at::Tensor indptr, at::Tensor indices, at::Tensor qh,
                               at::Tensor kh, double scale) {
    check_dense(qh, qh, "q");
    check_dense(kh, qh, "k");
    const int64_t h = qh.size(0), nr = qh.size(1), d = qh.size(2), nc = kh.size(1);
    const int64_t e = indices.numel();
    check_csr(indptr, indices, nr);
    auto p = at::empty({h, e}, qh.options());
    auto lse = at::empty({h, nr}, qh.options());
    dispatch(qh, indices, d, [&]<typename T, typename I, int D>() {
        scores_softmax<T, I, D>(indptr.data_ptr<I>(), indices.data_ptr<I>(), qh.data_ptr<T>(),
                                kh.data_ptr<T>(), p.data_ptr<T>(), lse.data_ptr<T>(), nr, nc,
                                e, h, static_cast<T>(scale));
    });
    return {p, lse};
}

// indptr [Nr+1], indices [E], perm [E] or None; w [h, E] (indexed by perm when given);
// xh [h, Nc, d] -> out [Nr, h, d], new or, when given, accumulated into in place (a residual
// added without another pass over it)
at::Tensor spmm(at::Tensor indptr, at::Tensor indices, std::optional<at::Tensor> perm,
                at::Tensor w, at::Tensor xh, std::optional<at::Tensor> out) {
    check_csr(indptr, indices, -1);  // Nr is indptr's length here
    if (perm) check_index(*perm, indices, "perm");
    check_dense(xh, xh, "x");
    const int64_t h = xh.size(0), nc = xh.size(1), d = xh.size(2), nr = indptr.numel() - 1;
    const int64_t e = indices.numel();
    check_values(w, xh, e, "w");
    const bool accumulate = out.has_value();
    at::Tensor o = accumulate ? *out : at::empty({nr, h, d}, xh.options());
    if (accumulate)
        TORCH_CHECK(o.is_contiguous() && o.dim() == 3 && o.size(0) == nr && o.size(1) == h &&
                        o.size(2) == d && o.scalar_type() == xh.scalar_type(),
                    "out must be a contiguous [Nr, h, d] tensor of the operands' dtype");
    dispatch(xh, indices, d, [&]<typename T, typename I, int D>() {
        spmm_heads<T, I, D>(indptr.data_ptr<I>(), indices.data_ptr<I>(),
                            perm ? perm->data_ptr<I>() : nullptr, w.data_ptr<T>(),
                            xh.data_ptr<T>(), o.data_ptr<T>(), nr, nc, e, h, accumulate);
    });
    return o;
}

// indptr [Nr+1], indices [E]; vh [h, Nc, d], p [h, E], dyh [h, Nr, d] -> ds [h, E]
at::Tensor score_grad(at::Tensor indptr, at::Tensor indices, at::Tensor vh, at::Tensor p,
                      at::Tensor dyh, double scale) {
    check_dense(dyh, dyh, "dy");
    check_dense(vh, dyh, "v");
    const int64_t h = dyh.size(0), nr = dyh.size(1), d = dyh.size(2), nc = vh.size(1);
    const int64_t e = indices.numel();
    check_csr(indptr, indices, nr);
    check_values(p, dyh, e, "p");
    auto ds = at::empty_like(p);
    dispatch(dyh, indices, d, [&]<typename T, typename I, int D>() {
        softmax_grad<T, I, D>(indptr.data_ptr<I>(), indices.data_ptr<I>(), vh.data_ptr<T>(),
                              p.data_ptr<T>(), dyh.data_ptr<T>(), ds.data_ptr<T>(), nr, nc, e,
                              h, static_cast<T>(scale));
    });
    return ds;
}

// lowbias32 (C. Wellons): the finaliser plexgt.ops.rng computes in int64 tensor arithmetic,
// here on uint32 (unsigned wrap-around is defined), so both give the same bits.
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

template <typename T>
void dropout_rows(const int64_t* rk, const uint32_t* cj, uint32_t c, T s, T* o, int64_t n,
                  int64_t m) {
    at::parallel_for(0, n, 256, [=](int64_t r0, int64_t r1) {
        // by-value copies and a multiply instead of `cond ? s : 0`: with the lambda's
        // references gcc emitted a masked load per element and left the loop scalar (11 ns
        // per element against 0.7 vectorised)
        for (int64_t i = r0; i < r1; ++i) {
            const uint32_t r = static_cast<uint32_t>(rk[i]);
            T* row = o + i * m;
#pragma omp simd
            for (int64_t j = 0; j < m; ++j)
                row[j] = s * static_cast<T>(mix32(r ^ cj[j]) >= c);
        }
    });
}

// row_keys [n], col_keys [m] int64 (32-bit values: the mixed row and column keys of
// plexgt.ops.rng.CounterRNG); like: dtype -> [n, m] of `scale` where mix32(row ^ col) >= cut,
// else 0 (the inverted-dropout multiplier in one pass)
at::Tensor dropout_scale(at::Tensor row_keys, at::Tensor col_keys, int64_t cut, double scale,
                         at::Tensor like) {
    TORCH_CHECK(row_keys.dim() == 1 && col_keys.dim() == 1 && row_keys.is_contiguous() &&
                    col_keys.is_contiguous() && row_keys.scalar_type() == at::kLong &&
                    col_keys.scalar_type() == at::kLong && row_keys.device().is_cpu() &&
                    col_keys.device().is_cpu(),
                "row and column keys must be contiguous 1-D int64 CPU tensors");
    TORCH_CHECK(cut >= 0 && cut <= (int64_t{1} << 32), "the cut must be in [0, 2^32]");
    const int64_t n = row_keys.numel(), m = col_keys.numel();
    auto out = at::empty({n, m}, like.options());
    const int64_t* rk = row_keys.data_ptr<int64_t>();
    const int64_t* ck = col_keys.data_ptr<int64_t>();
    if (cut > int64_t{0xFFFFFFFF}) return out.zero_();  // p = 1: nothing kept
    // 32-bit lanes throughout (keys, hash, compare), so the row loop vectorises
    std::vector<uint32_t> cols(m);
    for (int64_t j = 0; j < m; ++j) cols[j] = static_cast<uint32_t>(ck[j]);
    const uint32_t c = static_cast<uint32_t>(cut);
    AT_DISPATCH_FLOATING_TYPES(like.scalar_type(), "plexgt_dropout", [&] {
        dropout_rows<scalar_t>(rk, cols.data(), c, static_cast<scalar_t>(scale),
                               out.data_ptr<scalar_t>(), n, m);
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dropout_scale", &dropout_scale,
          "counter-based inverted-dropout multipliers [n, m] from row and column keys");
    m.def("scores", &scores, "edge scores and row softmax -> (p [h, E], lse [h, Nr])");
    m.def("spmm", &spmm, "[h, E] values x head-major [h, Nc, d] -> [Nr, h, d] (or += into out)");
    m.def("score_grad", &score_grad, "softmax backward on the edges -> dS [h, E]");
}
