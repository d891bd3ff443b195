import os, time, tempfile
from agent_saga.wal import writer as W
from agent_saga.wal.format import encode_record
d = tempfile.mkdtemp(dir="/work/main/bench/.probe")
p = os.path.join(d, "w.wal")
w = W.open_writer(p)
rec = {"type":"intent","saga":"a"*32,"step":1,"attempt":1,"tool":"step","semantics":"compensable","kwargs":{"x":1},"idempotency_key":"k"*40,"ts":time.time()}
marks = {}
orig_wb = w._write_batch
def wb(frames):
    marks['wb0']=time.perf_counter_ns()
    r = orig_wb(frames)
    marks['wb1']=time.perf_counter_ns()
    return r
w._write_batch = wb
origfs = w._io.fsync
def fs(fd):
    marks['fs0']=time.perf_counter_ns(); origfs(fd); marks['fs1']=time.perf_counter_ns()
w._io.fsync = fs
N=400
rows=[]
for i in range(N):
    t0=time.perf_counter_ns(); w.append(rec); t1=time.perf_counter_ns()
    rows.append((marks['wb0']-t0, marks['fs0']-marks['wb0'], marks['fs1']-marks['fs0'], marks['wb1']-marks['fs1'], t1-marks['wb1'], t1-t0))
import statistics
for k,name in enumerate(["wake","pre-fsync(lock,stat,write)","fsync","post","release","total"]):
    print(name, statistics.median(r[k] for r in rows)/1e3)
