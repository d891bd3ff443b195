import asyncio, os, time, tempfile, statistics
from agent_saga.wal.writer import open_writer
from agent_saga.wal.format import encode_record
d = tempfile.mkdtemp(dir="/work/main/bench/.probe")
p = os.path.join(d, "w.wal")
w = open_writer(p)
rec = {"type":"intent","saga":"a"*32,"step":1,"attempt":1,"tool":"step","semantics":"compensable","kwargs":{"x":1},"idempotency_key":"k"*40,"ts":time.time()}
N=400
def pct(ts): ts.sort(); return ts[len(ts)//2]/1e3, ts[int(len(ts)*.95)]/1e3
ts=[]
for i in range(N):
    t=time.perf_counter_ns(); w.append(rec); ts.append(time.perf_counter_ns()-t)
print("append us", pct(ts))
async def m():
    ts=[]
    for i in range(N):
        t=time.perf_counter_ns(); await w.append_async(rec); ts.append(time.perf_counter_ns()-t)
    print("append_async us", pct(ts))
asyncio.run(m())
fd = os.open(os.path.join(d,"raw"), os.O_WRONLY|os.O_APPEND|os.O_CREAT)
frame = encode_record(rec)
ts=[]
for i in range(N):
    t=time.perf_counter_ns(); os.write(fd,frame); os.fsync(fd); ts.append(time.perf_counter_ns()-t)
print("raw us", pct(ts), len(frame))
ts=[]
for i in range(N):
    t=time.perf_counter_ns(); os.write(fd,frame); os.fdatasync(fd); ts.append(time.perf_counter_ns()-t)
print("raw fdatasync us", pct(ts), len(frame))
ts=[]
for i in range(N):
    t=time.perf_counter_ns(); encode_record(rec); ts.append(time.perf_counter_ns()-t)
print("encode us", pct(ts))
