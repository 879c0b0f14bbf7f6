/* The worker's pixel path with AVX-512 (VBMI, VNNI): PIL's two resampling passes and the patch layout.
 *
 * Resampling (ep_resize_horizontal, ep_resize_vertical): PIL's integers, so PIL's bytes (see the
 * section below); about half the time of the numba passes on one core (0.9 against 1.7 ms per
 * image of the benchmark's set, decoded just before, as in a worker).
 *
 * Layout (ep_layout_frames): same output, bit for bit, as pixel_kernels.layout with the preset's
 * storage table: HF's patch order (merge block rows, merge block columns, rows and columns inside
 * the block); a float32
 * value is (float(byte) * k - mean[c]) / std[c] in float32, the operations and order that build
 * the table (compiled with -ffp-contract=off: no fused multiply-add); bfloat16 rounds it to
 * nearest even; uint8 keeps the byte. Each patch row is built in L1 and streamed out with
 * non-temporal stores: the output (8 MB of float32 for a 1-megapixel image) is never read
 * before it is written, which ordinary stores would do. Measured on one core (float32):
 * 0.46 ms per image against 1.4 ms for the numba kernel.
 *
 * Loaded with ctypes (energon_pack/pixels/pixel_simd.py); the module init below only makes
 * the file a valid extension module for setuptools. Callers check ep_simd_supported() first.
 */
#include <Python.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EP_MAX_PATCH 16   /* one masked 16-lane vector per patch row and channel */
#define EP_MAX_TP 4

int ep_simd_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vnni");
}

#define EP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")))

/* mask of the first n of 64 bytes */
static inline __mmask64 ep_bytes_mask(long n) { return n >= 64 ? ~0ULL : (n <= 0 ? 0 : (1ULL << n) - 1); }

/* n bytes from src (L1) to dst: a masked store up to dst's next 64-byte boundary, non-temporal
 * stores of whole 64-byte lines after it, a masked store of the rest */
EP_TARGET static void stream_bytes(uint8_t *dst, const uint8_t *src, long n) {
    long head = (long)((64 - ((uintptr_t)dst & 63)) & 63);
    if (head > n) head = n;
    if (head) _mm512_mask_storeu_epi8(dst, ep_bytes_mask(head), _mm512_maskz_loadu_epi8(ep_bytes_mask(head), src));
    long i = head;
    for (; i + 64 <= n; i += 64) _mm512_stream_si512((void *)(dst + i), _mm512_loadu_si512(src + i));
    if (i < n) _mm512_mask_storeu_epi8(dst + i, ep_bytes_mask(n - i), _mm512_maskz_loadu_epi8(ep_bytes_mask(n - i), src + i));
}

/* frames: uint8 [num_frames, height, width, 3], frames frame_stride and rows row_stride bytes
 * apart, ps bytes per pixel (3: RGB, 4: RGBX as PIL stores it, the fourth byte unread);
 * out: [ceil(num_frames / tp) * (height/p) * (width/p), 3 * tp * p * p] of kind 0: float32,
 * 1: bfloat16 bits (uint16, float32 rounded to nearest even, as torch does), 2: uint8 (the bytes
 * themselves). Temporal slot t of group g holds frame g*tp + t, or the last frame past the end
 * (a single image fills every slot); a slot that repeats the one before is copied, not
 * recomputed. Returns 0, or -1 for sizes it does not handle (the caller uses numba then). */
EP_TARGET int ep_layout_frames(const uint8_t *frames, long frame_stride, int num_frames, long row_stride, int ps,
                               int height, int width, int p, int m, int tp, int kind, float k, const float *mean,
                               const float *stdv, void *out) {
    if (p < 1 || p > EP_MAX_PATCH || tp < 1 || tp > EP_MAX_TP || m < 1 || kind < 0 || kind > 2 || ps < 3 ||
        ps > 4 || num_frames < 1)
        return -1;
    const int gh = height / p, gw = width / p, pp = p * p, values = 3 * tp * pp, gt = (num_frames + tp - 1) / tp;
    const int size = kind == 0 ? 4 : (kind == 1 ? 2 : 1);
    const long rowbytes = (long)values * size;
    const __mmask64 load_mask = p * ps >= 64 ? ~0ULL : (1ULL << (p * ps)) - 1; /* never past the patch */
    const __mmask16 store_mask = (__mmask16)((1u << p) - 1);
    __m512i channel[3];
    __m512 vmean[3], vstd[3];
    for (int c = 0; c < 3; c++) {
        uint8_t index[64];
        for (int i = 0; i < 64; i++) index[i] = (uint8_t)(i < 16 ? ps * i + c : 0);
        channel[c] = _mm512_loadu_si512(index);
        vmean[c] = _mm512_set1_ps(mean[c]);
        vstd[c] = _mm512_set1_ps(stdv[c]);
    }
    const __m512 vk = _mm512_set1_ps(k);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
    uint16_t high_index[32];
    for (int i = 0; i < 32; i++) high_index[i] = (uint16_t)(i < 16 ? 2 * i + 1 : 0);
    const __m512i high_words = _mm512_loadu_si512(high_index);
    uint8_t row[4 * 3 * EP_MAX_TP * EP_MAX_PATCH * EP_MAX_PATCH + 64];
    long n = 0;
    for (int g = 0; g < gt; g++)
        for (int bh = 0; bh < gh / m; bh++)
            for (int bw = 0; bw < gw / m; bw++)
                for (int mh = 0; mh < m; mh++)
                    for (int mw = 0; mw < m; mw++, n++) {
                        const int y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
                        for (int t = 0; t < tp; t++) {
                            const int f = g * tp + t < num_frames ? g * tp + t : num_frames - 1;
                            if (t > 0 && f == (g * tp + t - 1 < num_frames ? g * tp + t - 1 : num_frames - 1)) {
                                for (int c = 0; c < 3; c++) /* the same frame as the slot before */
                                    memcpy(row + (long)((c * tp + t) * pp) * size,
                                           row + (long)((c * tp + t - 1) * pp) * size, (size_t)pp * size);
                                continue;
                            }
                            const uint8_t *img = frames + (long)f * frame_stride;
                            for (int iy = 0; iy < p; iy++) {
                                const uint8_t *src = img + (long)(y0 + iy) * row_stride + (long)x0 * ps;
                                const __m512i bytes = _mm512_maskz_loadu_epi8(load_mask, src);
                                for (int c = 0; c < 3; c++) {
                                    const __m128i own =
                                        _mm512_castsi512_si128(_mm512_permutexvar_epi8(channel[c], bytes));
                                    uint8_t *dst = row + (long)((c * tp + t) * pp + iy * p) * size;
                                    if (kind == 2) {
                                        _mm_mask_storeu_epi8(dst, store_mask, own);
                                        continue;
                                    }
                                    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(own));
                                    v = _mm512_div_ps(_mm512_sub_ps(_mm512_mul_ps(v, vk), vmean[c]), vstd[c]);
                                    if (kind == 0) {
                                        _mm512_mask_storeu_ps(dst, store_mask, v);
                                    } else {
                                        const __m512i bits = _mm512_castps_si512(v);
                                        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
                                        /* the rounded value's high word of each lane, moved to the low half
                                         * by a word permute: a masked down-converting store (vpmovdw to
                                         * memory) was the slowest instruction of this path */
                                        const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, bias));
                                        _mm256_mask_storeu_epi16(dst, store_mask, _mm512_castsi512_si256(
                                            _mm512_permutexvar_epi16(high_words, rounded)));
                                    }
                                }
                            }
                        }
                        stream_bytes((uint8_t *)out + n * rowbytes, row, rowbytes);
                    }
    _mm_sfence();
    return 0;
}

/* ---- PIL's 8-bit resampling passes (libImaging/Resample.c), the same integers ----
 * PIL computes acc = 2^21 + sum_j byte_j * coef_j in int32 (fixed-point weights with 22 fraction
 * bits, from pil_resample.coefficients), then clip8: acc >> 22 clamped to 0..255. Here each weight
 * is split into c = hi * 256 + lo (lo in 0..255, hi fits int16), and two taps at a time go through
 * VNNI's word dot product (vpdpwssd): acc_hi += b0*hi0 + b1*hi1, acc_lo += b0*lo0 + b1*lo1, then
 * acc = (acc_hi << 8) + acc_lo. Every step is exact in int32 (|sum| < 2^31 as in PIL), so the
 * bytes are PIL's. The taps' bytes are placed as words by one zero-masking byte permute per pair,
 * which is the whole shuffle cost (a widening per tap was the bottleneck before).
 * A source has ps bytes per pixel (3: RGB, 4: RGBX as PIL stores RGB, the fourth byte unread)
 * and rows src_stride bytes apart; outputs are RGB rows. */
#define EP_PRECISION 22
#define EP_BAND 32                   /* source rows per band of the horizontal pass (stays in L2) */
#define EP_EVEN 0x5555555555555555ULL /* the low byte of every word: a tap's byte, high byte zero */

EP_TARGET static inline __m128i ep_clip8(__m512i acc_hi, __m512i acc_lo) {
    const __m512i acc = _mm512_add_epi32(_mm512_slli_epi32(acc_hi, 8), acc_lo);
    return _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_srai_epi32(acc, EP_PRECISION), _mm512_setzero_si512()));
}

/* (hi, lo) of a weight, or -1 where hi would not fit a signed word */
static inline int ep_split(int32_t c, int16_t *hi, int16_t *lo) {
    const int32_t h = c >> 8; /* arithmetic: c = h * 256 + (c & 255) */
    if (h < -32768 || h > 32767) return -1;
    *hi = (int16_t)h;
    *lo = (int16_t)(c & 255);
    return 0;
}

/* One band of source rows [r0, r1) of the horizontal pass (see below): window of 128 bytes (two
 * 64-byte halves, one two-source permute per tap pair) or, when wide, 256 bytes (two permutes and
 * a blend on the index's top bit). Inlined twice so each loop is compiled for its window. */
EP_TARGET static inline void ep_horizontal_band(const uint8_t *src, long src_stride, int ps, long r0, long r1,
                                                long row_bytes, long nvals, long groups, int pairs,
                                                const uint8_t *index, const int16_t *coefs, const long *base,
                                                const int *taps, uint8_t *out, const int wide) {
    const __m512i half = _mm512_set1_epi32(1 << (EP_PRECISION - 1)), step = _mm512_set1_epi32((2 * ps) << 16 | (2 * ps)); /* bytes 4l and 4l + 2 */
    const __m512i top = _mm512_set1_epi8((char)0x80);
    for (long g = 0; g < groups; g++) {
        const __m512i first = _mm512_load_si512(index + g * 64);
        const int16_t *cg = coefs + g * pairs * 64;
        const long left = row_bytes - base[g];
        const __mmask64 m0 = ep_bytes_mask(left), m1 = ep_bytes_mask(left - 64), m2 = ep_bytes_mask(left - 128),
                        m3 = ep_bytes_mask(left - 192);
        const __mmask16 store = (__mmask16)ep_bytes_mask(nvals - 16 * g);
        const int n = (taps[g] + 1) / 2;
        for (long r = r0; r < r1; r++) {
            const uint8_t *row = src + r * src_stride + base[g];
            /* the band's rows are a row stride apart, too far for the hardware prefetcher: fetch
             * the line the groups a few steps on will start to read */
            _mm_prefetch((const char *)row + (wide ? 384 : 256), _MM_HINT_T0);
            const __m512i w0 = _mm512_maskz_loadu_epi8(m0, row), w1 = _mm512_maskz_loadu_epi8(m1, row + 64);
            __m512i w2 = w0, w3 = w1;
            if (wide) {
                w2 = _mm512_maskz_loadu_epi8(m2, row + 128);
                w3 = _mm512_maskz_loadu_epi8(m3, row + 192);
            }
            __m512i acc_hi = _mm512_setzero_si512(), acc_lo = half, idx = first;
            for (int q = 0; q < n; q++) {
                __m512i b = _mm512_maskz_permutex2var_epi8(EP_EVEN, w0, idx, w1);
                if (wide)
                    b = _mm512_mask_blend_epi8(_mm512_test_epi8_mask(idx, top), b,
                                               _mm512_maskz_permutex2var_epi8(EP_EVEN, w2, idx, w3));
                acc_hi = _mm512_dpwssd_epi32(acc_hi, b, _mm512_load_si512(cg + q * 64));
                acc_lo = _mm512_dpwssd_epi32(acc_lo, b, _mm512_load_si512(cg + q * 64 + 32));
                idx = _mm512_add_epi8(idx, step);
            }
            _mm_mask_storeu_epi8(out + r * nvals + 16 * g, store, ep_clip8(acc_hi, acc_lo));
        }
    }
}

/* out[r][3*xx + c] = clip8(2^21 + sum_j src[r][ps*(xmin[xx] + j) + c] * coef[xx*ksize + j]), r < rows.
 * Lanes are 16 output bytes; each lane's taps come from one window of the source row (128 bytes,
 * or 256 where some group needs it) through byte permutes, so no transpose is needed. Returns -1
 * (nothing written) when a group of 16 outputs reaches further than 256 bytes (downscaling by
 * more than about 6x) or memory runs out: the caller uses the numba pass then. */
EP_TARGET int ep_resize_horizontal(const uint8_t *src, long src_stride, int ps, int rows, int in_w, int out_w,
                                   const int64_t *xmin, const int64_t *xlen, const int32_t *coef, int ksize,
                                   uint8_t *out) {
    if (ps < 3 || ps > 4 || ksize < 1 || out_w < 1 || rows < 0 || in_w < 1) return -1;
    const long nvals = 3L * out_w, groups = (nvals + 15) / 16, row_bytes = (long)in_w * ps;
    const int pairs = (ksize + 1) / 2;
    /* per group and tap pair: 32 hi words then 32 lo words, lane l's taps (2q, 2q+1) at words 2l, 2l+1 */
    int16_t *coefs = aligned_alloc(64, (size_t)groups * pairs * 128);
    uint8_t *index = aligned_alloc(64, (size_t)groups * 64);
    long *base = malloc((size_t)groups * sizeof(long));
    int *taps = malloc((size_t)groups * sizeof(int));
    int status = coefs && index && base && taps ? 0 : -1, wide = 0;
    for (long g = 0; g < groups && status == 0; g++) {
        const long x0 = xmin[(16 * g) / 3];
        int16_t *cg = coefs + g * pairs * 64;
        base[g] = ps * x0;
        taps[g] = 0;
        memset(index + g * 64, 0, 64);
        memset(cg, 0, (size_t)pairs * 128);
        for (int l = 0; l < 16 && 16 * g + l < nvals && status == 0; l++) {
            const long k = 16 * g + l, xx = k / 3, n = xlen[xx];
            const long first = ps * (xmin[xx] - x0) + k % 3, last = first + ps * (n - 1);
            if (n > ksize || first < 0 || (n > 0 && last > 255)) {
                status = -1;
                break;
            }
            if (n > 0 && last > 127) wide = 1;
            index[g * 64 + 4 * l] = (uint8_t)first; /* the pair's first tap; its second is ps further */
            index[g * 64 + 4 * l + 2] = (uint8_t)(first + ps);
            if (n > taps[g]) taps[g] = (int)n;
            for (long j = 0; j < n && status == 0; j++) {
                int16_t *pair = cg + (j / 2) * 64 + 2 * l + (j & 1);
                status = ep_split(coef[xx * ksize + j], pair, pair + 32);
            }
        }
    }
    for (long r0 = 0; r0 < rows && status == 0; r0 += EP_BAND) {
        const long r1 = r0 + EP_BAND < rows ? r0 + EP_BAND : rows;
        if (wide)
            ep_horizontal_band(src, src_stride, ps, r0, r1, row_bytes, nvals, groups, pairs, index, coefs, base,
                               taps, out, 1);
        else
            ep_horizontal_band(src, src_stride, ps, r0, r1, row_bytes, nvals, groups, pairs, index, coefs, base,
                               taps, out, 0);
    }
    free(coefs);
    free(index);
    free(base);
    free(taps);
    return status;
}

/* out[yy][i] = clip8(2^21 + sum_j src[ymin[yy] + j][i] * coef[yy*ksize + j]) over the 3*width RGB
 * bytes of each row (an RGBX source is narrowed to RGB by the same permutes); out rows 3*width
 * bytes. Two source rows at a time: one permute per 16 outputs places both rows' bytes as words. */
EP_TARGET int ep_resize_vertical(const uint8_t *src, long src_stride, int ps, int width, int out_h,
                                 const int64_t *ymin, const int64_t *ylen, const int32_t *coef, int ksize,
                                 uint8_t *out) {
    if (ps < 3 || ps > 4 || ksize < 1 || width < 1 || out_h < 0) return -1;
    /* per output row and tap pair q: the words (hi[2q], hi[2q+1]) and (lo[2q], lo[2q+1]) as int32 */
    const long pairs_max = (ksize + 1) / 2;
    int32_t *words = malloc((size_t)(out_h > 0 ? out_h : 1) * pairs_max * 2 * sizeof(int32_t));
    if (!words) return -1;
    for (long yy = 0; yy < out_h; yy++)
        for (long q = 0; q < pairs_max; q++) {
            int16_t h[2] = {0, 0}, l[2] = {0, 0};
            for (int t = 0; t < 2; t++)
                if (2 * q + t < ylen[yy] && ep_split(coef[yy * ksize + 2 * q + t], h + t, l + t)) {
                    free(words);
                    return -1;
                }
            words[(yy * pairs_max + q) * 2] = (int32_t)(((uint32_t)(uint16_t)h[1] << 16) | (uint16_t)h[0]);
            words[(yy * pairs_max + q) * 2 + 1] = (int32_t)(((uint32_t)(uint16_t)l[1] << 16) | (uint16_t)l[0]);
        }
    __m512i pick[3]; /* output byte 16k + l of a 16-pixel chunk: byte 4l from the first row, 4l + 2 the second */
    for (int k = 0; k < 3; k++) {
        uint8_t bytes[64] = {0};
        for (int l = 0; l < 16; l++) {
            const int i = 16 * k + l, at = ps * (i / 3) + i % 3;
            bytes[4 * l] = (uint8_t)at;
            bytes[4 * l + 2] = (uint8_t)(at + 64);
        }
        pick[k] = _mm512_loadu_si512(bytes);
    }
    const __m512i half = _mm512_set1_epi32(1 << (EP_PRECISION - 1));
    const long out_bytes = 3L * width;
    for (long yy = 0; yy < out_h; yy++) {
        const uint8_t *rows = src + ymin[yy] * src_stride;
        const long n = ylen[yy];
        const int32_t *w = words + yy * pairs_max * 2;
        const long pairs = (n + 1) / 2;
        for (long px = 0; px < width; px += 16) {
            const long npx = width - px < 16 ? width - px : 16;
            const __mmask64 load = ep_bytes_mask(npx * ps);
            __m512i acc_hi[3], acc_lo[3];
            for (int k = 0; k < 3; k++) {
                acc_hi[k] = _mm512_setzero_si512();
                acc_lo[k] = half;
            }
            for (long q = 0; q < pairs; q++) {
                const uint8_t *a = rows + 2 * q * src_stride + px * ps;
                const __m512i ra = _mm512_maskz_loadu_epi8(load, a);
                const __m512i rb = 2 * q + 1 < n ? _mm512_maskz_loadu_epi8(load, a + src_stride) : _mm512_setzero_si512();
                for (int k = 0; k < 3; k++) {
                    const __m512i b = _mm512_maskz_permutex2var_epi8(EP_EVEN, ra, pick[k], rb);
                    acc_hi[k] = _mm512_dpwssd_epi32(acc_hi[k], b, _mm512_set1_epi32(w[2 * q]));
                    acc_lo[k] = _mm512_dpwssd_epi32(acc_lo[k], b, _mm512_set1_epi32(w[2 * q + 1]));
                }
            }
            __m512i bytes = _mm512_castsi128_si512(ep_clip8(acc_hi[0], acc_lo[0]));
            bytes = _mm512_inserti32x4(bytes, ep_clip8(acc_hi[1], acc_lo[1]), 1);
            bytes = _mm512_inserti32x4(bytes, ep_clip8(acc_hi[2], acc_lo[2]), 2);
            _mm512_mask_storeu_epi8(out + yy * out_bytes + px * 3, ep_bytes_mask(npx * 3), bytes);
        }
    }
    free(words);
    return 0;
}

static struct PyModuleDef ep_module = {PyModuleDef_HEAD_INIT, "_pixel_simd", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__pixel_simd(void) { return PyModule_Create(&ep_module); }
