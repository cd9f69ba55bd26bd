//@ A group's statistics (mean, rstd, and out_mean for the statistics outputs), from passes over the thread's chunks
//@ (group_norm_chunks.cuh) and reductions over the block or cluster (`moments`, see group_norm.py):
//@ - shifted: one pass of sums and squares about the pivot, one reduction; a centred pass and reduction more only
//@   where the pivot lies far from the mean (E[d]^2 > SHIFT_LIMIT * var). Each chunk's sum about the pivot is summed
//@   apart first (no drift across the thread's chunks). With the statistics outputs a 16-bit card (`plain_chunk`)
//@   takes the chunk's plain sum as VEC * pivot + that sum, one fma a chunk instead of an add an element (which
//@   costs measurable time even in a kernel bound by memory): its mean output's rounding (2^-9 or 2^-12) dwarfs
//@   that fma's (2^-24 of the chunk's sum about the pivot); an fp32 mean output failed stress:large so in
//@   emulation, and keeps a plain sum an element (`plain_each`). Where the pivot is far from the mean the chunk's
//@   sum loses the plain one, so the centred pass sums the plain values too and the mean output is theirs.
//@ - welford, rereading: each thread's Welford state merged with Chan's formula in one reduction; on chip: each
//@   thread's (count, mean about the pivot, M2, plain sum) from two passes over its own chunks, then one reduction.
//@ - centred: the group's mean (on chip: about the pivot), then the centred squares: two reductions, exact.
//@ The mean output is the plain sum's: normalising wants the mean about the pivot or Chan's merged mean (a large mean
//@ swamps a plain sum), but either misses a mean near zero of large values by more than its own tolerance (fp32's
//@ merged mean fails stress:large; the pivot's sum does in emulation).
//@if shifted
//@if stats
float s = 0.0f, q = 0.0f, raw = 0.0f;
//@else
float s = 0.0f, q = 0.0f;
//@end
chunks.pass<true>([&](auto, const float (&f)[VEC]) {
    float cs = 0.0f;
    each(f, [&](float v) {
        const float d = v - pivot;
        cs += d;
        q += d * d;
//@if plain_each
        raw += v;
//@end
    });
    s += cs;
//@if plain_chunk
    raw += fmaf((float)VEC, pivot, cs);
//@end
});
//@if stats
const Sum3 sums = reduce_all(Sum3{s, q, raw}, red3, &part3);
float out_mean = sums.t / (float)len;
const float squares = sums.q;
//@else
const Sum2 sums = reduce_all(Sum2{s, q}, red2, &part2);
const float squares = sums.t;
//@end
const float shift = sums.s / (float)len;
const float mean = pivot + shift;
float var = fmaxf(squares / (float)len - shift * shift, 0.0f);
if (shift * shift > SHIFT_LIMIT * var) {  // the pivot is far from the mean: E[d]^2 would cancel
//@if stats
    float centred = 0.0f, plain = 0.0f;
//@else
    float centred = 0.0f;
//@end
    chunks.pass<false>([&](auto, const float (&f)[VEC]) {
        each(f, [&](float v) {
            const float d = v - mean;
            centred += d * d;
//@if stats
            plain += v;
//@end
        });
    });
//@if stats
    const Sum2 exact = reduce_all(Sum2{centred, plain}, red2, &part2);
    var = exact.s / (float)len;
    out_mean = exact.t / (float)len;
//@else
    var = reduce_all(Sum{centred}, red, &part_q).s / (float)len;
//@end
}
const float rstd = rsqrtf(var + 1e-5f);
//@end
//@if welford
//@if reread
Welford acc = {0.0f, 0.0f, 0.0f, 0.0f};
chunks.pass<true>([&](auto, const float (&f)[VEC]) { acc = Welford::combine(acc, Welford::of_chunk(f)); });
acc = reduce_all(acc, red, &part);
//@else
float s = 0.0f, cnt = 0.0f, raw = 0.0f;
chunks.pass<true>([&](auto, const float (&f)[VEC]) {
    each(f, [&](float v) {
        s += v - pivot;
        raw += v;
    });
    cnt += (float)VEC;
});
const float tmean = cnt > 0.0f ? pivot + s / cnt : 0.0f;
float m2 = 0.0f;
chunks.pass<false>([&](auto, const float (&f)[VEC]) {
    each(f, [&](float v) {
        const float d = v - tmean;
        m2 += d * d;
    });
});
const Welford acc = reduce_all(Welford{cnt, tmean, m2, raw}, red, &part);
//@end
const float mean = acc.mean;
const float rstd = rsqrtf(acc.m2 / (float)len + 1e-5f);
//@if stats
const float out_mean = acc.sum_mean();
//@end
//@end
//@if centred
//@if reread
float sum = 0.0f;
chunks.pass<true>([&](auto, const float (&f)[VEC]) { each(f, [&](float v) { sum += v; }); });
const float mean = reduce_all(Sum{sum}, red, &part).s / (float)len;
//@if stats
const float out_mean = mean;
//@end
//@else
float s = 0.0f;
//@if stats
float raw = 0.0f;
chunks.pass<true>([&](auto, const float (&f)[VEC]) {
    each(f, [&](float v) {
        s += v - pivot;
        raw += v;
    });
});
const Sum2 sums = reduce_all(Sum2{s, raw}, red2, &part2);
const float mean = pivot + sums.s / (float)len;
const float out_mean = sums.t / (float)len;
//@else
chunks.pass<true>([&](auto, const float (&f)[VEC]) { each(f, [&](float v) { s += v - pivot; }); });
const float mean = pivot + reduce_all(Sum{s}, red, &part).s / (float)len;
//@end
//@end
float q = 0.0f;
chunks.pass<false>([&](auto, const float (&f)[VEC]) {
    each(f, [&](float v) {
        const float d = v - mean;
        q += d * d;
    });
});
const float rstd = rsqrtf(reduce_all(Sum{q}, red, &part_q).s / (float)len + 1e-5f);
//@end
