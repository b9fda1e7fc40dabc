#!/bin/bash
# Reward 1 iff /app/top.txt holds the first three lines of the log; else 0.
if cmp -s /app/top.txt /tests/expected; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
