#!/bin/bash
# Reward 1 iff /app/version.txt holds 2.7.1; else 0.
if [ "$(tr -d " \n" < /app/version.txt 2>/dev/null)" = "2.7.1" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
