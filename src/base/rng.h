/* Seeded, platform-independent random numbers (splitmix64): the same seed gives the same
 * weights and inputs on every machine, which is what make-tiny, the benchmarks and the demo
 * inputs need. Not for cryptography. */
#ifndef K3_RNG_H
#define K3_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct k3_rng {
    uint64_t s;
} k3_rng;

static inline uint64_t k3_rng_u64(k3_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double k3_rng_unif(k3_rng *r) { return (double)(k3_rng_u64(r) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller; one value per call, the second is dropped for simplicity). */
static inline double k3_rng_normal(k3_rng *r) {
    double u1 = k3_rng_unif(r), u2 = k3_rng_unif(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

#endif
