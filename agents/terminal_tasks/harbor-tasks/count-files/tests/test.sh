#!/bin/bash
# Reward 1 iff /app/n_py.txt holds 4; else 0.
if [ "$(tr -d " \n\t" < /app/n_py.txt 2>/dev/null)" = "4" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
