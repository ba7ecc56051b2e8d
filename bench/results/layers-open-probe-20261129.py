import sys, json, subprocess, os, statistics, tempfile
sys.path.insert(0, "/work/main/bench")
import coldstart
thaw = sys.argv[1] if len(sys.argv) > 1 else "/work/main/target/release/thaw"
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 15
w = "/var/tmp/m28/op/w"
env = dict(os.environ, THAW_DATA_DIR="/var/tmp/m28/op/data")
code = "/work/main/build/samples/python/helloworld"
snaps = {"full": f"{w}/full", "diff": f"{w}/diff"}
if not os.path.exists(w):
    os.makedirs(w)
    subprocess.run([thaw, "base", "build", "--runtime", "python3"], env=env, check=True, capture_output=True)
    subprocess.run([thaw, "snapshot", "create", "--code", code, "--handler", "handler.handler", "--no-base", "--out", snaps["full"]], env=env, check=True, capture_output=True)
    subprocess.run([thaw, "snapshot", "create", "--code", code, "--handler", "handler.handler", "--out", snaps["diff"]], env=env, check=True, capture_output=True)
    for s in snaps.values():
        subprocess.run([thaw, "snapshot", "restore", s, "--quiet"], env=env, check=True, capture_output=True)
base = "/var/tmp/m28/op/data/bases"
res = {k: [] for k in snaps}
for i in range(runs):
    for k in (snaps if i % 2 == 0 else list(reversed(list(snaps)))):
        for d in (*snaps.values(), base):
            coldstart.evict_page_cache(d)
        subprocess.run([thaw, "snapshot", "restore", snaps[k], "--quiet", "--prepared-sandbox", "--stats", f"{w}/s.json"], env=env, check=True, capture_output=True)
        s = json.load(open(f"{w}/s.json"))
        res[k].append((s["open_ms"], s["total_ms"]))
for k, v in res.items():
    print(k, "open %.3f ms  total %.3f ms" % (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)))
