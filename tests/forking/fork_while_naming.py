"""Forks 12 children while another thread names generators; prints how many hung.

Each child opens an audit that names a generator (the naming table's lock); a child that does
not finish within 20 s is killed and counted as hung. Usage: fork_while_naming.py REPORT_DIR.
"""

import os
import sys
import threading

import numpy as np
import torch

import rngaudit
from rngaudit.capture.recorder import RECORDER

stop = threading.Event()
started = threading.Event()


def churn() -> None:
    with rngaudit.audit(mode="report", report_dir=sys.argv[1] + "/thread"):
        started.set()
        i = 0
        while not stop.is_set():
            i += 1
            RECORDER.names.name("probe", i, object())
            if i % 100 == 0:
                RECORDER.names.clear()


started_thread = threading.Thread(target=churn)
started_thread.start()
started.wait()
hung = 0
for k in range(12):
    pid = os.fork()
    if pid == 0:
        with rngaudit.audit(mode="report", report_dir=sys.argv[1] + f"/child{k}"):
            np.random.default_rng(0)
            torch.rand(2)
        rngaudit.wait_for_reports()
        os._exit(0)
    waiter = threading.Thread(target=os.waitpid, args=(pid, 0))
    waiter.start()
    waiter.join(20)  # returns as soon as the child exits
    if waiter.is_alive():
        os.kill(pid, 9)
        waiter.join()
        hung += 1
stop.set()
started_thread.join()
print("hung", hung)
