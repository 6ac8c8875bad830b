
/* the activations of ge_native.activations on one float32 value, on the prelude's math: one
   function each (the table's c_fn), and act32(v, code) choosing by the table's c_id (0: none) */
static inline __attribute__((always_inline)) float act_sigmoid32(float v) {
    return 1.0f / (1.0f + exp32(-v));
}

static inline __attribute__((always_inline)) float act_silu32(float v) {
    return v / (1.0f + exp32(-v));
}

static inline __attribute__((always_inline)) float act_gelu32(float v) {
    return 0.5f * v * (1.0f + erf32(v * 0.70710678118654752f));
}

/* tanh's GELU as v * sigmoid(2u), 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)) (no cancellation
   in 1 + tanh for negative v, and SiLU's cost: the tanh form ran 2.5x as long at the store) */
static inline __attribute__((always_inline)) float act_gelu_tanh32(float v) {
    return v / (1.0f + exp32(-(v * (1.5957691216057308f + 0.0713548162726f * v * v))));
}

static inline __attribute__((always_inline)) float act_hardswish32(float v) {
    float g = v * (1.0f / 6.0f) + 0.5f;
    g = g > 0.0f ? g : 0.0f;
    g = g < 1.0f ? g : 1.0f;
    return v * g;
}

static inline __attribute__((always_inline)) float act32(float v, int64_t act) {
    if (act == 1) return act_sigmoid32(v);
    if (act == 2) return act_silu32(v);
    if (act == 3) return act_gelu32(v);
    if (act == 4) return act_gelu_tanh32(v);
    if (act == 5) return act_hardswish32(v);
    return v;
}
