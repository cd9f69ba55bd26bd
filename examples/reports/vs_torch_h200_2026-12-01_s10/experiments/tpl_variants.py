"""Experiment: the text edits of the template's kernel (tpl_t1_current.cu, 7bfd5f1's bulk shifted-moments kernel of the
captured card with its statistics outputs) that gn_tpl.py timed as gn_tpl2.log's variants, written beside it."""
import sys
from pathlib import Path


def no_raw(s: str) -> str:
    """No plain sum: the mean output from pivot + shift."""
    return (s.replace(" raw += f[j];", "").replace("Sum3{s, q, raw}", "Sum3{s, q, 0.0f}")
            .replace("from_f(sums.t / (float)len)", "from_f(mean)").replace(", raw = 0.0f", ""))


def relaxed(s: str) -> str:
    """A relaxed exit arrive (unsafe: it does not order the parts' reads before it)."""
    return s.replace("cg::this_cluster().barrier_arrive();", 'asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");')


def rolled(s: str) -> str:
    """The passes over the kept chunks not unrolled."""
    return s.replace("#pragma unroll\nfor (int k = 0; k < ITEMS; ++k) {", "#pragma unroll 1\nfor (int k = 0; k < ITEMS; ++k) {")


def sum2(s: str) -> str:
    """No plain sum, and the first reduction a pair."""
    return (no_raw(s).replace("__shared__ Sum3 red3[32];\n__shared__ Sum3 part3;", "__shared__ Sum2 red3[32];\n__shared__ Sum2 part3;")
            .replace("const Sum3 sums = reduce_all(Sum3{s, q, 0.0f}", "const Sum2 sums = reduce_all(Sum2{s, q}").replace("sums.q", "sums.t"))


VARIANTS = {"t2_no_raw": no_raw, "t4_relaxed": relaxed, "t5_rolled": rolled, "t6_sum2": sum2,
            "t7_relaxed_rolled": lambda s: relaxed(rolled(s)), "t8_sum2_relaxed_rolled": lambda s: relaxed(rolled(sum2(s)))}
if __name__ == "__main__":
    here = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    current = (here / "tpl_t1_current.cu").read_text()
    for name, edit in VARIANTS.items():
        edited = edit(current)
        assert edited != current, name
        (here / f"tpl_{name}.cu").write_text(edited)
