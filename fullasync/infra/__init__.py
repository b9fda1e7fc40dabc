"""Process plumbing under every component: starting or joining Ray on loopback (`runtime.py`), where actors and
GPUs go (`placement.py`), what the platform's defaults are (`platform.py`), keeping the driver's event loop
responsive (`offload.py`) and its garbage collector tuned for thousands of episodes (`heap.py`), and removing the
semaphores a killed process tree leaves in /dev/shm (`shm.py`), and where built things are cached
(`cache_root.py`).

Does not own: any component's logic. May import: `config`, `contracts`, `types`, `errors`.
"""
