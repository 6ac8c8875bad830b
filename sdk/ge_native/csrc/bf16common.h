/* The bf16 kernels' shared pieces (bf16gemm.c's and bf16attn.c's): float32 <-> bf16 in
   plain C, the target attributes of the vector variants, the AMX tile configuration and the
   CPU detection (which variants run here: 1 scalar, 2 avx512_bf16, 4 amx_bf16, after Linux
   grants the process the AMX tile state). */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BC_X86 1
#define BC_T512 __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))
#define BC_TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl")))
#endif

/* float32 -> bf16, round to nearest even (a NaN stays a quiet NaN) */
static inline uint16_t bc_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float bc_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* an AMX tile configuration (palette 1) */
typedef struct {
    uint8_t palette, start;
    uint8_t zero[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} bc_tilecfg;

/* the configuration of 8 tiles of 16 rows x 64 bytes (a C tile of 16 x 16 float32; an A tile
   of 16 rows of 32 bf16; a B tile of 16 pair-rows of 32 bf16) */
static inline void bc_tiles16(bc_tilecfg *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) { cfg->colsb[t] = 64; cfg->rows[t] = 16; }
}

static pthread_once_t bc_once = PTHREAD_ONCE_INIT;
static int bc_mask = 1;

#if defined(BC_X86)
static uint64_t bc_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void bc_detect(void) {
    int mask = 1;
#if defined(BC_X86)
    unsigned a, b, c, d, a1 = 0, b1, c1, d1;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) { bc_mask = mask; return; }  /* no OSXSAVE */
    uint64_t xcr0 = bc_xcr0();
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) { bc_mask = mask; return; }
    if (a >= 1) __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    int avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (a1 >> 5 & 1) && (xcr0 & 0xe6) == 0xe6;
    if (avx512) mask |= 2;
    if (avx512 && (d >> 22 & 1) && (d >> 24 & 1) && (xcr0 & 0x60000) == 0x60000) {
        /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): the process may use the tiles */
        if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) mask |= 4;
    }
#endif
    bc_mask = mask;
}

/* the variants this CPU runs, a mask (detected once) */
static inline int bc_caps_mask(void) {
    pthread_once(&bc_once, bc_detect);
    return bc_mask;
}

/* the variant a call runs unless told otherwise: the one GE_NATIVE_BF16 names where this CPU runs
   it, else the best this CPU runs */
static inline const char *bc_isa_name(void) {
    static const char *names[3] = {"scalar", "avx512_bf16", "amx_bf16"};
    int mask = bc_caps_mask();
    const char *forced = getenv("GE_NATIVE_BF16");
    for (int v = 0; forced && v < 3; v++)
        if (mask >> v & 1 && strcmp(forced, names[v]) == 0) return names[v];
    return names[mask & 4 ? 2 : mask & 2 ? 1 : 0];
}
