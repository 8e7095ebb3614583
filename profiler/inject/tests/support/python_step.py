"""A training loop's CUDA calls, played from a real Python process through the stand-in CUDA
driver and CUPTI (fake_cuda.c, fake_cupti.c), to test that the injection library records the
Python frames of the thread that issues each call.

The stand-in driver's cuInit loads the injection library named by CUDA_INJECTION64_PATH, as the
real driver does; the stand-in CUPTI plays each API callback on the calling thread
(`fake_api`). Calls made through ctypes.PyDLL keep the GIL; calls through ctypes.CDLL release it
around the call, as PyTorch does around some CUDA calls. After the loop, the activity records
(written by the test, with the correlation ids used below) are handed to the injection library.

    python3 python_step.py RECORDS STEPS

Each step uploads, launches a kernel, runs the optimizer's step (`optim/sgd.py`), reads a
value back and synchronizes; the readback and the synchronization made with the GIL held block
the host for 5 ms each (a sleep between the call's entry and exit), as a real readback waits for
the GPU. The `# site:` comments name the lines the test expects in the trace.
"""

import ctypes
import os
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optim import sgd  # noqa: E402

DRIVER, RUNTIME = 1, 2
ENTER, EXIT = 0, 1
# Callback ids of the stand-in CUPTI: runtime 1 cudaMemcpy, 2 cudaLaunchKernel; driver 3
# cuStreamSynchronize.
MEMCPY, LAUNCH, STREAM_SYNC = 1, 2, 3
# Correlation id of the copy issued from a second thread.
THREAD_COPY = 9000


def train_step(held, released, base):
    held.fake_api(RUNTIME, MEMCPY, base + 1, ENTER); held.fake_api(RUNTIME, MEMCPY, base + 1, EXIT)  # site: upload
    held.fake_api(RUNTIME, LAUNCH, base + 2, ENTER); held.fake_api(RUNTIME, LAUNCH, base + 2, EXIT)  # site: launch
    sgd.step(held, base + 6)  # site: optimizer
    held.fake_api(RUNTIME, MEMCPY, base + 3, ENTER); time.sleep(0.005); held.fake_api(RUNTIME, MEMCPY, base + 3, EXIT)  # site: readback
    released.fake_api(DRIVER, STREAM_SYNC, base + 4, ENTER); released.fake_api(DRIVER, STREAM_SYNC, base + 4, EXIT)  # site: released
    held.fake_api(DRIVER, STREAM_SYNC, base + 5, ENTER); time.sleep(0.005); held.fake_api(DRIVER, STREAM_SYNC, base + 5, EXIT)  # site: sync


def background_copy(held):
    held.fake_api(RUNTIME, MEMCPY, THREAD_COPY, ENTER); held.fake_api(RUNTIME, MEMCPY, THREAD_COPY, EXIT)  # site: thread


def deliver(held, path):
    """Hands the activity records in `path` (u64 count, count u64 offsets, then the records)
    to the injection library through the stand-in CUPTI's buffer callbacks."""
    with open(path, "rb") as f:
        data = f.read()
    (count,) = struct.unpack_from("<Q", data, 0)
    offsets = (ctypes.c_size_t * count)(*struct.unpack_from(f"<{count}Q", data, 8))
    records = data[8 + 8 * count :]
    held.fake_deliver.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.c_size_t,
    ]
    if held.fake_deliver(records, len(records), offsets, count, 0) != 1:
        sys.exit("the stand-in CUPTI did not deliver the records")


def main():
    records, steps = sys.argv[1], int(sys.argv[2])
    driver = ctypes.PyDLL("libcuda.so.1")
    if driver.cuInit(0) != 0:
        sys.exit("cuInit failed")
    cupti = os.environ["PERFKIT_CUPTI_PATH"]
    held, released = ctypes.PyDLL(cupti), ctypes.CDLL(cupti)
    for step in range(steps):
        train_step(held, released, 100 * (step + 1))  # site: loop
    worker = threading.Thread(target=background_copy, args=(held,), name="copier")
    worker.start()
    worker.join()
    # The records' GPU times lie up to 5 ms before the delivery: let the trace be older.
    time.sleep(0.01)
    deliver(held, records)
    print(f"python_step: {steps} steps played")


if __name__ == "__main__":
    main()  # site: module
