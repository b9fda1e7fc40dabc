"""Process plumbing under every component: starting or joining Ray on loopback (`runtime.py`), where actors and
GPUs go (`placement.py`), what the platform's defaults are (`platform.py`), and keeping the driver's event loop
responsive and its heap small (`offload.py`), and removing the semaphores a killed process tree leaves in /dev/shm
(`shm.py`).

Does not own: any component's logic. May import: `config`, `contracts`, `types`, `errors`.
"""
