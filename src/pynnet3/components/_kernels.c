/* Compiled elementwise kernels of pynnet3 (loaded with ctypes by c_kernels.py).

   No Python API: plain C functions on raw float32 pointers with row strides (in
   elements; the inner dimension contiguous). Each kernel is compiled twice, for
   AVX-512 and for AVX2+FMA, and c_kernels.py picks the one the CPU runs; on other
   CPUs (or compilers) pynnet3_cpu_level() returns 0 and the NumPy code runs instead.

   tanh is a rational approximation of our own fit (x P(x^2) / Q(x^2), degrees
   13/6, |x| clamped to 9 where tanh rounds to 1 in float32, the result to [-1, 1]):
   float64 relative error 1.5e-9, within 6 float32 ulps when evaluated in float32
   (NumPy's own float32 tanh: about 1.4 ulps). It has no branches, so the loops
   vectorize; a NaN stays NaN (the clamps' comparisons are false) and +-inf gives
   +-1.

   exp (for log-softmax: arguments <= 0) is Cody-Waite range reduction by ln 2 and a
   degree-6 polynomial of our own fit (float64 relative error 1.9e-9); arguments
   below -87 give exp(-87) instead of a subnormal or 0, which no row sum notices. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define CHUNK 256 /* cells per row handled at a time (the row's results in L1) */

/* (|x| and the sign apart: ``9 < a ? 9 : a`` and ``1 < y ? 1 : y`` are single min
   instructions that keep a NaN, where two-sided clamps cost four more per value) */
#define TANH_BODY                                                        \
    float a = __builtin_fabsf(x);                                        \
    a = 9.0f < a ? 9.0f : a;                                             \
    float t = a * a;                                                     \
    float p = -8.488770396e-14f;                                         \
    p = p * t + 5.277972157e-11f;                                        \
    p = p * t + -2.022527745e-08f;                                       \
    p = p * t + 1.115432133e-05f;                                        \
    p = p * t + 3.103957511e-03f;                                        \
    p = p * t + 1.308401078e-01f;                                        \
    p = p * t + 1.0f;                                                    \
    float q = 2.546147152e-04f;                                          \
    q = q * t + 2.449518256e-02f;                                        \
    q = q * t + 4.641733766e-01f;                                        \
    q = q * t + 1.0f;                                                    \
    float y = a * p / q;                                                 \
    y = 1.0f < y ? 1.0f : y;                                             \
    return __builtin_copysignf(y, x);

#define EXP_BODY                                                         \
    float v = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);             \
    /* (k from 0 for a NaN: no float-to-int conversion of a NaN) */      \
    float k = __builtin_rintf((v == v ? v : 0.0f) * 1.44269504f);        \
    float f = v - k * 0.693359375f;                                      \
    f = f + k * 2.12194440e-4f;                                          \
    float p = 1.383684459e-03f;                                          \
    p = p * f + 8.374815807e-03f;                                        \
    p = p * f + 4.166822508e-02f;                                        \
    p = p * f + 1.666641980e-01f;                                        \
    p = p * f + 4.999999106e-01f;                                        \
    p = p * f + 1.0f;                                                    \
    p = p * f + 1.0f;                                                    \
    union { uint32_t i; float f; } scale;                                \
    scale.i = (uint32_t)((int32_t)k + 127) << 23;                        \
    return p * scale.f;

/* One row's log-softmax, x - max - log(sum(exp(x - max))), as NumPy's path computes
   it (a NaN anywhere in the row makes the row NaN there too; x may be out). */
#define LOG_SOFTMAX_BODY(EXP)                                                    \
    for (int64_t r = 0; r < rows; r++) {                                         \
        const float *xr = x + r * xs;                                            \
        float *o = out + r * os;                                                 \
        float m = -INFINITY;                                                     \
        _Pragma("omp simd reduction(max:m)")                                     \
        for (int64_t j = 0; j < cols; j++) m = xr[j] > m ? xr[j] : m;            \
        float sum = 0.0f;                                                        \
        _Pragma("omp simd reduction(+:sum)")                                     \
        for (int64_t j = 0; j < cols; j++) sum += EXP(xr[j] - m);                \
        float ls = logf(sum);                                                    \
        _Pragma("omp simd")                                                      \
        for (int64_t j = 0; j < cols; j++) o[j] = (xr[j] - m) - ls;              \
    }

/* One LSTM row (cells [0, n)): Kaldi's LstmNonlinearity without dropout masks,
   sigmoid(v) = 0.5 tanh(0.5 v) + 0.5 as NumPy's path computes it. */
#define LSTM_ROW_BODY(TANH)                                                      \
    for (int64_t j = 0; j < n; j++) {                                            \
        float c_prev = cs * cp[j];                                               \
        float i_t = 0.5f * TANH(0.5f * (w[j] * c_prev + x[j])) + 0.5f;           \
        float f_t = 0.5f * TANH(0.5f * (w[wc + j] * c_prev + x[xc + j])) + 0.5f; \
        float c_t = f_t * c_prev + i_t * TANH(x[2 * xc + j]);                    \
        float o_t = 0.5f * TANH(0.5f * (w[2 * wc + j] * c_t + x[3 * xc + j])) + 0.5f; \
        c_out[j] = c_t;                                                          \
        m_out[j] = o_t * TANH(c_t);                                              \
    }

#define LSTM_BODY(ROW)                                                           \
    float tmp[2 * CHUNK];                                                        \
    for (int64_t r = 0; r < rows; r++) {                                         \
        for (int64_t j0 = 0; j0 < C; j0 += CHUNK) {                              \
            int64_t n = C - j0 < CHUNK ? C - j0 : CHUNK;                         \
            /* (results to tmp first: c_prev may be this row's own output) */    \
            ROW(x + r * xs + j0, C, cp + r * cps + j0, cs, w + j0, C, tmp, tmp + CHUNK, n); \
            memcpy(out + r * os + j0, tmp, (size_t)n * sizeof(float));           \
            memcpy(out + r * os + C + j0, tmp + CHUNK, (size_t)n * sizeof(float)); \
        }                                                                        \
    }

#if defined(__x86_64__) && defined(__GNUC__)

#define KERNELS(SUFFIX, TARGET)                                                  \
    static inline __attribute__((target(TARGET))) float tanh_##SUFFIX(float x) { \
        TANH_BODY                                                                \
    }                                                                            \
    static inline __attribute__((target(TARGET))) void lstm_row_##SUFFIX(       \
        const float *restrict x, int64_t xc, const float *restrict cp, float cs, \
        const float *restrict w, int64_t wc, float *restrict c_out,             \
        float *restrict m_out, int64_t n) {                                      \
        _Pragma("omp simd")                                                      \
        LSTM_ROW_BODY(tanh_##SUFFIX)                                             \
    }                                                                            \
    __attribute__((target(TARGET))) void pynnet3_lstm_forward_##SUFFIX(          \
        int64_t rows, int64_t C, const float *x, int64_t xs, const float *cp,    \
        int64_t cps, float cs, const float *w, float *out, int64_t os) {         \
        LSTM_BODY(lstm_row_##SUFFIX)                                             \
    }                                                                            \
    static inline __attribute__((target(TARGET))) float exp_##SUFFIX(float x) {  \
        EXP_BODY                                                                 \
    }                                                                            \
    __attribute__((target(TARGET))) void pynnet3_log_softmax_##SUFFIX(           \
        int64_t rows, int64_t cols, const float *x, int64_t xs, float *out,      \
        int64_t os) {                                                            \
        LOG_SOFTMAX_BODY(exp_##SUFFIX)                                           \
    }                                                                            \
    __attribute__((target(TARGET))) void pynnet3_exp_##SUFFIX(                   \
        int64_t n, const float *restrict x_in, float *restrict y) {              \
        _Pragma("omp simd")                                                      \
        for (int64_t i = 0; i < n; i++) y[i] = exp_##SUFFIX(x_in[i]);            \
    }                                                                            \
    __attribute__((target(TARGET))) void pynnet3_tanh_##SUFFIX(                  \
        int64_t n, const float *restrict x_in, float *restrict y) {              \
        _Pragma("omp simd")                                                      \
        for (int64_t i = 0; i < n; i++) y[i] = tanh_##SUFFIX(x_in[i]);           \
    }

#if defined(__clang__)
KERNELS(avx512, "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#else
KERNELS(avx512, "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")
#endif
KERNELS(avx2, "avx2,fma")

/* 2: AVX-512 (F, VL, BW, DQ), 1: AVX2 with FMA, 0: neither (use NumPy). */
int pynnet3_cpu_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 1;
    return 0;
}

#else /* other CPUs or compilers: nothing compiled, NumPy runs */

int pynnet3_cpu_level(void) { return 0; }

#endif
