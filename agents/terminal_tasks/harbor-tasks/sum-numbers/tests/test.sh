#!/bin/bash
# Reward 1 iff /app/sum.txt holds 80; else 0.
if [ "$(tr -d " \n\t" < /app/sum.txt 2>/dev/null)" = "80" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
