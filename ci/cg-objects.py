#!/usr/bin/env python3
"""Split a callgrind profile's instructions by object file (ci/cpu-cost.sh), or fit them per
loop turn and per message (--fit, transport-ucx/callgrind.sh).

Each function's own instructions (Ir) go to its object file's group; a call into a
"neutral" object (libc, the dynamic loader, libgcc, the vDSO) is charged, inclusive, to the
caller's group, so memcpy or a syscall wrapper counts for whoever called it. Groups: sim
(efa-sim's libibverbs.so.1/libefa.so.1 stand-ins, and everything on their threads),
libfabric (libfabric.so), bench (the rdma-bench binary: harness and trait), other (what is
reached from none of these: thread start-up, the loader).

Two profiles of one command with a small and a larger count of WRITEs; what is printed is
the larger's cost minus the smaller's (set-up, warm-up and tear-down cancel):
  cg-objects.py SMALL.out LARGE.out        one line: "total bench libfabric sim other"
  cg-objects.py --top N GROUP SMALL.out LARGE.out   the N functions of GROUP whose cost (own
                                           Ir plus neutral calls) grew most, "IR NAME" a line
  cg-objects.py --calls REGEX SMALL.out LARGE.out   how many more calls the functions whose
                                           name matches REGEX got
  cg-objects.py --fit TURN MSG FIT SMALL.out LARGE.out [N]   a function's own Ir per
                                           message (b) and per turn (a) of a polling loop,
                                           from two profiles whose counts of idle turns differ
                                           (under valgrind they do, from run to run): turns
                                           are the calls of the functions matching the regex
                                           TURN, messages those matching MSG. The functions
                                           matching FIT (those a turn runs: the loop, its poll
                                           and progress) are fitted as a x turns + b x
                                           messages; any other is the plain difference per
                                           message, a 0 (a fit would turn the small run-to-run
                                           differences of set-up and timer calls into large
                                           opposite a and b). Prints the N (default 12) largest
                                           "b a NAME", then "b a total" and "- - turns/message"
                                           of each profile
"""
import re
import sys
from collections import defaultdict


def group(ob):
    base = ob.rsplit("/", 1)[-1]
    if "/efa-sim/sim-" in ob or base.startswith(("libibverbs.so", "libefa.so")):
        return "sim"
    if base.startswith("libfabric.so"):
        return "libfabric"
    if base.startswith("rdma-bench"):
        return "bench"
    if re.match(r"(libc\.so|libc-|ld-linux|ld-2|libgcc|libpthread|libm\.so|\?\?\?|\[vdso\])", base) or base == "":
        return None  # neutral: charged to the caller
    return "other"


def parse(path, own, calls, ncalls=None):
    """own[(ob, fn)] += self Ir; calls[(ob, fn, cob, cfn)] += inclusive Ir of those calls."""
    names = {"ob": {}, "fn": {}, "fl": {}}
    ob = fn = cob = cfn = None
    pending = False
    ir_col = 0

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?: (.*))?$", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), rest)

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                if len(parts) <= 1 + ir_col:
                    pending = False
                    continue
                v = int(parts[1 + ir_col])
                if pending:
                    calls[(ob, fn, cob if cob is not None else ob, cfn)] += v
                    pending = False
                    cob = None
                else:
                    own[(ob, fn)] += v
                continue
            if line.startswith("events:"):
                ev = line.split()[1:]
                ir_col = ev.index("Ir") if "Ir" in ev else 0
            elif line.startswith("ob="):
                ob = name("ob", line[3:]); cob = None
            elif line.startswith("fn="):
                fn = name("fn", line[3:]); cob = None
            elif line.startswith("cob="):
                cob = name("ob", line[4:])
            elif line.startswith("cfn=") or line.startswith("cfi=") or line.startswith("cfl="):
                if line.startswith("cfn="):
                    cfn = name("fn", line[4:])
                else:
                    name("fl", line[4:])
            elif line.startswith(("fl=", "fi=", "fe=")):
                name("fl", line[3:])
            elif line.startswith("calls="):
                pending = True
                if ncalls is not None:
                    ncalls[cfn] += int(line[6:].split()[0])


def cost(path):
    own, calls = defaultdict(int), defaultdict(int)
    parse(path, own, calls)
    fcost = defaultdict(int)
    groups = defaultdict(int)
    total = 0
    for (ob, fn), v in own.items():
        total += v
        g = group(ob)
        if g is not None:
            groups[g] += v
            fcost[(g, fn)] += v
    # A neutral function may call back into a group (libc's start-up calls main, dlopen runs
    # constructors, pthread_once its routine): a call into neutral code is charged only with
    # the share of its inclusive cost that stays in neutral code, r(F) = net(F) / incoming(F),
    # net(F) = own(F) + its calls into neutral code x r(callee) (solved by iteration).
    inc, nn = defaultdict(int), defaultdict(list)
    for (ob, fn, cob, cfn), v in calls.items():
        if group(cob) is None:
            inc[(cob, cfn)] += v
            if group(ob) is None and (ob, fn) != (cob, cfn):
                nn[(ob, fn)].append(((cob, cfn), v))
    r = {k: 1.0 for k in inc}
    for _ in range(30):
        for k in inc:
            net = own.get(k, 0) + sum(v * r.get(c, 1.0) for c, v in nn.get(k, ()))
            r[k] = min(1.0, net / inc[k]) if inc[k] else 1.0
    for (ob, fn, cob, cfn), v in calls.items():
        g = group(ob)
        if g is not None and group(cob) is None:
            v = int(v * r.get((cob, cfn), 1.0))
            groups[g] += v
            fcost[(g, fn)] += v
    groups["total"] = total
    groups["other"] = total - groups["bench"] - groups["libfabric"] - groups["sim"]
    # The groups partition the profile: more than the total means a call was counted twice
    # (a neutral function's call back into a group charged to its caller as well).
    if groups["other"] < -0.001 * total:
        sys.exit(f"cg-objects: {path}: the groups add up to more than the total "
                 f"({total - groups['other']} > {total}): a cost counted twice")
    return groups, fcost


def calls_main(args):
    pat, a, b = re.compile(args[1]), args[2], args[3]
    n = []
    for p in (a, b):
        own, calls, nc = defaultdict(int), defaultdict(int), defaultdict(int)
        parse(p, own, calls, nc)
        n.append(sum(v for k, v in nc.items() if k and pat.search(k)))
    print(n[1] - n[0])
    return


def fit_main(args):
    turn, msg, fit = (re.compile(a) for a in args[1:4])
    top = int(args[6]) if len(args) > 6 else 12
    own_by_fn, turns, msgs = [], [], []
    for p in args[4:6]:
        own, calls, nc = defaultdict(int), defaultdict(int), defaultdict(int)
        parse(p, own, calls, nc)
        by_fn = defaultdict(int)
        for (_ob, fn), v in own.items():
            by_fn[fn] += v
        own_by_fn.append(by_fn)
        turns.append(sum(v for k, v in nc.items() if k and turn.search(k)))
        msgs.append(sum(v for k, v in nc.items() if k and msg.search(k)))
    (t0, t1), (m0, m1) = turns, msgs
    if m1 <= m0:
        sys.exit(f"cg-objects: the second profile has no more messages ({m0}, {m1})")
    det = t0 * m1 - t1 * m0
    # Turns in proportion to messages (within 1%): idle cannot be told from work; the plain
    # difference per message is all there is.
    proportional = abs(det) <= 0.01 * max(t1 * m0, 1)
    a0, a1 = own_by_fn

    def fitted(f, s0, s1):
        if proportional or not fit.search(f):
            return (s1 - s0) / (m1 - m0), 0.0
        return (t0 * s1 - t1 * s0) / det, (s0 * m1 - s1 * m0) / det

    rows = [(*fitted(f, a0.get(f, 0), a1.get(f, 0)), f) for f in set(a0) | set(a1)]
    rows.sort(key=lambda r: -abs(r[0]))
    for b, a, f in rows[:top]:
        print(f"{b:.1f} {a:.1f} {f}")
    print(f"{sum(r[0] for r in rows):.1f} {sum(r[1] for r in rows):.1f} total")
    print(f"- - turns/message {t0 / m0:.3f} {t1 / m1:.3f}" + (" (proportional)" if proportional else ""))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--fit" and len(args) in (6, 7):
        return fit_main(args)
    top = None
    if args and args[0] == "--top":
        top, want, args = int(args[1]), args[2], args[3:]
    if len(args) != 2 and not (len(args) == 4 and args[0] == "--calls"):
        sys.exit(__doc__)
    if args[0] == "--calls":
        return calls_main(args)
    g0, f0 = cost(args[0])
    g1, f1 = cost(args[1])
    if top is not None:
        keys = set(k for k in f1 if k[0] == want) | set(k for k in f0 if k[0] == want)
        items = sorted(((f1.get(k, 0) - f0.get(k, 0), k[1]) for k in keys), reverse=True)
        for v, fn in items[:top]:
            print(v, fn)
        return
    print(*(g1[k] - g0[k] for k in ("total", "bench", "libfabric", "sim", "other")))


if __name__ == "__main__":
    main()
