// Phi(x) = 1 - Phi(-x), Phi(-a) = 0.5 erfc(a / sqrt 2) = 0.5 exp(-t^2) P(k), t = a / sqrt 2,
// k = 1 / (1 + p t): Abramowitz and Stegun 7.1.26, |erfc error| <= 1.5e-7, one MUFU rcp and one ex2 (erff: a branch,
// 7 FMAs, 6 selects and an ex2). erfc's form does not cancel for negative x, as 1 + erf does. t = inf gives k = 0
// and exp 0: Phi(+inf) = 1, Phi(-inf) = 0 (gelu(-inf) = -inf * 0 = NaN, as torch's); NaN stays NaN.
__device__ __forceinline__ float fast_phi(float x) {
 const float t = fabsf(x) * 0.70710678118654752f;
 const float k = __fdividef(1.0f, fmaf(0.3275911f, t, 1.0f));
 const float p = k * fmaf(k, fmaf(k, fmaf(k, fmaf(k, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
                          0.254829592f);
 const float h = 0.5f * p * __expf(-t * t);
 return x < 0.0f ? h : 1.0f - h;
}
