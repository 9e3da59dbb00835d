"""Render the metric set of N trackers as Prometheus text: bucketstore.metrics.render against
prometheus_client (a custom collector + generate_latest), and check both parse to the same samples.

    python tools/bench/bench_prometheus.py 200
"""
import time, math, sys
from bucketstore import metrics
from bucketstore.engine.tracker.op_stats import LATENCY_BUCKETS
from prometheus_client.core import GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily, CollectorRegistry
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
N=int(sys.argv[1]) if len(sys.argv)>1 else 200
op={"ok":5,"failed":0,"buckets":[1]*(len(LATENCY_BUCKETS)+1),"sum_seconds":0.01,"observed":21}
doc={"store":{"trackers":N,"open_trackers":N,"ledger_files":3,"ledger_bytes":10,"journal_bytes":1,"journal_open_files":1,"journal_open_files_limit":64},
     "trackers":{f"t{i}":{"delayed_indexes":1,"buckets":2,"loaded_indexes":3,"snapshot_bytes":4,"journal_bytes":5,"resident_bytes":6,"pending_maintenance":0,"maintenance_failures":0,"delivered":7,"operations":{k:op for k in ("add","deliver","flush","seal","load","merge","delete")}} for i in range(N)}}
class C:
    def collect(self):
        for m in metrics.METRICS:
            scope,key=m.key.split(".")
            if scope=="store":
                if key in doc["store"]:
                    yield GaugeMetricFamily(m.name,m.help,value=doc["store"][key])
            elif m.kind=="histogram":
                h=HistogramMetricFamily(m.name,m.help,labels=["tracker","op"])
                for t,d in doc["trackers"].items():
                    for o,v in d["operations"].items():
                        cum=0;b=[]
                        for bound,c in zip([*LATENCY_BUCKETS,math.inf],v["buckets"]):
                            cum+=c;b.append((str(bound) if bound!=math.inf else "+Inf",cum))
                        h.add_metric([t,o],b,v["sum_seconds"])
                yield h
            elif key=="operations":
                c=CounterMetricFamily(m.name[:-6],m.help,labels=["tracker","op","outcome"])
                for t,d in doc["trackers"].items():
                    for o,v in d["operations"].items():
                        for oc in ("ok","failed"): c.add_metric([t,o,oc],v[oc])
                yield c
            else:
                fam=(CounterMetricFamily(m.name[:-6],m.help,labels=["tracker"]) if m.kind=="counter" else GaugeMetricFamily(m.name,m.help,labels=["tracker"]))
                for t,d in doc["trackers"].items():
                    if key in d: fam.add_metric([t],d[key])
                yield fam
r=CollectorRegistry(); r.register(C())
def best(f,n=5):
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return min(ts)
a=best(lambda: metrics.render(doc)); b=best(lambda: generate_latest(r))
ours=metrics.render(doc); theirs=generate_latest(r).decode()
norm=lambda txt: sorted((s.name,tuple(sorted(s.labels.items())),float(s.value)) for f in text_string_to_metric_families(txt) for s in f.samples)
print(f"{N} trackers, {ours.count(chr(10))} lines: ours {a*1e3:.1f} ms, prometheus_client {b*1e3:.1f} ms; same samples when parsed: {norm(ours)==norm(theirs)}")
print("command: python tools/bench/bench_prometheus.py", N)
