// 4-bit weights times 8-bit activations on a CPU: unmask's int4 linear kernel (unmask/layers/int4.py,
// which builds it with the machine's C++ compiler and calls it through ctypes: a C ABI, no
// PyTorch headers, so it builds in a second or two).
//
// Weights (N rows of K inputs): 4-bit codes in llama.cpp's Q4_0 byte layout (groups of 32 inputs,
// 16 bytes each, byte j holding element j in its low nibble and element j + 16 in its high one),
// and per group a signed 8-bit scale code c (stored as c + 128): the group's scale over the row's
// largest, times 127. A nibble q of a group with code c is the int8 weight LUT[c][q] =
// round((q - 8) * c / 8), times the row's float scale r[n]: the group's 4-bit value on the row's
// int8 grid (c = +-127 the row's largest group, whose -8 is -+127). So a
// 4-bit weight unpacks to int8 with one table lookup (vpshufb) and the multiply is int8 x int8 with
// int32 sums over the whole row, as an int8 kernel's; no float work per group.
// K is padded to a multiple of 64 (padding groups: code 0, stored 128) and N to a multiple of 8 (zero rows).
//
// Activations are quantized per row to int8 (scale = max |x| / 127). AVX512-VNNI multiplies
// unsigned by signed bytes, so there the activations go in shifted by 128 and 128 * sum(w8) of the
// row (`corr`) comes off; AVX2 multiplies |x| by w8 carrying x's sign. Every path forms the same
// exact integer D[m, n] = sum_k xq[m, k] * w8[n, k], and y[m, n] = sx[m] * r[n] * D[m, n]: a row's
// output does not depend on the other rows, the row count or the instruction set.
//
// AVX512-VNNI (Zen 4; Xeons since Ice Lake): a register holds 4 weight rows x 16 inputs, one
// 128-bit lane per row and its 16 inputs inside one group, so one vpshufb with the 4 rows' tables
// unpacks 64 weights. Parallel over blocks of NB weight rows (OpenMP, the thread count passed in):
// a block is unpacked over all inputs into a thread's buffer, then register tiles of MR
// activation rows x NC lane groups pass over it (each activation's 16 inputs broadcast to the 4
// lanes), while the next block's nibbles are prefetched, so its unpacking does not wait on memory.
// MR = 4, NC = 4, NB = 16 measured best of those tried on an AMD EPYC (Zen 4, 2 threads:
// benchmarks/int4_kernels.py): faster than PyTorch's int8 (FBGEMM) at 1 to 64 rows on LLaDA-8B's
// shapes, where a register holding one row x 64 inputs (the AVX2 path's layout, formerly this
// one's too) was 1.2-1.5x slower from 8 rows.
//
// Offsets (a GGUF Q4_K tensor's minimums, unmask/layers/int4.py): optional int8 codes per group,
// oc (Kp/64, Np, 2): pairs of groups, and a float scale per weight row, ro (Np,): y[m, n] += sx[m] * ro[n] * sum_g
// oc[n, g] * S[m, g], S the group sums of the row's int8 activations. Integer sums again, so the
// invariants above hold; a pass after the product, the same on every instruction set.
//
// AVX2 / plain C++: blocks of NT weight rows unpacked once into a thread's buffer, in the order
// the nibbles come out of a 32-byte load (per 64 inputs: 0-15, 32-47, 16-31, 48-63; activations
// in that order too), then tiles of MT activation rows pass over it, the inputs in chunks of KC.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VNNI 1
#else
#define VNNI 0
#endif

namespace {

constexpr int64_t G = 32;  // inputs per group
#if !VNNI  // the AVX2 / plain C++ kernel's blocking
#ifndef INT4_NT
#define INT4_NT 2
#endif
#ifndef INT4_MT
#define INT4_MT 8
#endif
constexpr int NT = INT4_NT;  // weight rows unpacked together (the output rows of one task)
constexpr int MTX = INT4_MT;  // activation rows per register tile
#ifndef INT4_KC
#define INT4_KC 2048
#endif
constexpr int64_t KC = INT4_KC;  // inputs per chunk (a multiple of 64)
#endif

struct Table {
  alignas(64) int8_t v[256][16];
  Table() {
    for (int c = 0; c < 256; ++c)
      for (int q = 0; q < 16; ++q)
        v[c][q] = static_cast<int8_t>(std::max(-127.0, std::min(127.0, std::nearbyint((q - 8) * (c - 128) / 8.0))));
  }
};
const Table LUT;

#if VNNI
constexpr bool SHIFTED = true;  // activations stored + 128 (unsigned)
#else
constexpr bool SHIFTED = false;
#endif

// One row of activations -> 64-aligned bytes in nibble order; returns the row's scale (0 for a row of zeros).
float quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* out, bool natural, int16_t* sums) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float s = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / s;
  static const int where[4] = {0, 32, 16, 48};  // the 16-wide runs of 64 inputs, in nibble order
  for (int64_t b = 0; b < Kp; b += 64)
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 16; ++j) {
        const int64_t k = b + (natural ? 16 * r : where[r]) + j;
        const int v = k < K ? static_cast<int>(std::max(-127.f, std::min(127.f, std::nearbyint(x[k] * inv)))) : 0;
        out[b + 16 * r + j] = static_cast<uint8_t>(SHIFTED ? v + 128 : static_cast<int8_t>(v));
      }
  if (sums)  // each group's sum of the int8 values (|sum| <= 32 * 127), apart: the loop above vectorizes
    for (int64_t b = 0; b < Kp; b += 64)
      for (int r = 0; r < 4; ++r) {
        const int64_t g = (b + (natural ? 16 * r : where[r])) / G;  // a 16-wide run lies in one group
        int32_t t = 0;
        for (int j = 0; j < 16; ++j) t += SHIFTED ? static_cast<int32_t>(out[b + 16 * r + j]) - 128
                                                 : static_cast<int32_t>(static_cast<int8_t>(out[b + 16 * r + j]));
        sums[g] = static_cast<int16_t>(sums[g] + t);
      }
  return amax > 0.f ? s : 0.f;
}

#if !VNNI
// Unpack NT weight rows (n0..n0+NT-1) into int8 w8 in nibble order: buf[i * Kp + k].
void unpack(const uint8_t* w, const uint8_t* codes, int64_t Kp, int8_t* buf) {
  const int64_t half = Kp / 2, groups = Kp / G;
  for (int i = 0; i < NT; ++i) {
    const uint8_t* wr = w + i * half;
    const uint8_t* cr = codes + i * groups;
    int8_t* out = buf + i * Kp;
#if defined(__AVX2__)
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int64_t p = 0; p < Kp / 64; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + 32 * p));
      const __m256i lut = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[2 * p]]))),
          _mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[2 * p + 1]])), 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * p), _mm256_shuffle_epi8(lut, _mm256_and_si256(v, lo4)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * p + 32),
                          _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4)));
    }
#else
    for (int64_t p = 0; p < Kp / 64; ++p)
      for (int h = 0; h < 2; ++h)  // the pair's two groups: first 16 inputs at 16 h, last 16 at 32 + 16 h
        for (int j = 0; j < 16; ++j) {
          const uint8_t b = wr[32 * p + 16 * h + j];
          out[64 * p + 16 * h + j] = LUT.v[cr[2 * p + h]][b & 15];
          out[64 * p + 32 + 16 * h + j] = LUT.v[cr[2 * p + h]][b >> 4];
        }
#endif
  }
}

#if defined(__AVX2__)
using Acc = __m256i;
inline Acc acc_zero() { return _mm256_setzero_si256(); }
inline int32_t acc_sum(Acc a) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}
#else
using Acc = int32_t;
inline Acc acc_zero() { return 0; }
inline int32_t acc_sum(Acc a) { return a; }
#endif

// D over inputs [k0, k1) for NT unpacked weight rows x MT activation rows, added to st[i * MT + m].
template <int MT>
void tile(const int8_t* w8, int64_t Kp, int64_t k0, int64_t k1, const uint8_t* const* xr, Acc* st) {
#if defined(__AVX2__)
  __m256i a[NT][MT];
  for (int i = 0; i < NT; ++i)
    for (int m = 0; m < MT; ++m) a[i][m] = st[i * MT + m];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = k0; k < k1; k += 32) {
    __m256i ax[MT], x[MT];
    for (int m = 0; m < MT; ++m) {
      x[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[m] + k));
      ax[m] = _mm256_abs_epi8(x[m]);
    }
    for (int i = 0; i < NT; ++i) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w8 + i * Kp + k));
      for (int m = 0; m < MT; ++m)  // |x| * (w with x's sign): pairs at most 2 * 127 * 127, no saturation
        a[i][m] = _mm256_add_epi32(a[i][m], _mm256_madd_epi16(_mm256_maddubs_epi16(ax[m], _mm256_sign_epi8(w, x[m])), ones));
    }
  }
  for (int i = 0; i < NT; ++i)
    for (int m = 0; m < MT; ++m) st[i * MT + m] = a[i][m];
#else
  for (int i = 0; i < NT; ++i)
    for (int m = 0; m < MT; ++m) {
      int32_t d = 0;
      for (int64_t k = k0; k < k1; ++k) d += int32_t(static_cast<int8_t>(xr[m][k])) * int32_t(w8[i * Kp + k]);
      st[i * MT + m] += d;
    }
#endif
}

// Inputs [k0, k1) of activation rows [m0, m0 + MT) against the unpacked block.
template <int MT>
void span(const int8_t* w8, int64_t Kp, int64_t k0, int64_t k1, const uint8_t* xq, int64_t m0, Acc* st) {
  const uint8_t* xr[MT];
  for (int m = 0; m < MT; ++m) xr[m] = xq + (m0 + m) * Kp;
  tile<MT>(w8, Kp, k0, k1, xr, st + m0 * NT);
}
#endif

#if VNNI
// AVX512-VNNI: a register holds 4 weight rows x 16 inputs, one 128-bit lane per row, the lane's 16
// inputs inside one group so one vpshufb with per-lane tables unpacks them. Weight rows are
// unpacked NB at a time (NB / 4 lane groups) over the whole input into a thread's buffer laid out
// [16 inputs][lane group][64 bytes]; then tiles of MR activation rows x NC lane groups pass over
// it, the activation's 16 inputs broadcast to every lane, and each lane's 4 partial sums are added
// at the end. Activations in natural order here.
#ifndef INT4_MR
#define INT4_MR 4
#endif
#ifndef INT4_NC
#define INT4_NC 4
#endif
constexpr int MR = INT4_MR;  // activation rows per register tile
constexpr int NC = INT4_NC;  // lane groups (4 weight rows each) per register tile
#ifndef INT4_NBM
#define INT4_NBM 1
#endif
constexpr int NB = 4 * NC * INT4_NBM;  // weight rows unpacked together

// a += x (unsigned bytes) . w (signed bytes), per dword. In assembly: around the intrinsic, GCC 12
// moves the tile's accumulators between registers each step (measured 1.25x slower at 32-64 rows).
#define UNROLL _Pragma("GCC unroll 16")
inline void dpbusd(__m512i& a, __m512i x, __m512i w) { asm("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(x), "v"(w)); }

// Weight rows n0 .. n0 + 4 * ngroups - 1 (lane groups of 4) into buf[(k16 * ngroups + c) * 64 + lane * 16 + j].
void unpack_lanes(const uint8_t* w, const uint8_t* codes, int64_t Kp, int64_t ngroups, int8_t* buf) {
  const int64_t half = Kp / 2, groups = Kp / G;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  for (int64_t c = 0; c < ngroups; ++c) {
    const uint8_t* wr = w + 4 * c * half;
    const uint8_t* cr = codes + 4 * c * groups;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + 16 * g)));
      __m512i t = _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[g]])));
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + half + 16 * g)), 1);
      t = _mm512_inserti32x4(t, _mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[groups + g]])), 1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + 2 * half + 16 * g)), 2);
      t = _mm512_inserti32x4(t, _mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[2 * groups + g]])), 2);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + 3 * half + 16 * g)), 3);
      t = _mm512_inserti32x4(t, _mm_load_si128(reinterpret_cast<const __m128i*>(LUT.v[cr[3 * groups + g]])), 3);
      _mm512_store_si512(buf + ((2 * g) * ngroups + c) * 64, _mm512_shuffle_epi8(t, _mm512_and_si512(v, lo4)));
      _mm512_store_si512(buf + ((2 * g + 1) * ngroups + c) * 64,
                         _mm512_shuffle_epi8(t, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4)));
    }
  }
}

// Rows m0 .. m0 + R - 1 of the activations against lane groups c0 .. c0 + C - 1 of the block, over
// all inputs: the raw sums (each lane's 4 dwords added) into d[m * 4 * C + 4 * c + lane].
// Cache lines of the next block's weights to fetch while this block multiplies (its unpacking then
// finds them in cache instead of waiting on memory): `n` lines from `p`, `per` each 16 inputs.
struct Ahead {
  const char* p;
  int64_t n, per;
};

template <int R, int C>
void lanes_tile(const int8_t* buf, int64_t ngroups, int64_t c0, const uint8_t* xq, int64_t Kp, int32_t* d,
                Ahead ahead) {
  __m512i a[R][C];
  UNROLL for (int m = 0; m < R; ++m)
    UNROLL for (int c = 0; c < C; ++c) a[m][c] = _mm512_setzero_si512();
  const int8_t* wp = buf + c0 * 64;
  int64_t line = 0;
  for (int64_t k = 0; k < Kp; k += 16, wp += ngroups * 64) {
    for (int64_t j = 0; j < ahead.per && line < ahead.n; ++j, ++line) _mm_prefetch(ahead.p + 64 * line, _MM_HINT_T1);
    __m512i w[C];
    UNROLL for (int c = 0; c < C; ++c) w[c] = _mm512_load_si512(wp + 64 * c);
    UNROLL for (int m = 0; m < R; ++m) {
      const __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + m * Kp + k)));
      UNROLL for (int c = 0; c < C; ++c) dpbusd(a[m][c], x, w[c]);
    }
  }
  UNROLL for (int m = 0; m < R; ++m)
    UNROLL for (int c = 0; c < C; ++c) {
      __m512i s = _mm512_add_epi32(a[m][c], _mm512_shuffle_epi32(a[m][c], _MM_PERM_BADC));
      s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));  // every dword: its lane's sum
      alignas(64) int32_t t[16];
      _mm512_store_si512(t, s);
      for (int l = 0; l < 4; ++l) d[m * 4 * C + 4 * c + l] = t[4 * l];
    }
}

// (An explicit switch: a compile-time recursive dispatch over R and C, tried with GCC 12, ran the
// 4 x 4 tile 2x slower from 8 rows, measured.)
template <int C>
void lanes_rows(const int8_t* buf, int64_t ngroups, int64_t c0, const uint8_t* xq, int64_t Kp, int64_t rows,
                int32_t* d, Ahead ahead) {
  switch (rows) {
    case 1: return lanes_tile<1, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 2: return lanes_tile<2, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 3: return lanes_tile<3, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 4: return lanes_tile<4, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 5: return lanes_tile<5, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 6: return lanes_tile<6, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    case 7: return lanes_tile<7, C>(buf, ngroups, c0, xq, Kp, d, ahead);
    default: return lanes_tile<MR, C>(buf, ngroups, c0, xq, Kp, d, ahead);
  }
}

void lanes(const int8_t* buf, int64_t ngroups, int64_t c0, int64_t nc, const uint8_t* xq, int64_t Kp, int64_t rows,
           int32_t* d, Ahead ahead) {
  static_assert(NC >= 1 && NC <= 4, "lane groups per tile: 1 to 4");
  switch (nc) {
    case 1: return lanes_rows<1>(buf, ngroups, c0, xq, Kp, rows, d, ahead);
    case 2: return lanes_rows<NC >= 2 ? 2 : 1>(buf, ngroups, c0, xq, Kp, rows, d, ahead);
    case 3: return lanes_rows<NC >= 3 ? 3 : 1>(buf, ngroups, c0, xq, Kp, rows, d, ahead);
    default: return lanes_rows<NC>(buf, ngroups, c0, xq, Kp, rows, d, ahead);
  }
}
#endif
}  // namespace

// x (M, K) float32; packed (Np, Kp/2) uint8 nibbles; codes (Np, Kp/32) uint8; r (Np,) float32;
// corr (Np,) int32 = 128 * sum of the row's int8 weights; y (M, N) float32, N the real output rows;
// oc (Kp/64, Np, 2) int16 (pairs of groups) and ro (Np,) float32: the groups' offsets, or both null; threads: how many
// OpenMP threads (PyTorch's count, passed in). Returns 0, or 1 if the shapes do not fit.
extern "C" int unmask_int4_linear(const float* xp, int64_t M, int64_t K, const uint8_t* w, const uint8_t* cd,
                                  const float* rp, const int32_t* cr, int64_t Np, int64_t Kp, int64_t N, float* yp,
                                  const int16_t* oc, const float* ro, int threads) {
  if (Kp % 64 != 0 || Kp < K || Kp - K >= 64 || Np % 8 != 0 || N > Np) return 1;
  std::vector<uint8_t> xq(static_cast<size_t>(M * Kp));
  std::vector<float> xs(static_cast<size_t>(M));
  const int64_t Gk = Kp / G;
  std::vector<int16_t> gs(oc ? static_cast<size_t>(M * Gk) : 0);
  uint8_t* q = xq.data();
  float* s = xs.data();
#pragma omp parallel for num_threads(threads) schedule(static) if (M >= 16)
  for (int64_t m = 0; m < M; ++m) s[m] = quantize_row(xp + m * K, K, Kp, q + m * Kp, SHIFTED, oc ? gs.data() + m * Gk : nullptr);
#if VNNI
  const int64_t lane_groups = Np / 4, per_block = NB / 4, blocks = (lane_groups + per_block - 1) / per_block;
#pragma omp parallel num_threads(threads)
  {
    std::vector<int8_t> raw(static_cast<size_t>(NB * Kp + 64));
    int8_t* buf = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t(63));
    int32_t d[MR * 4 * NC];
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t g0 = b * per_block, ng = std::min(per_block, lane_groups - g0);
      unpack_lanes(w + 4 * g0 * (Kp / 2), cd + 4 * g0 * (Kp / G), Kp, ng, buf);
      // the next block's nibbles (its rows are contiguous), spread over this block's tiles
      const int64_t next = std::min(per_block, std::max<int64_t>(0, lane_groups - g0 - per_block));
      const int64_t lines = next * 4 * (Kp / 2) / 64, tiles = (M + MR - 1) / MR * ((ng + NC - 1) / NC);
      const int64_t per_tile = (lines + tiles - 1) / tiles;
      const char* nxt = reinterpret_cast<const char*>(w + 4 * (g0 + per_block) * (Kp / 2));
      int64_t tile = 0;
      for (int64_t m0 = 0; m0 < M; m0 += MR) {
        const int64_t rows = std::min<int64_t>(MR, M - m0);
        for (int64_t c0 = 0; c0 < ng; c0 += NC, ++tile) {
          const int64_t nc = std::min<int64_t>(NC, ng - c0);
          const int64_t first = std::min(lines, tile * per_tile), count = std::min(lines, first + per_tile) - first;
          lanes(buf, ng, c0, nc, q + m0 * Kp, Kp, rows, d,
                Ahead{nxt + 64 * first, count, (count + Kp / 16 - 1) / (Kp / 16)});
          for (int64_t m = 0; m < rows; ++m)
            for (int64_t j = 0; j < 4 * nc; ++j) {
              const int64_t n = 4 * (g0 + c0) + j;
              if (n < N) yp[(m0 + m) * N + n] = s[m0 + m] * rp[n] * static_cast<float>(d[m * 4 * nc + j] - cr[n]);
            }
        }
      }
    }
  }
#else
  const int64_t chunk = std::min<int64_t>(Kp, KC);
#pragma omp parallel num_threads(threads)
  {
    std::vector<int8_t> buf(NT * Kp + 64);
    int8_t* w8 = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    std::vector<Acc> st(NT * M);  // tile of rows m0..: st[m0 * NT + i * MT + m]
#pragma omp for schedule(static)
    for (int64_t t = 0; t < Np / NT; ++t) {
      const int64_t n0 = NT * t;
      unpack(w + n0 * (Kp / 2), cd + n0 * (Kp / G), Kp, w8);
      std::fill(st.begin(), st.end(), acc_zero());
      // inputs in chunks, so a chunk of the block and of each activation tile stay in L1 while
      // every tile passes over it
      for (int64_t k0 = 0; k0 < Kp; k0 += chunk) {
        const int64_t k1 = std::min(Kp, k0 + chunk);
        int64_t m = 0;
        for (; m + MTX <= M; m += MTX) span<MTX>(w8, Kp, k0, k1, q, m, st.data());
        for (; m < M; ++m) span<1>(w8, Kp, k0, k1, q, m, st.data());
      }
      for (int64_t m0 = 0; m0 < M;) {
        const int mt = M - m0 >= MTX && (m0 % MTX == 0) ? MTX : 1;
        for (int i = 0; i < NT && n0 + i < N; ++i)
          for (int m = 0; m < mt; ++m) {
            const int32_t raw = acc_sum(st[m0 * NT + i * mt + m]);
            const int32_t d = SHIFTED ? raw - cr[n0 + i] : raw;
            yp[(m0 + m) * N + n0 + i] = s[m0 + m] * rp[n0 + i] * static_cast<float>(d);
          }
        m0 += mt;
      }
    }
  }
#endif
  if (oc) {  // integer sums: the same result in any order
    // along the output rows, a block of them per task: each row m and pair of groups (g, g + 1)
    // add S[m, g] oc[g, n] + S[m, g + 1] oc[g + 1, n] for the block's n at once (vpmaddwd: oc is
    // (Kp/64, Np, 2) int16, a pair of groups' codes side by side for each output row)
    const int16_t* sums = gs.data();
    constexpr int64_t OB = 256;  // output rows per block
#pragma omp parallel num_threads(threads)
    {
      alignas(64) int32_t a[OB];
#pragma omp for schedule(static)
      for (int64_t n0 = 0; n0 < N; n0 += OB) {
        const int64_t nb = std::min(OB, N - n0);
        for (int64_t m = 0; m < M; ++m) {
          const int16_t* sm = sums + m * Gk;
          int64_t done = 0;
#if VNNI
          const int64_t full = nb / 16;
          __m512i acc[OB / 16];
          for (int64_t b = 0; b < full; ++b) acc[b] = _mm512_setzero_si512();
          for (int64_t gp = 0; gp < Gk / 2; ++gp) {
            const uint32_t pair = static_cast<uint16_t>(sm[2 * gp]) |
                                  (static_cast<uint32_t>(static_cast<uint16_t>(sm[2 * gp + 1])) << 16);
            const __m512i sp = _mm512_set1_epi32(static_cast<int32_t>(pair));
            const int16_t* o = oc + 2 * (gp * Np + n0);
            for (int64_t b = 0; b < full; ++b)
              acc[b] = _mm512_add_epi32(acc[b], _mm512_madd_epi16(sp, _mm512_loadu_si512(o + 32 * b)));
          }
          for (int64_t b = 0; b < full; ++b) _mm512_store_si512(a + 16 * b, acc[b]);
          done = 16 * full;
#endif
          for (int64_t j = done; j < nb; ++j) {
            int32_t t = 0;
            for (int64_t g = 0; g < Gk; ++g) t += static_cast<int32_t>(sm[g]) * oc[2 * ((g / 2) * Np + n0 + j) + g % 2];
            a[j] = t;
          }
          float* y = yp + m * N + n0;
          for (int64_t j = 0; j < nb; ++j) y[j] += s[m] * ro[n0 + j] * static_cast<float>(a[j]);
        }
      }
    }
  }
  return 0;
}

// The int8 table the kernel unpacks with (256 codes x 16 nibbles), for the Python side's reference.
extern "C" void unmask_int4_table(int8_t* out) { std::memcpy(out, LUT.v, sizeof(LUT.v)); }

extern "C" const char* unmask_int4_isa() {
#if VNNI
  return "avx512-vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}
