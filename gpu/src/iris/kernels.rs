//! The two small CUDA kernels of the scan, compiled at run time with NVRTC (no CUDA compiler
//! is needed to build privmatch): the limb split of uploaded rows and the combine of the GEMM
//! accumulators into u16 shares. Both are elementwise and memory-bound; the arithmetic is that
//! of [`super::limbs::split`] and [`super::limbs::combine`], which the CPU emulation and its tests
//! pin to the CPU kernel.

/// Name of the split kernel in [`SOURCE`].
pub const SPLIT_ROWS: &str = "privmatch_split_rows";
/// Name of the combine kernel in [`SOURCE`].
pub const COMBINE: &str = "privmatch_combine";

/// Threads per block of both kernels.
pub const BLOCK_THREADS: u32 = 256;

/// CUDA C source of the kernels.
///
/// `privmatch_split_rows(src, dst_rows, count, k, dst)`: `src` holds `count` rows of `k` u16
/// coefficients; row i is written in limb form `[lo(k) | hi(k)]` to row `dst_rows[i]` of the
/// resident int8 matrix `dst` (rows of 2k bytes). Four coefficients per thread, read as one
/// 8-byte word (k is a multiple of 4).
///
/// `privmatch_combine(acc, ld, rotations, rows, out)`: `acc` is the GEMM output, column-major
/// with `ld` int32 per database row (two per rotation, then padding); `out[e·R + r]` =
/// `(acc[e·ld + 2r] + 256·acc[e·ld + 2r + 1]) mod 2^16`, entry-major like the CPU scan.
pub const SOURCE: &str = r#"
extern "C" __global__ void privmatch_split_rows(
    const unsigned short* __restrict__ src,
    const unsigned int* __restrict__ dst_rows,
    unsigned int count,
    unsigned int k,
    signed char* __restrict__ dst)
{
    const unsigned int quads = k / 4;
    const unsigned long long total = (unsigned long long)count * quads;
    for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         t < total;
         t += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int i = (unsigned int)(t / quads);
        const unsigned int q = (unsigned int)(t % quads);
        const unsigned long long word =
            *reinterpret_cast<const unsigned long long*>(src + (unsigned long long)i * k + 4 * q);
        unsigned int lo = 0, hi = 0;
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
            const unsigned short x = (unsigned short)(word >> (16 * c));
            const unsigned char l = (unsigned char)(x & 0xff);
            // x - lo, with lo read as a signed byte: a multiple of 256 modulo 2^16.
            const unsigned short rest = (unsigned short)(x - (unsigned short)(short)(signed char)l);
            lo |= (unsigned int)l << (8 * c);
            hi |= (unsigned int)(rest >> 8) << (8 * c);
        }
        signed char* row = dst + (unsigned long long)dst_rows[i] * 2 * k;
        *reinterpret_cast<unsigned int*>(row + 4 * q) = lo;
        *reinterpret_cast<unsigned int*>(row + k + 4 * q) = hi;
    }
}

extern "C" __global__ void privmatch_combine(
    const int* __restrict__ acc,
    unsigned int ld,
    unsigned int rotations,
    unsigned int rows,
    unsigned short* __restrict__ out)
{
    const unsigned long long total = (unsigned long long)rows * rotations;
    for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         t < total;
         t += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long e = t / rotations;
        const unsigned int r = (unsigned int)(t % rotations);
        const unsigned int low = (unsigned int)acc[e * ld + 2 * r];
        const unsigned int cross = (unsigned int)acc[e * ld + 2 * r + 1];
        out[t] = (unsigned short)(low + (cross << 8));
    }
}
"#;
