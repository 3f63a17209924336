"""Pull delivery: reserve+ack throughput of N consumers, and how fast a waiting reserve
answers when a task falls due. Against a running chime whose biz type `jobs` is in pull mode:

    chime biz-type create jobs --mode pull --max-in-flight 10000
    python3 benches/pull_consumers.py http://127.0.0.1:8080 "$(chime token create --biz-type jobs | tail -1)" 20000 8

Standard library only; consumers are threads, each reserving up to 100 and acking one by one."""
import datetime, http.client, json, statistics, sys, threading, time, urllib.parse

base, token, total, consumers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
u = urllib.parse.urlparse(base)
H = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

def conn():
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)

def post(c, path, body=None):
    c.request("POST", path, body=json.dumps(body or {}), headers=H)
    r = c.getresponse(); data = r.read()
    assert r.status == 200 or (r.status == 201), (r.status, data[:200])
    return json.loads(data) if data else None

# create the tasks, due now
c = conn()
for i in range(0, total, 1000):
    post(c, "/api/v1/tasks/batch", {"tasks": [{"biz_type": "jobs", "payload": {"n": j}} for j in range(i, min(total, i + 1000))]})

done = []
lock = threading.Lock()
def consume():
    c = conn(); n = 0
    while True:
        tasks = post(c, "/api/v1/biz-types/jobs/reserve", {"max": 100, "ttr_ms": 60000})["tasks"]
        if not tasks:
            break
        for t in tasks:
            post(c, f"/api/v1/tasks/{t['id']}/ack", {"receipt": t["receipt"]})
            n += 1
    with lock: done.append(n)

start = time.time()
threads = [threading.Thread(target=consume) for _ in range(consumers)]
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.time() - start
print(f"reserve+ack: {sum(done)} tasks by {consumers} consumers in {elapsed:.2f}s = {sum(done)/elapsed:.0f} tasks/s")

def wait_then_create(create, settle_s):
    """A consumer waits in a reserve; `create` makes a task and returns its reference time.
    Returns the ms from that time to the reserve's answer."""
    got = {}
    def waiter():
        c = conn()
        r = post(c, "/api/v1/biz-types/jobs/reserve", {"max": 1, "wait_ms": 10000})
        got["t"], got["tasks"] = time.time(), r["tasks"]
        if r["tasks"]:
            post(c, f"/api/v1/tasks/{r['tasks'][0]['id']}/ack", {"receipt": r["tasks"][0]["receipt"]})
    w = threading.Thread(target=waiter); w.start(); time.sleep(settle_s)
    reference = create(conn())
    w.join(); assert got["tasks"], "no task"
    return (got["t"] - reference) * 1000

def report(what, ms):
    ms.sort()
    print(f"long-poll: {what} median {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms over {len(ms)}")

# a task due now: from the create's answer to the reserve's answer
def due_now(c):
    post(c, "/api/v1/tasks", {"biz_type": "jobs"})
    return time.time()
report("created-to-reserved", [wait_then_create(due_now, 0.3) for _ in range(20)])

# a task due in 500 ms: reserved how long after its due time
def due_soon(c):
    r = post(c, "/api/v1/tasks", {"biz_type": "jobs", "delay_ms": 500})
    return datetime.datetime.fromisoformat(r["run_at"]).timestamp()
report("reserved after due time", [wait_then_create(due_soon, 0.2) for _ in range(10)])
