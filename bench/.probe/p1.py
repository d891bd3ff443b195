import asyncio, os, time, tempfile
from agent_saga import saga, tool, ActionSemantics, Compensation
from agent_saga.wal.writer import open_writer
d = tempfile.mkdtemp(dir="/work/main/bench/.probe")
p = os.path.join(d, "w.wal")

def undo(**kw): pass
@tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=undo, handler="h", kwargs={"x": r}))
def step(x: int) -> int: return x

w = open_writer(p)
for i in range(5):
    f0 = w.stats.fsyncs
    with saga(wal_path=p):
        step(1)
    print("sync fsyncs", w.stats.fsyncs - f0)
async def m():
    for i in range(5):
        f0 = w.stats.fsyncs
        async with saga(wal_path=p):
            await step(1)
        print("async fsyncs", w.stats.fsyncs - f0)
asyncio.run(m())
# latency
with saga(wal_path=p):
    ts=[]
    for i in range(300):
        t=time.perf_counter_ns(); step(1); ts.append(time.perf_counter_ns()-t)
ts.sort(); print("sync step p50 ms", ts[150]/1e6)
fd = os.open(os.path.join(d,"raw"), os.O_WRONLY|os.O_APPEND|os.O_CREAT)
ts=[]
for i in range(300):
    t=time.perf_counter_ns(); os.write(fd,b"x"*300); os.fsync(fd); os.write(fd,b"x"*200); os.fsync(fd); ts.append(time.perf_counter_ns()-t)
ts.sort(); print("floor p50 ms", ts[150]/1e6)
