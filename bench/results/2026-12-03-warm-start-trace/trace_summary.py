"""Summarize two TORCH_TRACE folders: compile phase times, per-frame metrics, cache states, and for each cache miss
of the second run the key components that differ from the first run's lookups of the same frame.

usage: python trace_summary.py COLD_TRACE_DIR WARM_TRACE_DIR > summary.json
"""

import collections
import glob
import json
import sys


def records(folder):
    for path in sorted(glob.glob(f"{folder}/*.log")):
        current = None
        for line in open(path, errors="replace"):
            if line.startswith("\t"):
                if current is not None:
                    current["payload"].append(line[1:])
                continue
            if current is not None:
                yield current
            brace = line.find("{")
            try:
                envelope = json.loads(line[brace:])
            except Exception:
                current = None
                continue
            current = {"env": envelope, "payload": [], "time": line[1:brace].split()[1] if brace > 0 else ""}
        if current is not None:
            yield current


def summarize(folder):
    open_events = {}
    totals = collections.defaultdict(lambda: [0, 0.0])
    per_compile = collections.defaultdict(dict)
    metrics, caches = [], []
    first = last = None
    for record in records(folder):
        env = record["env"]
        compile_id = f"{env.get('frame_id')}/{env.get('frame_compile_id')}"
        if "chromium_event" in env:
            try:
                event = json.loads("".join(record["payload"]))
            except Exception:
                continue
            ts = event.get("ts", 0) / 1e6
            first = ts if first is None else min(first, ts)
            last = ts if last is None else max(last, ts)
            key = (event.get("name"), event.get("args", {}).get("compile_id"), event.get("tid"))
            if event.get("ph") == "B":
                open_events.setdefault(key, []).append(ts)
            elif event.get("ph") == "E" and open_events.get(key):
                seconds = ts - open_events[key].pop()
                totals[event["name"]][0] += 1
                totals[event["name"]][1] += seconds
                cid = event.get("args", {}).get("compile_id")
                if event["name"] in (
                    "entire_frame_compile",
                    "backend_compile",
                    "bytecode_tracing",
                    "build_guards",
                    "compile_file",
                    "gc",
                    "autotune",
                    "inductor_compile",
                ):
                    per_compile[str(cid)][event["name"]] = round(
                        per_compile[str(cid)].get(event["name"], 0) + seconds, 3
                    )
        elif "compilation_metrics" in env:
            m = env["compilation_metrics"]
            keep = {
                k: v
                for k, v in m.items()
                if (not isinstance(v, (list, dict)) and len(str(v)) < 300)
                or k in ("restart_reasons", "recompile_reason")
            }
            keep["compile_id"] = compile_id
            metrics.append(keep)
        elif "artifact" in env and ("cache" in env["artifact"].get("name", "")):
            name = env["artifact"]["name"]
            try:
                payload = json.loads("".join(record["payload"]))
            except Exception:
                payload = {"raw": "".join(record["payload"])[:2000]}
            caches.append({"name": name, "compile_id": compile_id, "time": record["time"], "payload": payload})
    return {
        "span_seconds": round((last or 0) - (first or 0), 2),
        "totals": {
            k: {"count": v[0], "seconds": round(v[1], 2)} for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1])
        },
        "per_compile": per_compile,
        "metrics": metrics,
        "caches": caches,
    }


cold, warm = summarize(sys.argv[1]), summarize(sys.argv[2])
out = {
    "cold": {k: v for k, v in cold.items() if k != "caches"},
    "warm": {k: v for k, v in warm.items() if k != "caches"},
}
out["warm_cache_states"] = [
    (c["name"], c["compile_id"], c["time"], (c["payload"].get("key") if isinstance(c["payload"], dict) else None))
    for c in warm["caches"]
]
out["cold_cache_states"] = [
    (c["name"], c["compile_id"], c["time"], (c["payload"].get("key") if isinstance(c["payload"], dict) else None))
    for c in cold["caches"]
]
diffs = []
for c in warm["caches"]:
    if c["name"].endswith(("_miss", "_bypass")):
        base = c["name"].rsplit("_", 1)[0]
        payload = c["payload"] if isinstance(c["payload"], dict) else {}
        matches = [o for o in cold["caches"] if o["name"].startswith(base) and o["compile_id"] == c["compile_id"]]
        entry = {
            "warm": c["name"],
            "compile_id": c["compile_id"],
            "key": payload.get("key"),
            "other": {k: v for k, v in payload.items() if k not in ("components",)},
        }
        wc = payload.get("components") or []
        for o in matches:
            oc = o["payload"].get("components") or [] if isinstance(o["payload"], dict) else []
            entry.setdefault("against_cold", []).append(
                {
                    "cold": o["name"],
                    "key": o["payload"].get("key") if isinstance(o["payload"], dict) else None,
                    "only_warm": [line for line in wc if line not in oc][:40],
                    "only_cold": [line for line in oc if line not in wc][:40],
                }
            )
        entry["components_warm"] = wc[:80]
        diffs.append(entry)
out["warm_miss_diffs"] = diffs
print(json.dumps(out, indent=1, default=str))
