#!/bin/bash
# Reward 1 iff /app/count.txt holds 7; else 0.
if [ "$(tr -d " \n\t" < /app/count.txt 2>/dev/null)" = "7" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
