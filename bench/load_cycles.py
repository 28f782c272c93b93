"""Resident memory of a kiln binary over N load-infer-unload cycles of the peers' add_sub (explicit
mode): what an unload gives back. Usage: python3 bench/load_cycles.py BINARY [CYCLES]
(needs the peers: ../shared/peers/setup.sh; the ONNX Runtime library from .ci/setup.sh)."""
import os, subprocess, sys, time, tempfile, shutil, urllib.request
binary = sys.argv[1]
cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
repo = tempfile.mkdtemp()
src = os.path.expanduser("~/.cache/kiln-peers/kiln/best/add_sub")
os.makedirs(f"{repo}/add_sub/1")
shutil.copy(f"{src}/1/model.onnx", f"{repo}/add_sub/1/model.onnx")
open(f"{repo}/add_sub/config.pbtxt", "w").write(open(f"{src}/config.pbtxt").read())
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, ORT_DYLIB_PATH=os.environ.get("ORT_DYLIB_PATH", f"{root}/.kiln/onnxruntime/libonnxruntime.so"))
p = subprocess.Popen([binary, "--model-repository", repo, "--model-control-mode", "explicit",
                      "--http-port", "8950", "--grpc-port", "8951", "--metrics-port", "8952"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
def post(path, body=b"{}"):
    req = urllib.request.Request(f"http://127.0.0.1:8950{path}", data=body, method="POST")
    return urllib.request.urlopen(req, timeout=60).read()
def rss():
    return int([l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
try:
    for _ in range(200):
        try:
            urllib.request.urlopen("http://127.0.0.1:8950/v2/health/live", timeout=1); break
        except Exception: time.sleep(0.1)
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"1"]*16) + b']},{"name":"INPUT1","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"1"]*16) + b']}]}'
    marks = {}
    for i in range(1, cycles + 1):
        post("/v2/repository/models/add_sub/load")
        post("/v2/models/add_sub/infer", body)
        post("/v2/repository/models/add_sub/unload")
        if i in (1, 10, 100) or i % 250 == 0:
            time.sleep(0.2)
            marks[i] = rss()
            print(f"after {i} cycles: RSS {marks[i]} MB, threads {len(os.listdir(f'/proc/{p.pid}/task'))}", flush=True)
    print(f"growth after first: {100 * (marks[cycles] - marks[1]) / marks[1]:+.1f} %")
finally:
    p.terminate(); p.wait()
    shutil.rmtree(repo)
