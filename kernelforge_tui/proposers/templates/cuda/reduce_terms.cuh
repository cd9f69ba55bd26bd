//@ Each reduction's term, the body of term() (reduction.py's OPS name the ops): of one element of each input (a0,
//@ a1), of one point (a0, its WIDTH coordinates), or of one element a0 of a row at column i of cols.
//@if dot_product
 return a0 * a1;
//@end
//@if mse_loss
 const float d = a0 - a1;
 return d * d;
//@end
//@ max(0, d) that keeps NaN, as torch.clamp_min does (fmaxf would drop it).
//@if hinge_loss
 const float d = 1.0f - a0 * a1;
 return d < 0.0f ? 0.0f : d;
//@end
//@ f(p) = exp(-|p|^2), the squares summed in coordinate order (numerics.py's _integrand); the mean over points.
//@if monte_carlo_integration
 float r2 = 0.0f;
#pragma unroll
 for (int c = 0; c < WIDTH; ++c) {
  r2 += a0[c] * a0[c];
 }
 return expf(-r2);
//@end
//@ Composite Simpson: weights 1 at both ends, 4 at odd columns, 2 at even ones; times h / 3 with h = 1 / m,
//@ m = cols - 1 intervals (numerics.py's _simpson).
//@if simpson_integration
 return (i == 0 || i == cols - 1 ? 1.0f : (i & 1) ? 4.0f : 2.0f) * a0;
//@end
