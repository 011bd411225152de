#!/usr/bin/env bash
# step-lines — which memory one IPCQ step touches, per PE and by owner (issue #34,
# docs/parallel.md "Lines per step"). One thread's cost per chunk at thousands of PEs is set by
# the distinct cache lines each PE touches per step (a window sweeps every PE once, so at 4 096
# PEs each such line is a last-level miss once the sweep outgrows the cache); chunk-lines.sh
# counts the misses, this says whose lines they are. Runs ring_rsag_allreduce on RANKS ranks
# (default 128, one SIP) at 8 KiB per rank, --threads 1, timing only, under valgrind's lackey
# with a preloaded logger of allocations (malloc family and mmap, each with its caller), and
# counts the distinct 64-byte lines touched in windows of RANKS chunks (one step of every PE:
# chunks are counted at kb_ipcq_meta_arrive) a quarter into the reduce-scatter and a quarter
# into the all-gather. Prints, per phase, lines per PE and step by allocating function (the
# fiber stacks as one owner, with the depths their lines are at and, per depth, the functions
# whose instructions touched each line first in a window: whose frames make a step's stack as
# deep as it is). The counts are the same on
# every run of one binary. Needs valgrind, a C compiler and binutils (not build dependencies),
# and a kbcl with its symbols (any build: file:line where it has debug info).
# Usage: scripts/step-lines.sh [KBCL] [RANKS (a multiple of 128, default 128)]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kbcl=$(readlink -f "${1:-$here/build/kbcl}")
ranks=${2:-128}
for t in valgrind cc nm addr2line python3; do
    if ! command -v "$t" >/dev/null; then
        echo "step-lines: needs $t" >&2
        exit 2
    fi
done
if (( ranks < 128 || ranks % 128 )); then
    echo "step-lines: RANKS must be a multiple of 128 (one SIP each), got $ranks" >&2
    exit 2
fi
meta=$(nm "$kbcl" | awk '$3 == "kb_ipcq_meta_arrive" { a = $1 } END { print a }')
if [[ -z "$meta" ]]; then
    echo "step-lines: no symbol kb_ipcq_meta_arrive in $kbcl (a stripped binary?)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The logger: every allocation as "A address bytes caller", every mmap as "M ...", and the
# main program's load address first ("B address"). Writes with write(2): no buffering, so the
# analyser can read the log while the run goes on.
cat >"$tmp/alloclog.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static int fd = -1;
static __thread int busy;
static char early[1 << 16];
static size_t nearly;
static void *(*r_malloc)(size_t), *(*r_calloc)(size_t, size_t), *(*r_realloc)(void *, size_t);
static void *(*r_aligned)(size_t, size_t), *(*r_mmap)(void *, size_t, int, int, int, off_t);
static int (*r_memalign)(void **, size_t, size_t);
static void (*r_free)(void *);
static int first(struct dl_phdr_info *i, size_t n, void *d) { (void)n; *(unsigned long *)d = i->dlpi_addr; return 1; }
static void init(void)
{
    busy = 1;
    r_malloc = dlsym(RTLD_NEXT, "malloc");
    r_calloc = dlsym(RTLD_NEXT, "calloc");
    r_realloc = dlsym(RTLD_NEXT, "realloc");
    r_aligned = dlsym(RTLD_NEXT, "aligned_alloc");
    r_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    r_mmap = dlsym(RTLD_NEXT, "mmap");
    r_free = dlsym(RTLD_NEXT, "free");
    busy = 0;
}
static void note(char kind, void *p, size_t n, void *caller)
{
    char b[96];
    if (busy || !p || p == MAP_FAILED)
        return;
    busy = 1;
    if (fd < 0) {
        unsigned long base = 0;
        /* valgrind's launchers (a shell script, valgrind.bin) run with the same preload
         * before the program, and the program's children after it: only the program logs
         * (valgrind answers /proc/self/exe with the program's path) */
        const char *f = getenv("STEP_LINES_LOG"), *exe = getenv("STEP_LINES_EXE");
        char self[4096];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        int me = exe && k > 0 && (self[k] = 0, strcmp(self, exe) == 0);
        fd = f && me ? open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -2;
        if (fd >= 0)
            unsetenv("STEP_LINES_LOG");
        dl_iterate_phdr(first, &base);
        if (fd >= 0)
            (void)!write(fd, b, (size_t)snprintf(b, sizeof b, "B %lx\n", base));
    }
    if (fd >= 0)
        (void)!write(fd, b, (size_t)snprintf(b, sizeof b, "%c %lx %zu %lx\n", kind,
                                             (unsigned long)p, n, (unsigned long)caller));
    busy = 0;
}
void *malloc(size_t n) { if (!r_malloc) init(); void *p = r_malloc(n); note('A', p, n, __builtin_return_address(0)); return p; }
void *calloc(size_t a, size_t b)
{
    if (!r_calloc) {
        if (busy) { /* dlsym's own calloc, before there is one */
            void *p = early + nearly;
            nearly += (a * b + 15) & ~(size_t)15;
            return nearly <= sizeof early ? p : NULL;
        }
        init();
    }
    void *p = r_calloc(a, b);
    note('A', p, a * b, __builtin_return_address(0));
    return p;
}
void *realloc(void *q, size_t n) { if (!r_realloc) init(); void *p = r_realloc(q, n); note('A', p, n, __builtin_return_address(0)); return p; }
void *aligned_alloc(size_t a, size_t n) { if (!r_aligned) init(); void *p = r_aligned(a, n); note('A', p, n, __builtin_return_address(0)); return p; }
int posix_memalign(void **pp, size_t a, size_t n) { if (!r_memalign) init(); int r = r_memalign(pp, a, n); if (!r) note('A', *pp, n, __builtin_return_address(0)); return r; }
void *mmap(void *a, size_t n, int prot, int fl, int f, off_t off) { if (!r_mmap) init(); void *p = r_mmap(a, n, prot, fl, f, off); note('M', p, n, __builtin_return_address(0)); return p; }
void free(void *p)
{
    if ((char *)p >= early && (char *)p < early + sizeof early)
        return;
    if (!r_free)
        init();
    r_free(p);
}
EOF

# The analyser: reads lackey's trace on stdin; windows of `ranks` chunks; per window the
# distinct lines, each charged to the allocation holding it (the latest logged one there) by
# its caller; lines in an mmap are also binned by depth below the top of their 64-slot chunk's
# slot (the fiber stacks: kb_sim_mem.c carves 64 stacks from each mapping).
cat >"$tmp/ana.c" <<'EOF'
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define HB 24
#define NOWN 4096
#define NDEPTH 64
typedef struct { uint64_t lo, hi, ra; int mm; } al;
static al *A; static size_t nA, capA;
static uint64_t base, meta_off, ranks;
static FILE *logf_;
static const char *logname;
static uint64_t own_ra[NOWN]; static double own_n[2][NOWN]; static int nown;
static double depth_n[2][NDEPTH]; static double total[2]; static int windows[2];
/* which instruction first touched a stack line in a window, by depth: (depth, address) */
#define NFN 65536
static uint64_t fn_key[NFN]; static double fn_n[2][NFN]; static uint64_t last_ins; static int nfn;
static void fn_count(int ph, uint64_t d, uint64_t ins)
{
    uint64_t k = (d << 48) | (ins & 0xffffffffffffull), h = (k * 0x9E3779B97F4A7C15ull) >> 48;
    while (fn_key[h] && fn_key[h] != k) h = (h + 1) % NFN;
    if (!fn_key[h]) {
        if (nfn == NFN - 1) return; /* full: the rest go uncounted (never seen: a few thousand) */
        fn_key[h] = k;
        nfn++;
    }
    fn_n[ph][h] += 1;
}
static int cmp(const void *a, const void *b) { const al *x = a, *y = b; return x->lo < y->lo ? -1 : x->lo > y->lo; }
static void read_log(void)
{
    char b[256];
    size_t n0 = nA;
    if (!logf_ && !(logf_ = fopen(logname, "r")))
        return; /* not written yet */
    while (fgets(b, sizeof b, logf_)) {
        unsigned long p, ra; size_t n; char k;
        if (b[0] == 'B') { sscanf(b, "B %lx", &p); base = p; continue; }
        if (sscanf(b, "%c %lx %zu %lx", &k, &p, &n, &ra) != 4) continue;
        if (nA == capA) { capA = capA ? 2 * capA : 4096; A = realloc(A, capA * sizeof *A); }
        A[nA++] = (al){ p, p + n, ra, k == 'M' };
    }
    clearerr(logf_);
    if (nA != n0)
        qsort(A, nA, sizeof *A, cmp);
}
static int owner(uint64_t ra)
{
    for (int i = 0; i < nown; i++) if (own_ra[i] == ra) return i;
    if (nown == NOWN) return 0;
    own_ra[nown] = ra;
    return nown++;
}
static void charge(int ph, uint64_t line)
{
    uint64_t ad = line << 6;
    size_t lo = 0, hi = nA;
    while (lo < hi) { size_t m = (lo + hi) / 2; if (A[m].lo <= ad + 63) lo = m + 1; else hi = m; }
    for (size_t j = lo; j-- > 0 && lo - j < 256;) {
        if (A[j].lo <= ad + 63 && A[j].hi > ad) {
            own_n[ph][owner(A[j].ra)] += 1;
            if (A[j].mm && (A[j].hi - A[j].lo) % 64 == 0) {
                uint64_t slot = (A[j].hi - A[j].lo) / 64, o = (ad - A[j].lo) % slot;
                uint64_t d = (slot - o - 1) / 64;
                depth_n[ph][d < NDEPTH ? d : NDEPTH - 1] += 1;
                fn_count(ph, d, last_ins);
            }
            return;
        }
    }
    own_n[ph][owner(0)] += 1; /* not allocated by the program: its static data, libc's */
}
int main(int argc, char **argv)
{
    if (argc != 7) return 2;
    logname = argv[1];
    meta_off = strtoull(argv[2], 0, 16);
    ranks = strtoull(argv[3], 0, 10);
    uint64_t start[2] = { strtoull(argv[4], 0, 10), strtoull(argv[5], 0, 10) };
    int nwin = atoi(argv[6]);
    uint64_t *tab = calloc((size_t)1 << HB, 8);
    uint32_t *stamp = calloc((size_t)1 << HB, 4);
    char line[256];
    uint64_t chunks = 0, meta = 0, ins = 0;
    int ph = -1, win = -1;
    uint32_t tag = 0;
    (void)own_n; owner(0);
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'I') {
            if (!meta) { /* the logger writes the load address at the first allocation */
                if (ins++ % 4096)
                    continue;
                read_log();
                if (base)
                    meta = base + meta_off;
                continue;
            }
            last_ins = strtoull(line + 3, 0, 16);
            if (last_ins != meta) continue;
            chunks++;
            int p = chunks > start[1] ? 1 : chunks > start[0] ? 0 : -1;
            if (p < 0) continue;
            uint64_t w = (chunks - 1 - start[p]) / ranks;
            if (w >= (uint64_t)nwin) { if (p == 1) break; ph = -1; continue; }
            if (p != ph || (int)w != win) {
                if (win < 0 || p != ph) read_log(); /* pools grown since */
                ph = p; win = (int)w; tag++; windows[p]++;
            }
            continue;
        }
        if (ph < 0 || line[0] != ' ') continue;
        char *c = strchr(line, ',');
        if (!c) continue;
        *c = 0;
        uint64_t a = strtoull(line + 3, 0, 16), sz = strtoull(c + 1, 0, 10);
        for (uint64_t l = a >> 6; l <= (a + (sz ? sz : 1) - 1) >> 6; l++) {
            uint64_t h = (l * 0x9E3779B97F4A7C15ull) >> (64 - HB);
            while (tab[h] && tab[h] != l + 1) h = (h + 1) & (((uint64_t)1 << HB) - 1);
            tab[h] = l + 1;
            if (stamp[h] == tag) continue;
            stamp[h] = tag;
            total[ph] += 1;
            charge(ph, l);
        }
    }
    printf("base %lx\n", (unsigned long)base);
    for (int p = 0; p < 2; p++) {
        printf("phase %d windows %d lines %.0f\n", p, windows[p], total[p]);
        for (int i = 0; i < nown; i++)
            if (own_n[p][i] > 0) printf("own %d %lx %.0f\n", p, (unsigned long)own_ra[i], own_n[p][i]);
        for (int d = 0; d < NDEPTH; d++)
            if (depth_n[p][d] > 0) printf("depth %d %d %.0f\n", p, d, depth_n[p][d]);
        for (int h = 0; h < NFN; h++)
            if (fn_n[p][h] > 0) printf("sfn %d %lu %lx %.0f\n", p, (unsigned long)(fn_key[h] >> 48),
                                       (unsigned long)(fn_key[h] & 0xffffffffffffull), fn_n[p][h]);
    }
    return 0;
}
EOF
cc -O2 -shared -fPIC -o "$tmp/alloclog.so" "$tmp/alloclog.c" -ldl
cc -O2 -o "$tmp/ana" "$tmp/ana.c"

steps=$((ranks - 1))                   # steps per phase
nwin=$(( steps / 4 > 0 ? steps / 4 : 1 ))
rs=$(( steps / 4 * ranks ))            # a quarter into the reduce-scatter
ag=$(( (steps + steps / 4) * ranks ))  # a quarter into the all-gather
STEP_LINES_LOG="$tmp/alloc.log" STEP_LINES_EXE="$kbcl" LD_PRELOAD="$tmp/alloclog.so" \
    valgrind --tool=lackey --trace-mem=yes --log-fd=9 "$kbcl" run --bench ccl \
    --algorithm ring_rsag_allreduce --world-size "$ranks" \
    --set system.sips.count=$((ranks / 128)) --size 8K --device none --threads 1 \
    9>&1 >/dev/null 2>"$tmp/vg.txt" | "$tmp/ana" "$tmp/alloc.log" "$meta" "$ranks" "$rs" "$ag" \
    "$nwin" >"$tmp/out.txt" || true

python3 - "$tmp/out.txt" "$kbcl" "$ranks" <<'PY'
import bisect, subprocess, sys
out, kbcl, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
base, phases = 0, {}
for line in open(out):
    f = line.split()
    if f[0] == "base":
        base = int(f[1], 16)
    elif f[0] == "phase":
        phases[int(f[1])] = {"windows": int(f[3]), "lines": float(f[5]), "own": {}, "depth": {}}
    elif f[0] == "own":
        phases[int(f[1])]["own"][int(f[2], 16)] = float(f[3])
    elif f[0] == "sfn":
        phases[int(f[1])].setdefault("sfn", []).append((int(f[2]), int(f[3], 16), float(f[4])))
    elif f[0] == "depth":
        phases[int(f[1])]["depth"][int(f[2])] = float(f[3])
if len(phases) != 2 or not all(p["windows"] for p in phases.values()):
    sys.exit("step-lines: the run ended before both windows (a failed run? valgrind missing a "
             "symbol?)")
# callers inside the program: named by addr2line (innermost function, outermost caller
# with its line where there is debug info); others (libc, the loader): by their region
names = {}
ras = sorted({ra for p in phases.values() for ra in p["own"] if ra})
ins = [ra - base for ra in ras if ra >= base]
res = subprocess.run(["addr2line", "-f", "-i", "-a", "-e", kbcl] + [hex(o) for o in ins],
                     capture_output=True, text=True).stdout.split("\n")
for block in "\n".join(res).split("0x")[1:]:
    f = block.strip().split("\n")
    addr, rest = int(f[0], 16) + base, f[1:]
    chain = [(rest[i], rest[i + 1] if i + 1 < len(rest) else "??") for i in range(0, len(rest), 2)]
    if not chain:
        continue
    if chain[0][0] == "??":
        continue
    # the allocating function, and where its caller (the first other function up the chain
    # of inlined calls) asked for it: zalloc_lines <- kb_machine_create (kb_machine.c:293)
    inner = chain[0][0]
    up = next((c for c in chain[1:] if c[0] != inner), chain[0])
    loc = "" if "?" in up[1] else " (" + up[1].rsplit("/", 1)[-1].split(" ")[0] + ")"
    names[addr] = (inner if up is chain[0] else f"{inner} <- {up[0]}") + loc
# the functions of the program, by start address, for the instructions that touched stack lines
syms = []
for l in subprocess.run(["nm", "-n", "-S", kbcl], capture_output=True, text=True).stdout.split("\n"):
    g = l.split()
    if len(g) == 4 and g[2] in "tTwW":
        syms.append((int(g[0], 16), int(g[1], 16), g[3]))
keys = [a for a, _, _ in syms]
for p, title in ((0, "reduce-scatter"), (1, "all-gather")):
    ph = phases[p]
    steps = ph["windows"] * ranks
    print(f"{title}: {ph['windows']} windows of {ranks} chunks; "
          f"{ph['lines'] / steps:.1f} lines per PE and step")
    by = {}
    for ra, n in ph["own"].items():
        name = ("static data, the stacks of threads" if ra == 0 else
                names.get(ra, "allocated outside kbcl (libc, the loader)"))
        by[name] = by.get(name, 0.0) + n
    for name, n in sorted(by.items(), key=lambda kv: (-kv[1], kv[0])):
        if n / steps >= 0.05:
            print(f"  {n / steps:6.2f}  {name}")
    if ph["depth"]:
        top = sorted(ph["depth"])
        touched = [d for d in top if ph["depth"][d] / steps >= 0.5]
        per = {}
        for d, a, n in ph.get("sfn", []):
            i = bisect.bisect_right(keys, a - base) - 1
            fn = (syms[i][2] if i >= 0 and a - base < syms[i][0] + syms[i][1] else
                  "(outside kbcl)")
            per.setdefault(d, {}).setdefault(fn, 0.0)
            per[d][fn] += n
        for d in sorted(per):
            if ph["depth"].get(d, 0) / steps < 0.05:
                continue
            tops = sorted(per[d].items(), key=lambda kv: -kv[1])[:4]
            print(f"    depth {d:2d}: {ph['depth'][d] / steps:4.2f}  " +
                  ", ".join(f"{fn} {n / steps:.2f}" for fn, n in tops))
        print(f"  stack lines touched in most steps: depths {touched[0]}..{touched[-1]} lines "
              f"below a stack's top" if touched else "  stack: no line touched in most steps")
PY
