#!/usr/bin/env python3
"""call_cycles.py - the file-level call graph of a set of object files, and
its cycles.  An edge a.o -> b.o means a.o calls (or reads) a symbol that
b.o defines (nm: U in a, T/D/B/R in b).  Prints each strongly connected set
of two or more files, or "no cycles among N objects"; exits 1 when there is
a cycle.  Used by tests/cli/test_layout.sh on the library's objects: the
dispatchers call the kernels and the runtime, never the other way round.

    python3 tools/call_cycles.py build/src/*.o build/src/*/*.o
"""
import subprocess
import sys


def graph(objects):
    defines, uses = {}, {}
    for obj in objects:
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        uses[obj] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defines[f[2]] = obj
            elif len(f) == 2 and f[0] == "U":
                uses[obj].add(f[1])
    return {o: {defines[s] for s in uses[o] if defines.get(s, o) != o} for o in objects}


def cycles(g):
    """Tarjan's strongly connected components of size > 1, iteratively."""
    index, low, on, stack, found, n = {}, {}, set(), [], [], 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = n; n += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n; n += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main(argv):
    if not argv:
        print("usage: call_cycles.py OBJECT.o ...", file=sys.stderr)
        return 2
    found = cycles(graph(argv))
    for comp in found:
        print("cycle: " + " <-> ".join(comp))
    if not found:
        print(f"no cycles among {len(argv)} objects")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
